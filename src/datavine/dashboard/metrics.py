"""A cluster's runs as Prometheus metrics, read from the live view's board (prometheus_client).

:func:`families` turns a :class:`~datavine.dashboard.model.Board` (the records of
:mod:`datavine.dashboard.events`, folded) into metric families, and :func:`exposition`
renders them in the format a scraper asks for (Prometheus' text format, or OpenMetrics),
with the official client library's encoders. There is no second accounting: every figure is
the board's, whose byte totals are the run summary's
(:meth:`datavine.scheduler.summary.RunSummary.add_reads`). Two listeners serve them at
``/metrics``: the live view's server (:mod:`datavine.dashboard.server`) and, for a cluster
without one, a small listener in the manager's process
(:mod:`datavine.dashboard.metrics_listener`).

Names follow Prometheus' conventions: a ``datavine_`` prefix, counters ending in ``_total``
(summed over the cluster's runs: they only grow), base units (bytes, seconds):

- ``datavine_workers{rack,state}``, ``datavine_worker_cores{rack}``: the pool now (states of
  :data:`~datavine.dashboard.model.WORKER_STATES`, spaces as ``_``; ``rack="none"``: a
  worker without one);
- ``datavine_bundles{phase}``: calls out now, ``waiting`` for a worker's slot or
  ``running``; ``datavine_bundles_sent_total``; ``datavine_bundles_returned_total{outcome}``;
- ``datavine_tasks_total``, ``datavine_events_total`` (physics events, where the
  application weighed its tasks: events/s is their ``rate()``), ``datavine_runs_total``;
- ``datavine_read_bytes_total{server,nearness}`` (nearness ``host``, ``same_rack``,
  ``inter_rack``: near = host + same rack, as the run summary counts);
- ``datavine_column_cache_bytes_total{source}``: decoded bytes the workers' column caches
  served (``memory``) and decoded from files (``file``);
- ``datavine_read_failovers_total``, ``datavine_retries_total``,
  ``datavine_workers_lost_total``, ``datavine_backup_copies_total``;
- ``datavine_unmeasured_calls_total``, ``datavine_unmeasured_read_bytes_total``: calls
  stopped while they ran, whose reads no result reports, and a bound on those reads (the run
  summary's ``backups.unmeasured``, counted when each run ends);
- ``datavine_manager_cpu_seconds_total``: the manager process's CPU (user + system), when
  the listener can read it.

A listener with an access token (every listener off loopback has one) answers a scrape only
with ``Authorization: Bearer <token>`` (:func:`authorized`): else 401 and nothing more.
"""

from __future__ import annotations

import hmac
from collections import Counter
from collections.abc import Iterator
from dataclasses import dataclass

from prometheus_client.exposition import choose_encoder
from prometheus_client.metrics_core import CounterMetricFamily, GaugeMetricFamily, Metric

from datavine.dashboard.model import (
    INTER_RACK,
    ON_HOST,
    OUTCOMES,
    SAME_RACK,
    WORKER_STATES,
    Board,
    RunFold,
)

PATH = "/metrics"
NO_RACK = "none"
NEARNESS_LABELS = {ON_HOST: "host", SAME_RACK: "same_rack", INTER_RACK: "inter_rack"}
OUTCOME_LABELS = {o: o.replace(" ", "_") for o in OUTCOMES}
UNAUTHORIZED = b"401: this listener takes a bearer token (Authorization: Bearer <token>)\n"


def label(text: str) -> str:
    """A state or outcome as a label value: ``library starting`` -> ``library_starting``."""
    return text.replace(" ", "_")


def authorized(token: str | None, header: str | None) -> bool:
    """Whether a request with this ``Authorization`` header may read the metrics: always
    without a token, else only with ``Bearer <token>`` (compared in constant time)."""
    if not token:
        return True
    scheme, _, given = (header or "").strip().partition(" ")
    return scheme.lower() == "bearer" and hmac.compare_digest(given.strip().encode(),
                                                              token.encode())


def retries(run: RunFold) -> int:
    """Bundles sent again in ``run``: the run summary's count once it ended (it also knows
    the calls TaskVine sent again by itself), else those that came back without their
    results; never fewer than the latter, so the counter only grows."""
    ended = int(run.end.get("retries", 0)) if run.end is not None else 0
    return max(ended, run.bundles_failed)


def families(board: Board, manager_cpu_s: float | None = None) -> list[Metric]:
    """The metric families of ``board`` (pure); ``manager_cpu_s``: the manager process's
    CPU seconds, when known."""
    out: list[Metric] = []
    workers = GaugeMetricFamily("datavine_workers", "Workers by rack and state (joining, "
                                "library starting, busy, idle, lost).",
                                labels=["rack", "state"])
    cores = GaugeMetricFamily("datavine_worker_cores", "Cores of the workers not lost, by rack.",
                              labels=["rack"])
    by_state: Counter[tuple[str, str]] = Counter()
    by_rack: Counter[str] = Counter()
    racks = set()
    for w in board.workers.values():
        rack = w.rack or NO_RACK
        racks.add(rack)
        by_state[rack, w.state] += 1
        if w.state != "lost":
            by_rack[rack] += w.cores
    for rack in sorted(racks):
        for state in WORKER_STATES:
            workers.add_metric([rack, label(state)], by_state[rack, state])
        cores.add_metric([rack], by_rack[rack])
    out += [workers, cores]

    run = board.run
    out.append(_gauge("datavine_bundles", "Calls out now: waiting for a worker's slot, or "
                      "running.", "phase", {"waiting": run.queued if run else 0,
                                            "running": run.running if run else 0}))
    runs = board.runs
    out.append(_counter("datavine_runs", "Runs (get calls) started.", len(runs)))
    out.append(_counter("datavine_bundles_sent", "Bundles sent (backup copies not counted).",
                        sum(r.bundles_sent for r in runs)))
    outcomes: Counter[str] = Counter()
    for r in runs:
        outcomes.update(r.outcomes)
    out.append(_counter("datavine_bundles_returned", "Bundles that came back, by outcome "
                        f"({', '.join(OUTCOME_LABELS.values())}).", sum(outcomes.values()),
                        "outcome", {OUTCOME_LABELS[o]: outcomes[o] for o in OUTCOMES}))
    out.append(_counter("datavine_tasks", "Tasks done, each counted once.",
                        sum(r.tasks_done for r in runs)))
    out.append(_counter("datavine_events", "Physics events processed (where the application "
                        "told the view its tasks' events).", sum(r.events_done for r in runs)))
    read = CounterMetricFamily("datavine_read_bytes", "Bytes read from files, by server and "
                               "by nearness to the reading worker (host, same_rack: near; "
                               "inter_rack: far).", labels=["server", "nearness"])
    places: Counter[tuple[str, str]] = Counter()
    for r in runs:
        places.update(r.bytes_by_place)
    for (server, near), nbytes in sorted(places.items()):
        read.add_metric([server, NEARNESS_LABELS[near]], nbytes)
    out.append(read)
    out.append(_counter("datavine_column_cache_bytes", "Decoded bytes of columns read: served "
                        "from the workers' column caches (memory) or decoded from files (file).",
                        0, "source",
                        {"memory": sum(r.cache_hit_bytes for r in runs),
                         "file": sum(r.cache_decoded_bytes for r in runs)}))
    out.append(_counter("datavine_read_failovers", "Reads that failed over to another server.",
                        sum(r.failovers for r in runs)))
    out.append(_counter("datavine_retries", "Bundles sent again (a memory overrun, a failed "
                        "input, a lost worker, a time limit).", sum(retries(r) for r in runs)))
    out.append(_counter("datavine_workers_lost", "Times a worker left or was declared lost.",
                        board.workers_lost))
    out.append(_counter("datavine_backup_copies", "Backup copies of late calls sent.",
                        sum(r.copies_sent for r in runs)))
    ended = [r.end for r in runs if r.end]
    out.append(_counter("datavine_unmeasured_calls", "Calls stopped while they ran (a backup "
                        "copy, or the first copy it outran): no result reports their reads, "
                        "so they are in no byte total.",
                        sum(e.get("unmeasured_calls", 0) for e in ended)))
    out.append(_counter("datavine_unmeasured_read_bytes", "What those calls read, at most "
                        "(each bounded by the bytes its winner read).",
                        sum(e.get("unmeasured_bytes", 0) for e in ended)))
    if manager_cpu_s is not None:
        out.append(_counter("datavine_manager_cpu_seconds", "CPU time of the manager's process "
                            "(user and system), in seconds.", manager_cpu_s))
    return out


def _counter(name: str, doc: str, value: float, key: str | None = None,
             values: dict[str, float] | dict[str, int] | None = None) -> CounterMetricFamily:
    """A counter: one value, or one per value of the label ``key``."""
    if key is None or values is None:
        return CounterMetricFamily(name, doc, value=value)
    family = CounterMetricFamily(name, doc, labels=[key])
    for value_of, v in values.items():
        family.add_metric([value_of], v)
    return family


def _gauge(name: str, doc: str, key: str, values: dict[str, int]) -> GaugeMetricFamily:
    family = GaugeMetricFamily(name, doc, labels=[key])
    for value_of, v in values.items():
        family.add_metric([value_of], v)
    return family


@dataclass
class _Families:
    """A collector of metric families made already (what the encoders take)."""

    metrics: list[Metric]

    def collect(self) -> Iterator[Metric]:
        return iter(self.metrics)


def exposition(board: Board, manager_cpu_s: float | None = None,
               accept: str | None = None) -> tuple[bytes, str]:
    """The metrics of ``board`` as the body and content type that a scraper's ``Accept``
    header asks for (Prometheus' text format by default)."""
    encoder, content_type = choose_encoder(accept or "")
    return encoder(_Families(families(board, manager_cpu_s))), content_type

