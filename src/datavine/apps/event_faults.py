"""Exactly once, under faults: event-processing runs with a worker killed or frozen mid-run.

Each check runs one workload on a fresh :class:`~datavine.LocalCluster` twice: once without
a fault (the reference), then with a worker SIGKILLed with its whole session (``kill``) or
its session SIGSTOPped (``freeze``: declared lost after ``ManagerConfig.worker_timeout_s``).
The workloads are the AGC-style analysis on generated NanoAOD-like files
(:func:`datavine.apps.analysis.sources.analysis_graph`) and coffea's ``processor.Runner``
through :class:`datavine.coffea.DatavineExecutor` on coffea's NanoAOD samples
(:class:`datavine.apps.analysis.nano_cutflow.NanoCutflow`).

The fault strikes from a result hook (:class:`StrikeAtFirstKept`), in the manager's thread,
at the first delivery whose value a local worker keeps: the run is then certainly mid-way
(that value's merge has not run, other items are still out) and the struck worker takes a
value with it, which the run must make again. The clusters keep every value on its worker
(``RunConfig(inline_max_bytes=0)``): with datavine's default, results this small come back
to the manager inline and only the calls in flight are lost.

A check (:class:`EventCheck`) holds what the faulted run counted: events in the merged
result against the dataset's entries, the result against the reference's (histograms,
cutflow, sums: exactly), events the progress counted (coffea), tasks the run summary
counted against the graph's, and the deliveries seen (a value made again is delivered
again). :mod:`tests.test_event_faults` asserts them; ``benchmarks/faults.py`` prints them.
"""

from __future__ import annotations

import os
import signal
import time
from collections.abc import Callable, Hashable
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING

from datavine.apps.faults import live_in_sessions, private_tmp, read_entries, wait_until_quiet
from datavine.deploy.sessions import kill_session, signal_session
from datavine.worker.value_file import ValueFile, ValueFileError

if TYPE_CHECKING:
    from datavine.apps.analysis.agc import ChunkResult
    from datavine.apps.analysis.nano_cutflow import Output
    from datavine.manager.cluster import LocalCluster

Key = Hashable
FAULTS = ("kill", "freeze")
APPS = ("agc", "coffea")
AGC_FILES, AGC_EVENTS, AGC_CHUNK = 4, 20_000, 5_000  # 16 chunks, 3 merges: ~2 s on 2 workers
COFFEA_SAMPLES = ("nano_dy", "nano_tt_v12", "nano_dimuon")  # 280 events
COFFEA_CHUNK = 25  # 12 work items, 2 merges


@dataclass
class EventCheck:
    """One workload run with a fault, against the same run without one (see the module)."""

    app: str
    fault: str
    dataset_events: int
    events: int = 0  # in the faulted run's merged result
    same_as_fault_free: bool = False  # histograms, cutflow and sums, exactly
    counted_events: int | None = None  # what the progress counted (coffea), None: no count
    tasks_counted: int = 0  # the run summary's tasks
    graph_tasks: int = 0  # distinct tasks the fault-free run delivered
    deliveries: int = 0  # tasks delivered in the faulted run, a task made again each time
    remade: int = 0  # the run summary's recomputed
    retries: int = 0
    lost_workers: list[str] = field(default_factory=list)
    injected: bool = False
    struck_after: int = 0  # distinct tasks delivered when the fault struck
    seconds: float = 0.0
    fault_free_s: float = 0.0
    processes_left: int = 0
    error: str = ""

    @property
    def exact(self) -> bool:
        """Every event once: in the result, in the progress and in the summary's tasks."""
        return (self.events == self.dataset_events and self.same_as_fault_free
                and self.counted_events in (None, self.dataset_events)
                and self.tasks_counted == self.graph_tasks)

    @property
    def ok(self) -> bool:
        """The fault struck mid-run, everything counted once, nothing left behind."""
        return (self.injected and 0 < self.struck_after < self.graph_tasks and self.exact
                and not self.error and self.processes_left == 0)

    def line(self) -> str:
        counted = "-" if self.counted_events is None else f"{self.counted_events:,}"
        return (f"| {self.app} | {self.fault} | {'yes' if self.injected else 'NO'} | "
                f"{self.events:,} / {self.dataset_events:,} | "
                f"{'yes' if self.same_as_fault_free else 'NO'} | {counted} | "
                f"{self.tasks_counted} / {self.graph_tasks} | {self.deliveries} | "
                f"{self.remade} | {self.seconds:.1f} ({self.fault_free_s:.1f}) | "
                f"{'yes' if self.ok else 'NO'} |" + (f" {self.error}" if self.error else ""))


TABLE_HEAD = ("| run | fault | injected | events / dataset | = fault-free | progress events | "
              "tasks counted / graph | deliveries | made again | s (fault-free) | ok |\n"
              "|---|---|---|---|---|---|---|---|---|---|---|")


# --- the fault -------------------------------------------------------------------------------
def holder(run_dir: Path, workers: int, keys: list[Key]) -> int | None:
    """The local worker (its index) that keeps a value of ``keys``: datavine writes a
    bundle's kept values to one file (:mod:`datavine.worker.value_file`) that TaskVine keeps
    as a temp in the worker's cache (``worker-<i>/cache/temp-*`` in cctools 7.15)."""
    wanted = set(keys)
    for index in range(workers):
        for path in sorted((run_dir / f"worker-{index}" / "cache").glob("temp-*")):
            if path.suffix == ".meta":
                continue
            try:
                held = ValueFile.open(str(path)).keys()
            except (OSError, ValueFileError):
                continue
            if wanted & set(held):
                return index
    return None


def strike(pid: int, fault: str) -> None:
    """``kill``: SIGKILL the worker's session; ``freeze``: SIGSTOP it."""
    if fault == "kill":
        kill_session(pid)
    elif fault == "freeze":
        signal_session(pid, signal.SIGSTOP)
    else:
        raise ValueError(f"unknown fault {fault!r}: one of {', '.join(FAULTS)}")


class StrikeAtFirstKept:
    """A result hook: records every delivery, and at the first one whose value a local
    worker keeps, strikes that worker (in the manager's thread: nothing else has happened
    since that result came back)."""

    def __init__(self, cluster: LocalCluster, fault: str | None) -> None:
        assert cluster.workers is not None  # started
        self.workers = cluster.workers
        self.fault = fault
        self.delivered: list[Key] = []
        self.struck: int | None = None  # the worker's index
        self.struck_after = 0

    def __call__(self, keys: list[Key], values: dict[Key, object]) -> None:
        self.delivered.extend(keys)
        if self.fault is None or self.struck is not None or not keys:
            return
        index = holder(self.workers.run_dir, len(self.workers.procs), keys)
        if index is None:
            return
        strike(self.workers.procs[index].pid, self.fault)
        self.struck, self.struck_after = index, len(set(self.delivered))


# --- the workloads ---------------------------------------------------------------------------
@dataclass
class Workload:
    """A run on a cluster: ``run`` returns (its result, events its progress counted or
    None); ``events`` reads the events in a result; ``same`` compares two results."""

    app: str
    dataset_events: int
    run: Callable[[LocalCluster], tuple[object, int | None]]
    events: Callable[[object], int]
    same: Callable[[object, object], bool]
    preload: tuple[str, ...] = ()


def agc_workload(data: Path) -> Workload:
    """The AGC-style analysis over :data:`AGC_FILES` generated files (made once in
    ``data``), one task per chunk of :data:`AGC_CHUNK` events, merged 8 at a time."""
    from datavine.apps.analysis import make_chunks
    from datavine.io.datagen import generate_dataset

    files = generate_dataset(data, AGC_FILES, AGC_EVENTS, seed=28, basket_events=AGC_CHUNK)
    chunks = make_chunks(files, AGC_CHUNK)

    def run(cluster: LocalCluster) -> tuple[object, int | None]:
        import dask

        from datavine.apps.analysis.sources import LocalFiles, analysis_graph

        (result,) = dask.compute(analysis_graph(LocalFiles(), chunks), scheduler=cluster.get)
        return result.result, None

    return Workload("agc", sum(read_entries(str(f)) for f in files), run,
                    lambda r: _chunk_result(r).events, _same_chunk_results)


def _chunk_result(value: object) -> ChunkResult:
    from datavine.apps.analysis.agc import ChunkResult

    assert isinstance(value, ChunkResult), type(value)
    return value


def _same_chunk_results(a: object, b: object) -> bool:
    """Histogram, events, selected events and chunks merged (bytes read may differ: a
    chunk read again reads its file's header again)."""
    import numpy as np

    x, y = _chunk_result(a), _chunk_result(b)
    return (np.array_equal(x.counts, y.counts) and np.array_equal(x.edges, y.edges)
            and (x.events, x.events_selected, x.chunks) == (y.events, y.events_selected,
                                                              y.chunks))


def coffea_workload() -> Workload:
    """:class:`NanoCutflow` through coffea's ``Runner`` and :class:`DatavineExecutor` over
    coffea's NanoAOD samples, in items of :data:`COFFEA_CHUNK` events; the progress's count
    is the executor's ``report.last.processed``."""
    from coffea import processor
    from coffea.nanoevents import NanoAODSchema

    from datavine.apps.analysis.nano_cutflow import NanoCutflow, events_in
    from datavine.coffea import DatavineExecutor
    from datavine.coffea.executor import LIBRARY_PRELOAD
    from datavine.io.samples import coffea_sample

    fileset = {name: [str(coffea_sample(name))] for name in COFFEA_SAMPLES}
    plain = processor.Runner(executor=processor.IterativeExecutor(status=False),
                             schema=NanoAODSchema, chunksize=COFFEA_CHUNK)
    items = list(plain.preprocess(fileset, treename="Events"))

    def run(cluster: LocalCluster) -> tuple[object, int | None]:
        executor = DatavineExecutor(cluster=cluster, status=False, retry_delay_s=0.0)
        runner = processor.Runner(executor=executor, schema=NanoAODSchema,
                                  chunksize=COFFEA_CHUNK)
        out = runner(items, processor_instance=NanoCutflow())
        record = executor.report.last if executor.report is not None else None
        counted = record.processed[0] if record is not None and record.processed else None
        return out, counted

    def events(out: object) -> int:
        return events_in(_output(out))

    return Workload("coffea", sum(read_entries(f) for files in fileset.values()
                                  for f in files), run, events,
                    lambda a, b: _output(a) == _output(b), preload=LIBRARY_PRELOAD)


def _output(value: object) -> Output:
    assert isinstance(value, dict), type(value)
    return value


# --- the check -------------------------------------------------------------------------------
def check(workload: Workload, fault: str, *, workers: int = 2,
          worker_timeout_s: float = 15.0) -> EventCheck:
    """Run ``workload`` without a fault, then with ``fault`` (see the module), on one fresh
    cluster of ``workers`` 1-core local workers; never raises (an error is in the check)."""
    import datavine

    result = EventCheck(workload.app, fault, workload.dataset_events)
    run = datavine.RunConfig(inline_max_bytes=0, no_worker_timeout_s=30, timeout_s=240,
                             preload=workload.preload)
    with private_tmp() as tmp:
        sids: set[int] = set()
        try:
            with datavine.LocalCluster(workers=workers, cores=1, run=run,
                                       manager=datavine.ManagerConfig(
                                           run_dir=tmp / "run",
                                           worker_timeout_s=worker_timeout_s)) as cluster:
                assert cluster.workers is not None  # started
                sids = {p.pid for p in cluster.workers.procs}
                _run_both(cluster, workload, fault, result)
        except Exception as exc:  # the check says what went wrong
            result.error = f"{type(exc).__name__}: {str(exc).splitlines()[0][:200]}"
        wait_until_quiet(sids)
        result.processes_left = len(live_in_sessions(sids))
    return result


def _run_both(cluster: LocalCluster, workload: Workload, fault: str,
              result: EventCheck) -> None:
    reference = StrikeAtFirstKept(cluster, None)
    t0 = time.monotonic()
    with cluster.subscribe_results(reference):
        expected, _ = workload.run(cluster)
    result.fault_free_s = time.monotonic() - t0
    result.graph_tasks = len(set(reference.delivered))
    hook = StrikeAtFirstKept(cluster, fault)
    t0 = time.monotonic()
    with cluster.subscribe_results(hook):
        got, result.counted_events = workload.run(cluster)
    result.seconds = time.monotonic() - t0
    result.injected = hook.struck is not None
    result.struck_after = hook.struck_after
    result.deliveries = len(hook.delivered)
    result.events = workload.events(got)
    result.same_as_fault_free = workload.same(got, expected)
    summary = cluster.last_summary
    assert summary is not None  # every run leaves one
    result.tasks_counted, result.remade = summary.tasks, summary.recomputed
    result.retries, result.lost_workers = summary.retries, list(summary.lost_workers)


def default_data() -> Path:
    """Where the AGC workload's files are generated (reused): ``runs/event-faults-data``
    of the checkout, or of the working directory."""
    root = Path(__file__).resolve().parents[3]
    base = root if (root / "pyproject.toml").is_file() else Path(os.getcwd())
    return base / "runs" / "event-faults-data"
