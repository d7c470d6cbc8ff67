"""The run's events for the live view: records the driver writes, and the file they go to.

:class:`EventSink` is the one object the run's driver
(:class:`datavine.manager.execution.GraphRun`) publishes through: the run started (its tasks,
the files they read, the shards), a bundle was sent, a bundle came back (its status, worker,
memory peak, the bytes of each read and from which server), the pool (about once a second:
where the calls run, and the workers and their libraries: each only as far as it changed
since the last pool record, after a run's first: at 256 workers the full lists were most of
a record's cost, written every second, and few of their entries change in a second) and the
run ended (its summary's figures).
Each becomes one JSON line appended to a file (``events.jsonl`` in the cluster's run
directory), flushed at most every :data:`FLUSH_S` and at every pool record, so the view lags
the run by about a second and a run of many small bundles pays one ``write`` per flush.
The live view's server tails the file (:class:`Tail`); the saved report reads it whole
(:func:`read_events`). :class:`NullSink` does nothing (no view).

Records are dicts with ``k`` (the kind) and ``t`` (``time.time()``); the kinds and their
fields are the ``*_record`` functions below (their shapes: :mod:`datavine.dashboard.records`),
and :mod:`datavine.dashboard.model` folds them.
A bundle made again (its kept value was lost with a worker) is sent and done again: its
``done`` record says how many of its tasks (``again``) and events (``again_ev``) came back
before in the run (the run's state says which: ``Deliver.again``), so that the view counts
each once. Standard library (and :mod:`datavine.io.shards`,
:mod:`datavine.dashboard.records`: types only) only: the manager imports it in every run.
"""

from __future__ import annotations

import json
import operator
import os
import socket
import time
from collections import Counter
from collections.abc import Callable, Hashable, Iterable, Iterator, Mapping
from pathlib import Path
from typing import IO, TYPE_CHECKING, Any, cast

from datavine.dashboard.records import (
    DoneRecord,
    EndRecord,
    PoolRecord,
    PoolWorker,
    Read,
    Record,
    RunRecord,
    SentRecord,
    ShardPlace,
)
from datavine.io.shards import logical_name
from datavine.io.tail import LineTail

if TYPE_CHECKING:
    from datavine.io.shards import ShardMap
    from datavine.manager.port import Finished
    from datavine.scheduler.graph import TaskGraph
    from datavine.scheduler.inflight import Inflight
    from datavine.scheduler.known_workers import KnownWorker
    from datavine.scheduler.network import LibraryState
    from datavine.scheduler.run_messages import PoolSample, Submit
    from datavine.scheduler.summary import RunSummary

FLUSH_S = 0.5  # at most this long between a record and its write (pool records flush too)
VERSION = 1
_encode = json.JSONEncoder(separators=(",", ":"), check_circular=False, default=str).encode


class NullSink:
    """A sink that records nothing: the driver's default when no view is open."""

    enabled = False

    def run_started(self, graph: TaskGraph, files_of: Callable[[Hashable], tuple[str, ...]],
                    shardmap: ShardMap | None) -> None:
        """A run of ``graph`` starts; ``files_of(key)``: the files a task reads."""

    def sent(self, ins: Submit, entry: Inflight | None, copy: bool = False) -> None:
        """A bundle went out as call ``ins.call`` (``entry``: the state's record of it;
        ``copy``: a backup copy of a bundle out already)."""

    def gone(self, call: int) -> None:
        """Call ``call`` was cancelled: no result will come."""

    def done(self, call: int, finished: Finished,
             again: frozenset[Hashable] = frozenset()) -> None:
        """Call ``call`` came back (its status dict, or why there is none); ``again``: its
        tasks that the run delivered before (made again after a lost worker)."""

    def pool(self, sample: PoolSample, workers: Iterable[KnownWorker]) -> None:
        """A look at the pool, with the workers the run knows of."""

    def run_ended(self, summary: RunSummary) -> None:
        """The run ended (finished, failed or interrupted) with this summary."""

    def expect_events(self, weights: Mapping[Hashable, int]) -> None:
        """Physics events each task processes (``{key: events}``), for events/s."""

    def local_processes(self, pids: Mapping[str, int]) -> None:
        """PIDs of the workers started on this host (their memory and CPU are read there)."""

    def pool_now(self, workers: Iterable[KnownWorker],
                 libraries: Mapping[str, LibraryState]) -> None:
        """The pool outside a run (after the cluster started): workers and libraries."""

    def close(self) -> None:
        """No more records."""


NO_SINK = NullSink()


class EventSink(NullSink):
    """JSON lines appended to ``path`` (see the module docstring); one per cluster, across
    its runs (each run starts with a ``run`` record)."""

    enabled = True

    def __init__(self, path: str | os.PathLike[str], *,
                 clock: Callable[[], float] = time.time) -> None:
        self.path = Path(path)
        self.path.parent.mkdir(parents=True, exist_ok=True)
        self.clock = clock
        self._file: IO[bytes] | None = open(self.path, "ab")  # noqa: SIM115 (closed in close)
        self._pending: list[Record] = []  # emitted, encoded at the next flush
        self._flushed = clock()
        self._runs = 0
        self._weights: dict[Hashable, int] = {}
        self._tasks: dict[int, int] = {}  # call in flight -> its tasks
        self._pool_rows: list[PoolWorker] | None = None  # the workers of the last pool record
        # what those rows were made of (see pool): the workers' fields, the libraries
        self._pool_key: tuple[list[tuple[object, ...]], Mapping[str, LibraryState] | None] = \
            ([], None)
        self._where: dict[int, str] | None = None  # where the last pool record put the calls
        self.here = socket.gethostname()  # what a shard on loopback stands for
        self.emit({"k": "hello", "pid": os.getpid(), "version": VERSION}, flush=True)

    # --- the driver's calls -------------------------------------------------------------------
    def run_started(self, graph: TaskGraph, files_of: Callable[[Hashable], tuple[str, ...]],
                    shardmap: ShardMap | None) -> None:
        self._runs += 1
        self._tasks.clear()
        self._pool_rows = None  # each run's first pool record names every worker
        self._where = None  # ... and every call's place
        self.emit(run_record(self._runs, len(graph), file_tasks(graph.nodes, files_of),
                             shard_places(shardmap, self.here)), flush=True)

    def sent(self, ins: Submit, entry: Inflight | None, copy: bool = False) -> None:
        keys = ins.keys
        self._tasks[ins.call] = len(keys)
        events = sum(self._weights.get(k, 0) for k in keys) if self._weights else 0
        files = entry.bundle.files if entry is not None else ()
        record = sent_record(ins.call, len(keys), ins.cap_mb, ins.target.worker,
                             ins.target.rack, files, events)
        if copy:
            record["copy"] = 1
        self.emit(record)

    def gone(self, call: int) -> None:
        if self._tasks.pop(call, None) is not None:
            self.emit({"k": "gone", "call": call})

    def done(self, call: int, finished: Finished,
             again: frozenset[Hashable] = frozenset()) -> None:
        record = done_record(call, self._tasks.pop(call, 0), finished.result,
                             finished.addrport, finished.failure)
        if again:
            record["again"] = len(again)
            record["again_ev"] = sum(self._weights.get(k, 0) for k in again)
        self.emit(record)

    def pool(self, sample: PoolSample, workers: Iterable[KnownWorker]) -> None:
        known = list(workers)
        # the rows are made again only when a worker or a library changed (256 rows a
        # second were most of a pool record's cost): the workers' fields, and the libraries'
        # mapping, which the runtime copies once per change
        fields = list(map(_ROW_FIELDS, known))
        last_fields, last_libraries = self._pool_key
        if (self._pool_rows is None or sample.libraries is not last_libraries
                or fields != last_fields):
            self._pool_key = (fields, sample.libraries)  # held: its id is not reused
            rows = pool_rows(known, sample.libraries)
        else:
            rows = self._pool_rows
        self._emit_pool(pool_record_of(rows, sample.where, sample.states, sample.gone,
                                       sample.lost_addr, sample.workers, sample.cores),
                        sample.where)

    def pool_now(self, workers: Iterable[KnownWorker],
                 libraries: Mapping[str, LibraryState]) -> None:
        known = list(workers)
        self._emit_pool(pool_record(known, libraries, {}, {}, (), (), len(known),
                                    sum(w.cores for w in known)), {})

    def _emit_pool(self, record: PoolRecord, where: Mapping[int, str]) -> None:
        """A pool record, without its workers when they are those of the last one (the
        reader keeps the last list it read), and with only the calls whose place changed
        since the last one of the run (:func:`calls_changed`; ``where``: the places the
        record's ``calls`` list)."""
        if record["workers"] == self._pool_rows:
            del record["workers"]
        else:
            self._pool_rows = record["workers"]
        if self._where is not None:
            del record["calls"]
            placed, unplaced = calls_changed(self._where, where)
            if placed:
                record["placed"] = placed
            if unplaced:
                record["unplaced"] = unplaced
        self._where = dict(where)
        self.emit(record, flush=True)

    def run_ended(self, summary: RunSummary) -> None:
        self._weights.clear()
        self.emit(end_record(self._runs, summary), flush=True)

    def expect_events(self, weights: Mapping[Hashable, int]) -> None:
        self._weights.update(weights)

    def local_processes(self, pids: Mapping[str, int]) -> None:
        self.emit({"k": "procs", "pids": dict(pids)}, flush=True)

    # --- the file -------------------------------------------------------------------------------
    def emit(self, record: Record, *, flush: bool = False) -> None:
        """Append ``record`` (stamped with the time; not to be changed after); written now
        when ``flush`` or when the last write is older than :data:`FLUSH_S`; nothing once
        closed. It is encoded when it is written, with the others pending: one after
        another, while the encoder is in the core's caches, rather than each between two
        results (at 256 workers the difference was within the benchmark's noise)."""
        if self._file is None:
            return
        now = self.clock()
        record["t"] = round(now, 3)
        self._pending.append(record)
        if flush or now - self._flushed >= FLUSH_S:
            self.flush(now)

    def flush(self, now: float | None = None) -> None:
        self._flushed = self.clock() if now is None else now
        if self._file is None or not self._pending:
            return
        data = "".join([f"{_encode(record)}\n" for record in self._pending]).encode()
        self._pending.clear()
        try:
            self._file.write(data)
            self._file.flush()
        except OSError:  # a full disk must not stop the run: the view stops instead
            self.close()

    def close(self) -> None:
        file, self._file = self._file, None
        if file is not None:
            if self._pending:
                self._file = file
                self.flush()
                self._file = None
            file.close()


# --- records (pure) -------------------------------------------------------------------------
def run_record(run: int, tasks: int, files: Mapping[str, int],
               shards: Mapping[str, ShardPlace]) -> RunRecord:
    """A run starts: ``tasks`` in all, ``files`` (logical name -> tasks reading it), the
    shards' racks and hosts."""
    return {"k": "run", "run": run, "tasks": tasks, "files": dict(files),
            "shards": {name: place.copy() for name, place in shards.items()}}


def sent_record(call: int, tasks: int, cap_mb: float | None, worker: str | None,
                rack: str | None, files: Iterable[str], events: int) -> SentRecord:
    """A bundle of ``tasks`` went out as ``call``, under ``cap_mb``, to a worker or rack
    (or anywhere), reading ``files`` (URLs or paths) and processing ``events``."""
    return {"k": "sent", "call": call, "n": tasks, "cap": cap_mb, "to": worker, "rack": rack,
            "files": sorted({logical_name(f) for f in files}), "ev": events}


def done_record(call: int, tasks: int, result: Mapping[str, Any] | None, addrport: str | None,
                failure: str = "") -> DoneRecord:
    """A call came back: its status (``died``: its worker or library died under it), the
    worker, host and rack it ran on, seconds, memory peak and cap, each read as
    ``[file, server, rack, bytes, failovers, cached, decoded]`` (the last two: decoded bytes
    from the worker's column cache and from the file), and why it did not succeed."""
    if result is None:
        return {"k": "done", "call": call, "n": tasks, "status": "died", "addr": addrport,
                "why": failure}
    reads: list[Read] = [(r.get("lfn"), str(r.get("server")), r.get("rack"),
                          int(r.get("bytes", 0)), len(r.get("errors", ())),
                          int(r.get("cached", 0)), int(r.get("decoded", 0)))
                         for r in result.get("reads", ())]
    record: DoneRecord = {
        "k": "done", "call": call, "n": tasks, "status": str(result.get("status")),
        "worker": result.get("worker"), "host": result.get("host"), "rack": result.get("rack"),
        "addr": addrport, "wall": round(float(result.get("wall_s") or 0.0), 4),
        "peak": round(float(result.get("peak_mb") or 0.0), 1), "cap": result.get("cap_mb"),
        "reads": reads}
    if result.get("status") != "ok":
        why = str(result.get("message") or "")
        if result.get("server"):
            why = f"{result.get('server')}: {why}"
        record["why"] = why[:500]
    return record


def pool_record(workers: Iterable[KnownWorker], libraries: Mapping[str, LibraryState],
                where: Mapping[int, str], states: Mapping[int, str], gone: Iterable[str],
                lost: Iterable[str], connected: int, cores: int) -> PoolRecord:
    """The pool: each known worker (name, address, host, rack, cores, its library's state),
    each running call's worker address, calls waiting, workers that left."""
    return pool_record_of(pool_rows(workers, libraries), where, states, gone, lost,
                          connected, cores)


_ROW_FIELDS = operator.attrgetter("id", "addrport", "host", "rack", "cores")


def pool_rows(workers: Iterable[KnownWorker],
              libraries: Mapping[str, LibraryState]) -> list[PoolWorker]:
    """A pool record's workers: each known worker, then each library's worker not known to
    placement yet."""
    rows: list[PoolWorker] = []
    seen = set()
    for w in workers:
        library = libraries.get(w.addrport) if w.addrport else None
        rows.append({"id": w.id, "addr": w.addrport, "host": w.host or _host(library),
                     "rack": w.rack, "cores": w.cores, "lib": _state(library)})
        seen.add(w.addrport)
    for addr, library in libraries.items():  # connected, not known to placement yet
        if addr not in seen:
            rows.append({"id": addr, "addr": addr, "host": _host(library), "rack": None,
                         "cores": 0, "lib": _state(library)})
    return rows


def pool_record_of(rows: list[PoolWorker], where: Mapping[int, str],
                   states: Mapping[int, str], gone: Iterable[str], lost: Iterable[str],
                   connected: int, cores: int) -> PoolRecord:
    """A pool record of its worker ``rows`` (:func:`pool_rows`), each running call's worker
    address, calls waiting (READY among ``states``), workers that left."""
    queued = sum(1 for s in states.values() if s == "READY")
    return {"k": "pool", "workers": rows, "calls": list(where.items()),
            "queued": queued, "gone": sorted(gone), "lost": sorted(lost),
            "connected": connected, "cores": cores}


def calls_changed(before: Mapping[int, str], now: Mapping[int, str]
                  ) -> tuple[list[tuple[int, str]], list[int]]:
    """What a pool record says of the calls' places after one that said ``before``: the
    calls placed or moved since (``[call, address]``), and those no longer placed (pure)."""
    placed = [(call, addr) for call, addr in now.items() if before.get(call) != addr]
    return placed, sorted(before.keys() - now.keys())


def end_record(run: int, summary: RunSummary) -> EndRecord:
    """The run ended: its summary's figures (what ``--json`` records)."""
    reads = summary.reads
    return {"k": "end", "run": run, "summary": {
        "tasks": summary.tasks, "bundles": summary.bundles, "retries": summary.retries,
        "wall_s": round(summary.wall_s, 3), "workers": summary.workers,
        "near_bytes": reads.near_bytes, "far_bytes": reads.far_bytes,
        "opens": reads.opens, "failovers": reads.failovers,
        "failures": list(summary.failures[:50]), "n_failures": len(summary.failures),
        "lost_workers": list(summary.lost_workers), "timeouts": summary.timeouts,
        "placement": dict(summary.placement),
        "network": [dict(n) for n in summary.network],
        "unmeasured_calls": summary.backups.unmeasured,
        "unmeasured_bytes": summary.backups.unmeasured_bytes}}


def file_tasks(nodes: Iterable[Hashable],
               files_of: Callable[[Hashable], tuple[str, ...]]) -> dict[str, int]:
    """Logical file name -> how many of the tasks read it."""
    counts: Counter[str] = Counter()
    for key in nodes:
        for f in files_of(key):
            counts[logical_name(f)] += 1
    return dict(counts)


def shard_places(shardmap: ShardMap | None, here: str) -> dict[str, ShardPlace]:
    """Each shard's rack and host (``{}`` without a shard map); ``here``: this host's
    name, which a shard on loopback is on."""
    if shardmap is None:
        return {}
    from datavine.scheduler.racks import normal_host, url_host

    places: dict[str, ShardPlace] = {}
    for s in shardmap.shards:
        host = url_host(s.url)
        places[s.name] = {"rack": s.rack, "host": normal_host(host, normal_host(here))
                          if host else None}
    return places


def _state(library: LibraryState | None) -> str | None:
    return library.state if library is not None else None


def _host(library: LibraryState | None) -> str | None:
    return (library.host or None) if library is not None else None


# --- reading -------------------------------------------------------------------------------------
class Tail:
    """The records appended to ``path`` since the last read (a line still being written
    waits for the next read)."""

    def __init__(self, path: str | os.PathLike[str]) -> None:
        self._lines = LineTail(path)

    @property
    def path(self) -> Path:
        return self._lines.path

    def read(self) -> list[Record]:
        return list(parse(self._lines.lines()))


def parse(lines: Iterable[bytes | str]) -> Iterator[Record]:
    """The records of ``lines`` (a line that is not a JSON object with a ``k`` is skipped;
    one is taken to have its kind's shape: the file is the sink's own)."""
    for line in lines:
        if not line.strip():
            continue
        try:
            record = json.loads(line)
        except ValueError:
            continue
        if isinstance(record, dict) and "k" in record:
            yield cast("Record", record)


def read_events(path: str | os.PathLike[str]) -> list[Record]:
    """Every record of an events file."""
    with open(path, "rb") as f:
        return list(parse(f))
