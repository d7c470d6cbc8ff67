"""What the figures plot: a :class:`~datavine.dashboard.model.Board` as columns (pure).

Each function turns the board (or its latest run) into the dict of equal-length lists a Bokeh
``ColumnDataSource`` takes (:data:`Columns`), or the header's figures (:func:`progress`);
:mod:`datavine.dashboard.views` shows them, live and in the saved report.
"""

from __future__ import annotations

import math
from collections import Counter
from collections.abc import Mapping, Sequence
from typing import Literal, TypedDict

from datavine.dashboard.model import (
    NEARNESS,
    OUTCOMES,
    SLOWEST,
    STATE_COLOURS,
    WORKER_STATES,
    Board,
    RunFold,
    UsageNow,
    WorkerRow,
)
from datavine.dashboard.records import EndSummary

# A figure's data: column name -> its values, all columns of the same length.
Columns = dict[str, Sequence[object]]


class Progress(TypedDict, total=False):
    """The header's figures (:func:`progress`): the workers by state and the host's usage
    always, the latest run's figures once there is one."""

    workers: dict[str, int]
    usage: UsageNow
    run: int
    elapsed_s: float
    finished: bool
    tasks_done: int
    tasks: int
    bundles_done: int
    bundles_sent: int
    bundles_failed: int
    running: int
    queued: int
    files_done: int
    files: int
    files_failed: int
    events: int
    events_expected: int
    events_per_s: float
    tasks_per_s: float
    bytes: int
    near_bytes: int
    far_bytes: int
    bytes_by_nearness: dict[str, int]
    bytes_by_server: dict[str, int]
    gbps: float
    cache_hit_bytes: int
    cache_decoded_bytes: int
    cache_hit_fraction: float
    outcomes: dict[str, int]
    failures: int
    summary: EndSummary | None


def worker_order(board: Board) -> list[WorkerRow]:
    """Workers by rack, then host, then name."""
    return sorted(board.workers.values(),
                  key=lambda w: (w.rack or "~", w.host or "~", _natural(w.id)))


def _natural(name: str) -> tuple[str, int, str]:
    """``local-10`` after ``local-9``."""
    head = name.rstrip("0123456789")
    tail = name[len(head):]
    return (head, int(tail) if tail else -1, name)


def worker_columns(board: Board) -> Columns:
    rows = worker_order(board)
    return {
        "worker": [w.id for w in rows], "rack": [w.rack or "" for w in rows],
        "host": [w.host or "" for w in rows], "state": [w.state for w in rows],
        "colour": [STATE_COLOURS.get(w.state, "#c7c7c7") for w in rows],
        "cores": [w.cores for w in rows], "running": [w.running for w in rows],
        "done": [w.done for w in rows], "failed": [w.failed for w in rows],
        "memory_mb": [round(w.memory_mb, 1) for w in rows],
        "cap_mb": [w.cap_mb if w.cap_mb is not None else math.nan for w in rows],
        "peak_mb": [round(w.peak_mb, 1) for w in rows],
        "cpu": [round(w.cpu, 1) if w.cpu is not None else math.nan for w in rows],
    }


def progress(board: Board) -> Progress:
    """The run's figures at a glance (the header)."""
    run = board.run
    states = Counter(w.state for w in board.workers.values())
    out: Progress = {"workers": {s: states.get(s, 0) for s in WORKER_STATES},
                     "usage": board.usage.copy()}
    if run is None:
        return out
    elapsed = run.elapsed_s
    total_bytes = sum(run.bytes_by_nearness.values())
    out.update({
        "run": run.run, "elapsed_s": round(elapsed, 1), "finished": run.end is not None,
        "tasks_done": run.tasks_done, "tasks": run.tasks,
        "bundles_done": run.bundles_done, "bundles_sent": run.bundles_sent,
        "bundles_failed": run.bundles_failed, "running": run.running, "queued": run.queued,
        "files_done": run.files_done, "files": len(run.files),
        "files_failed": len(run.files_failed),
        "events": run.events_done, "events_expected": run.events_expected,
        "events_per_s": run.events_done / elapsed if elapsed > 0 else 0.0,
        "tasks_per_s": run.tasks_done / elapsed if elapsed > 0 else 0.0,
        "bytes": total_bytes, "near_bytes": run.near_bytes, "far_bytes": run.far_bytes,
        "bytes_by_nearness": {n: int(run.bytes_by_nearness[n]) for n in NEARNESS},
        "bytes_by_server": dict(run.bytes_by_server),
        "gbps": total_bytes * 8 / 1e9 / elapsed if elapsed > 0 else 0.0,
        "cache_hit_bytes": run.cache_hit_bytes, "cache_decoded_bytes": run.cache_decoded_bytes,
        "cache_hit_fraction": run.cache_hit_fraction,
        "outcomes": {o: run.outcomes.get(o, 0) for o in OUTCOMES},
        "failures": run.bundles_failed, "summary": run.end,
    })
    return out


def throughput_columns(run: RunFold | None,
                       max_points: int = 300) -> tuple[Columns, Columns]:
    """Per time bin (merged down to ``max_points``): Gbps in all and by nearness, events/s
    and tasks/s; and one line per server (``xs``/``ys`` for a multi-line)."""
    if run is None:
        return ({"t": [], "total": [], "events": [], "tasks": [], **{n: [] for n in NEARNESS}},
                _lines({}, [], 1, 1.0))
    bins = run.bins
    n = bins.length
    group = max(1, math.ceil(n / max_points))
    width = bins.width * group
    gbps = 8 / 1e9 / width

    def merged(series: list[float], scale: float) -> list[float]:
        padded = series + [0.0] * (n - len(series))
        return [sum(padded[i:i + group]) * scale for i in range(0, n, group)]

    t = [(i + group / 2) * bins.width for i in range(0, n, group)]
    near = {k: merged(v, gbps) for k, v in bins.by_nearness.items()}
    total = [sum(vals) for vals in zip(*near.values(), strict=True)] if near else []
    return ({"t": t, "total": total, "events": merged(bins.events, 1 / width),
             "tasks": merged(bins.tasks, 1 / width), **near},
            _lines({s: merged(v, gbps) for s, v in bins.by_server.items()}, t, group,
                   bins.width))


_SERVER_COLOURS = ("#1f77b4", "#ff7f0e", "#2ca02c", "#d62728", "#9467bd", "#8c564b",
                   "#e377c2", "#7f7f7f", "#bcbd22", "#17becf")


def _lines(series: Mapping[str, list[float]], t: list[float], group: int,
           width: float) -> Columns:
    names = sorted(series)
    return {"server": names, "xs": [list(t) for _ in names],
            "ys": [series[s] for s in names],
            "colour": [_SERVER_COLOURS[i % len(_SERVER_COLOURS)] for i in range(len(names))]}


StreamField = Literal["worker", "start", "end", "outcome", "colour", "tasks", "call",
                      "peak_mb", "cap_mb"]
STREAM_FIELDS: tuple[StreamField, ...] = ("worker", "start", "end", "outcome", "colour",
                                          "tasks", "call", "peak_mb", "cap_mb")
FailureField = Literal["at_s", "worker", "outcome", "cause"]
FAILURE_FIELDS: tuple[FailureField, ...] = ("at_s", "worker", "outcome", "cause")
SlowField = Literal["file", "seconds", "worker", "server", "mb"]
SLOW_FIELDS: tuple[SlowField, ...] = ("file", "seconds", "worker", "server", "mb")


def stream_columns(run: RunFold | None, since: int = 0) -> Columns:
    """The task stream's bars from the ``since``-th on."""
    rows = run.stream[since:] if run is not None else []
    return {f: [row[f] for row in rows] for f in STREAM_FIELDS}


def failure_columns(run: RunFold | None) -> Columns:
    rows = run.failures if run is not None else []
    return {f: [row[f] for row in rows] for f in FAILURE_FIELDS}


def slowest_columns(run: RunFold | None) -> Columns:
    rows = sorted(run.slow.values(), key=lambda s: -s["seconds"])[:SLOWEST] if run else []
    return {f: [row[f] for row in rows] for f in SLOW_FIELDS}


def server_totals(run: RunFold | None) -> Columns:
    """GB read from each XCache server (and ``local``, ``origin``), by nearness to the
    workers that read them (a column per :data:`NEARNESS`)."""
    names = sorted(run.bytes_by_server) if run is not None else []
    out: Columns = {"server": names}
    for near in NEARNESS:
        out[near] = [run.bytes_by_place[s, near] / 1e9 for s in names] if run else []
    return out
