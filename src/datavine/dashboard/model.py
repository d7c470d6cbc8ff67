"""The live view's state: the run's event records folded into what the figures show (pure).

:class:`Board` takes the records of :mod:`datavine.dashboard.events` in order
(:meth:`Board.apply`) and keeps:

- the workers by rack and host: state (:data:`WORKER_STATES`: joining, library starting,
  busy, idle, lost), cores, calls running, bundles done and failed, memory now (read on
  their host by the server, :mod:`datavine.dashboard.procs`, else the last bundle's peak)
  against the cap of the bundle they run, peak, CPU;
- per run (:class:`RunFold`): progress (tasks, bundles and files done of total, files
  failed, events), throughput over time in bins (bytes per XCache server and per nearness:
  on the worker's host, same rack, inter-rack; tasks and events), each bundle's bar in the
  task stream coloured by its outcome (:func:`outcome`), the failures with their cause and
  the slowest files; the decoded bytes the workers' column caches served and those decoded
  from files; the reads' failovers.

Nearness and the column cache's bytes follow
:meth:`datavine.scheduler.summary.RunSummary.add_reads` exactly (near = on the host + same
rack; a read of server :data:`MEMORY`, the column cache alone, opened no file), so the
view's byte totals are the summary's. The Prometheus metrics
(:mod:`datavine.dashboard.metrics`) are read from the same board.
:mod:`datavine.dashboard.columns` turns a board into what the figures plot. No clock, no
I/O: every record carries its time.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import TypedDict

from datavine.dashboard.records import (
    DoneRecord,
    EndRecord,
    EndSummary,
    HelloRecord,
    PoolRecord,
    PoolWorker,
    ProcsRecord,
    Read,
    Record,
    RunRecord,
    SentRecord,
    ShardPlace,
    UsageRecord,
)
from datavine.scheduler.racks import normal_host

WORKER_STATES = ("joining", "library starting", "busy", "idle", "lost")
STATE_COLOURS = {"joining": "#7f7f7f", "library starting": "#ff7f0e", "busy": "#2ca02c",
                 "idle": "#1f77b4", "lost": "#d62728"}
# A bundle's outcome, as the task stream colours it.
DONE, FAILED_OVER, HIGHER_CAP, RETRIED, FAILED = (
    "done", "failed over", "retried with a higher cap", "retried", "failed")
OUTCOMES = (DONE, FAILED_OVER, HIGHER_CAP, RETRIED, FAILED)
OUTCOME_COLOURS = {DONE: "#2ca02c", FAILED_OVER: "#9467bd", HIGHER_CAP: "#ff7f0e",
                   RETRIED: "#7f7f7f", FAILED: "#d62728"}
# Where a read's bytes came from, seen from the worker that read them.
ON_HOST, SAME_RACK, INTER_RACK = "on the host", "same rack", "inter-rack"
NEARNESS = (ON_HOST, SAME_RACK, INTER_RACK)
NEARNESS_COLOURS = {ON_HOST: "#2ca02c", SAME_RACK: "#1f77b4", INTER_RACK: "#d62728"}
MEMORY = "memory"  # a read's server when the column cache alone served it (io/reading.py)
BIN_S = 0.25  # throughput is kept in bins this wide, merged for the figures
SLOWEST = 10  # files listed
MAX_FAILURES = 200  # kept per run (the summary has them all)


def outcome(status: str, failovers: int = 0) -> str:
    """A bundle's outcome from its status (:mod:`datavine.worker.remote`; ``died``: its
    worker or library died under it) and the failovers of its reads."""
    if status == "ok":
        return FAILED_OVER if failovers else DONE
    if status == "memory":
        return HIGHER_CAP
    if status == "input":
        return FAILED_OVER
    if status in ("died", "lost", "time"):
        return RETRIED
    return FAILED


def nearness(server: str, read_rack: str | None, worker_rack: str | None,
             worker_host: str | None, shard_host: str | None) -> str:
    """Where a read came from: a file on the worker, or its shard on the worker's host
    (:data:`ON_HOST`); its shard in the worker's rack (:data:`SAME_RACK`); else
    :data:`INTER_RACK` (another rack, the origin, a direct URL)."""
    if server == "local":
        return ON_HOST
    if worker_rack is not None and read_rack == worker_rack:
        same = worker_host is not None and shard_host is not None and (
            normal_host(worker_host) == normal_host(shard_host))
        return ON_HOST if same else SAME_RACK
    return INTER_RACK


def spread(series: list[float], start: float, end: float, amount: float, width: float) -> None:
    """Add ``amount`` to the bins of ``width`` seconds that ``[start, end]`` covers, in
    proportion to the overlap (all of it to ``end``'s bin when the interval is empty)."""
    start = max(0.0, start)
    end = max(start, end)
    last = int(end // width)
    if len(series) <= last:
        series.extend([0.0] * (last + 1 - len(series)))
    if end - start <= 1e-9:
        series[last] += amount
        return
    rate = amount / (end - start)
    for i in range(int(start // width), last + 1):
        lo, hi = max(start, i * width), min(end, (i + 1) * width)
        if hi > lo:
            series[i] += rate * (hi - lo)


@dataclass
class WorkerRow:
    """One worker as the view shows it."""

    id: str
    host: str | None = None
    rack: str | None = None
    cores: int = 0
    addr: str | None = None
    state: str = "joining"
    running: int = 0
    done: int = 0
    failed: int = 0
    peak_mb: float = 0.0  # the largest bundle peak seen
    last_mb: float | None = None  # the last bundle's peak
    cap_mb: float | None = None  # the cap of what it runs now (else of its last bundle)
    mem_mb: float | None = None  # its processes' memory now (on this host only)
    cpu: float | None = None  # their CPU, % of one core

    @property
    def memory_mb(self) -> float:
        """Memory in use: measured on its host where it can be, else its last bundle's peak."""
        if self.mem_mb is not None:
            return self.mem_mb
        return self.last_mb or 0.0


class Bar(TypedDict):
    """A bundle's bar in the task stream: its worker, seconds since the run started,
    outcome and colour, tasks, call, memory peak and cap (NaN: not known)."""

    worker: str
    start: float
    end: float
    outcome: str
    colour: str
    tasks: int
    call: int
    peak_mb: float
    cap_mb: float


class Failure(TypedDict):
    """A bundle that did not succeed: when, where, its outcome and why."""

    at_s: float
    worker: str
    outcome: str
    cause: str


class SlowFile(TypedDict):
    """A file among the slowest: the seconds of the bundle that read it, where from."""

    file: str
    seconds: float
    worker: str
    server: str
    mb: float


class UsageNow(TypedDict, total=False):
    """The manager's ``[MB, % CPU]`` and this host's ``[MB used, MB, % CPU]``."""

    manager: list[float]
    host: list[float]


@dataclass
class Sent:
    t: float
    tasks: int
    cap_mb: float | None
    files: tuple[str, ...]
    events: int


@dataclass
class Bins:
    """Throughput over time: per bin of ``width`` seconds since the run started."""

    width: float = BIN_S
    tasks: list[float] = field(default_factory=list)
    events: list[float] = field(default_factory=list)
    by_server: dict[str, list[float]] = field(default_factory=dict)
    by_nearness: dict[str, list[float]] = field(default_factory=lambda: {n: [] for n in NEARNESS})

    @property
    def length(self) -> int:
        return max([len(self.tasks), len(self.events),
                    *(len(s) for s in self.by_server.values()),
                    *(len(s) for s in self.by_nearness.values())])


@dataclass
class RunFold:
    """One ``get`` call, as far as its records went."""

    run: int
    t0: float
    tasks: int = 0
    files: dict[str, int] = field(default_factory=dict)  # logical name -> tasks reading it
    shards: dict[str, ShardPlace] = field(default_factory=dict)
    sent: dict[int, Sent] = field(default_factory=dict)  # calls in flight
    bundles_sent: int = 0
    copies_sent: int = 0  # backup copies (scheduler/speculation.py), not bundles
    bundles_done: int = 0  # came back ok
    bundles_failed: int = 0  # came back otherwise
    tasks_done: int = 0
    events_done: int = 0
    events_expected: int = 0  # of the bundles sent
    outcomes: Counter[str] = field(default_factory=Counter)
    file_done: Counter[str] = field(default_factory=Counter)
    files_failed: set[str] = field(default_factory=set)
    bytes_by_nearness: Counter[str] = field(default_factory=Counter)
    bytes_by_server: Counter[str] = field(default_factory=Counter)
    bytes_by_place: Counter[tuple[str, str]] = field(default_factory=Counter)  # (server, near)
    cache_hit_bytes: int = 0  # decoded bytes the workers' column caches served
    cache_decoded_bytes: int = 0  # decoded from files (what a cache could serve next time)
    failovers: int = 0  # reads that failed over to another server, of bundles done
    stream: list[Bar] = field(default_factory=list)
    failures: list[Failure] = field(default_factory=list)
    slow: dict[str, SlowFile] = field(default_factory=dict)
    bins: Bins = field(default_factory=Bins)
    queued: int = 0
    running: int = 0
    last_t: float = 0.0
    end: EndSummary | None = None

    @property
    def elapsed_s(self) -> float:
        if self.end is not None and self.end.get("wall_s"):
            return float(self.end["wall_s"])
        return max(0.0, self.last_t - self.t0)

    @property
    def files_done(self) -> int:
        return sum(1 for f, n in self.files.items() if self.file_done[f] >= n)

    @property
    def near_bytes(self) -> int:
        return int(self.bytes_by_nearness[ON_HOST] + self.bytes_by_nearness[SAME_RACK])

    @property
    def far_bytes(self) -> int:
        return int(self.bytes_by_nearness[INTER_RACK])

    @property
    def cache_hit_fraction(self) -> float:
        """The share of the decoded bytes read that came from the column caches."""
        total = self.cache_hit_bytes + self.cache_decoded_bytes
        return self.cache_hit_bytes / total if total else 0.0


class Board:
    """The view's state, folded from records in order."""

    def __init__(self, bin_s: float = BIN_S) -> None:
        self.bin_s = bin_s
        self.workers: dict[str, WorkerRow] = {}
        self._pool_workers: list[PoolWorker] = []  # the workers of the last pool record
        self._where: dict[int, str] = {}  # each placed call's worker, as pool records said
        self.by_addr: dict[str, str] = {}
        self.runs: list[RunFold] = []
        self.pids: dict[str, int] = {}  # local workers' PIDs (their memory is read here)
        self.manager_pid: int | None = None
        self.usage: UsageNow = {}  # the manager's and the host's, from the server
        self.workers_lost = 0  # times a worker was seen to leave or be lost
        self.last_t = 0.0

    @property
    def run(self) -> RunFold | None:
        return self.runs[-1] if self.runs else None

    def apply_all(self, records: Iterable[Record]) -> Board:
        for record in records:
            self.apply(record)
        return self

    def apply(self, record: Record) -> None:
        t = float(record.get("t", self.last_t))
        self.last_t = max(self.last_t, t)
        if self.runs:
            self.runs[-1].last_t = max(self.runs[-1].last_t, t)
        if record["k"] == "hello":
            self._hello(record, t)
        elif record["k"] == "procs":
            self._procs(record, t)
        elif record["k"] == "run":
            self._run(record, t)
        elif record["k"] == "sent":
            self._sent(record, t)
        elif record["k"] == "done":
            self._done(record, t)
        elif record["k"] == "pool":
            self._pool(record, t)
        elif record["k"] == "end":
            self._end(record, t)
        elif record["k"] == "usage":
            self._usage(record, t)
        elif record["k"] == "gone" and self.run is not None:
            self.run.sent.pop(int(record["call"]), None)

    # --- records --------------------------------------------------------------------------
    def _hello(self, r: HelloRecord, t: float) -> None:
        self.manager_pid = r.get("pid")

    def _procs(self, r: ProcsRecord, t: float) -> None:
        for name, pid in r.get("pids", {}).items():
            self.pids[name] = int(pid)
            self.workers.setdefault(name, WorkerRow(name))

    def _run(self, r: RunRecord, t: float) -> None:
        self._where.clear()  # a run's first pool record places its calls again
        self.runs.append(RunFold(int(r.get("run", len(self.runs) + 1)), t,
                                 tasks=int(r.get("tasks", 0)), files=dict(r.get("files", {})),
                                 shards=dict(r.get("shards", {})), bins=Bins(self.bin_s),
                                 last_t=t))

    def _sent(self, r: SentRecord, t: float) -> None:
        run = self.run
        if run is None:
            return
        events = int(r.get("ev") or 0)
        run.sent[int(r["call"])] = Sent(t, int(r.get("n", 0)), r.get("cap"),
                                        tuple(r.get("files", ())), events)
        if r.get("copy"):  # its bundle was counted when it went out
            run.copies_sent += 1
            return
        run.bundles_sent += 1
        run.events_expected += events

    def _done(self, r: DoneRecord, t: float) -> None:
        run = self.run
        if run is None:
            return
        sent = run.sent.pop(int(r["call"]), None)
        tasks = int(r.get("n") or (sent.tasks if sent else 0))
        row = self._worker_of(r)
        status = str(r.get("status"))
        reads = r.get("reads") or []
        result = outcome(status, sum(int(x[4]) for x in reads))
        run.outcomes[result] += 1
        end = t - run.t0
        wall = float(r.get("wall") or 0.0)
        start = end - wall if wall > 0 else ((sent.t - run.t0) if sent else end)
        cap = r.get("cap") if r.get("cap") is not None else (sent.cap_mb if sent else None)
        peak = float(r.get("peak") or 0.0)
        run.stream.append({"worker": row.id, "start": max(0.0, start), "end": end,
                           "outcome": result, "colour": OUTCOME_COLOURS[result],
                           "tasks": tasks, "call": int(r["call"]), "peak_mb": peak,
                           "cap_mb": cap if cap is not None else float("nan")})
        if peak:
            row.peak_mb = max(row.peak_mb, peak)
            row.last_mb = peak
        if cap is not None:
            row.cap_mb = float(cap)
        if status != "ok":
            run.bundles_failed += 1
            row.failed += 1
            if len(run.failures) < MAX_FAILURES:
                run.failures.append({"at_s": round(end, 1), "worker": row.id,
                                     "outcome": result, "cause": str(r.get("why") or status)})
            if result == FAILED and sent is not None:
                run.files_failed.update(sent.files)
            return
        run.bundles_done += 1
        row.done += 1
        again = int(r.get("again") or 0)  # tasks made again: done (and counted) before
        run.tasks_done += tasks - again
        bins = run.bins  # throughput: the work done, made again or not
        spread(bins.tasks, start, end, tasks, bins.width)
        if sent is not None:
            run.events_done += sent.events - int(r.get("again_ev") or 0)
            if sent.events:
                spread(bins.events, start, end, sent.events, bins.width)
            if again < tasks:  # a bundle made again read its files before
                for f in sent.files:
                    run.file_done[f] += 1
        self._reads(run, row, r, reads, start, end, wall)

    def _reads(self, run: RunFold, row: WorkerRow, r: DoneRecord, reads: list[Read],
               start: float, end: float, wall: float) -> None:
        bins = run.bins
        for read in reads:
            lfn, server, rack, nbytes, failovers = read[:5]
            if len(read) >= 7:  # else a file from before the column cache's figures
                run.cache_hit_bytes += int(read[5])
                run.cache_decoded_bytes += int(read[6])
            if server == MEMORY:  # the column cache alone: no file was opened
                continue
            run.failovers += int(failovers)
            shard = run.shards.get(server)
            near = nearness(server, rack, r.get("rack"), r.get("host"),
                            shard.get("host") if shard is not None else None)
            run.bytes_by_nearness[near] += nbytes
            run.bytes_by_server[server] += nbytes
            run.bytes_by_place[server, near] += nbytes
            spread(bins.by_nearness[near], start, end, nbytes, bins.width)
            spread(bins.by_server.setdefault(server, []), start, end, nbytes, bins.width)
            slow = run.slow.get(lfn)
            if slow is None or wall > slow["seconds"]:
                run.slow[lfn] = {"file": lfn, "seconds": round(wall, 3), "worker": row.id,
                                 "server": server, "mb": round(nbytes / 1e6, 2)}
        if len(run.slow) > 4 * SLOWEST:  # keep the slowest only
            keep = sorted(run.slow.values(), key=lambda s: -s["seconds"])[:SLOWEST]
            run.slow = {s["file"]: s for s in keep}

    def _pool(self, r: PoolRecord, t: float) -> None:
        run = self.run
        placed = self._where
        if "calls" in r:  # every call's place (a run's first record)
            placed.clear()
            placed.update((int(call), addr) for call, addr in r["calls"])
        for call in r.get("unplaced", ()):
            placed.pop(int(call), None)
        placed.update((int(call), addr) for call, addr in r.get("placed", ()))
        running = Counter(placed.values())
        caps: dict[str, float] = {}
        if run is not None:
            run.queued, run.running = int(r.get("queued", 0)), len(placed)
            for call, where in placed.items():
                sent = run.sent.get(call)
                if sent is not None and sent.cap_mb is not None:
                    caps[where] = max(caps.get(where, 0.0), float(sent.cap_mb))
        present = set()
        if "workers" in r:  # else the same as the last pool record's
            self._pool_workers = r["workers"]
        for w in self._pool_workers:
            row = self.workers.setdefault(str(w["id"]), WorkerRow(str(w["id"])))
            addr = w.get("addr")
            row.host = w.get("host") or row.host
            row.rack = w.get("rack") or row.rack
            row.cores = int(w.get("cores") or row.cores)
            if addr:
                row.addr = addr
                self.by_addr[addr] = row.id
                row.running = running.get(addr, 0)
                row.state = ("library starting" if w.get("lib") == "sent" else
                             "busy" if row.running else "idle")
                if addr in caps:
                    row.cap_mb = caps[addr]
                present.add(row.id)
            elif row.state != "lost":
                row.state = "joining"
                present.add(row.id)
        lost = set(r.get("gone", [])) | {self.by_addr.get(a, a) for a in r.get("lost", [])}
        for row in self.workers.values():
            if row.id in lost or (row.id not in present and row.state != "joining"):
                self.workers_lost += row.state != "lost"
                row.state, row.running = "lost", 0

    def _end(self, r: EndRecord, t: float) -> None:
        run = self.run
        if run is not None:
            summary: EndSummary = r.get("summary", {})
            run.end = summary.copy()
            run.running = run.queued = 0
        for row in self.workers.values():
            if row.state == "busy":
                row.state, row.running = "idle", 0

    def _usage(self, r: UsageRecord, t: float) -> None:
        """Memory and CPU read on this host (:mod:`datavine.dashboard.procs`)."""
        for name, (mem_mb, cpu) in r.get("workers", {}).items():
            row = self.workers.get(name)
            if row is not None:
                row.mem_mb, row.cpu = mem_mb, cpu
        usage: UsageNow = {}
        if "manager" in r:
            usage["manager"] = r["manager"]
        if "host" in r:
            usage["host"] = r["host"]
        self.usage = usage

    def _worker_of(self, r: DoneRecord) -> WorkerRow:
        addr = r.get("addr")
        wid = r.get("worker") or (self.by_addr.get(addr) if addr else None) or addr or "?"
        row = self.workers.setdefault(str(wid), WorkerRow(str(wid)))
        if addr:
            row.addr = row.addr or addr
            self.by_addr.setdefault(addr, row.id)
        row.host = row.host or r.get("host")
        row.rack = row.rack or r.get("rack")
        if row.state == "joining":  # it ran a bundle: connected
            row.state = "idle"
        return row
