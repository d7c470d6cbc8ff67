"""Benchmark: how the manager's cost grows with the number of workers (real vine_workers).

For each count N (default 8, 32, 128, 256), ``datavine.LocalCluster(workers=N, cores=1,
run=RunConfig(memory=None))`` on this host: N real ``vine_worker`` processes, each with a
library (a Python process) started before the clock. ``memory=None`` runs bundles in the
library itself: with caps on, every library would keep a forked child as well, doubling
the processes. The graph: ``--waves`` x N tasks that sleep ``--sleep`` seconds (so the 2
real cores are not the limit) and name a ``.root`` path each (so each is a bundle of its own
and goes through placement, as a file-reading task does), then one task collecting them.

Per count: seconds from submit until all N workers run a task at once (``all_busy_s``),
achieved concurrency / ideal (the ideal run is ``waves x sleep``: every worker busy from
the first instant), manager CPU seconds per bundle (the thread that runs TaskVine's manager
and datavine's loop; the whole process's is in the note), the scheduler's own decision
time per bundle (datavine's planner, placement and caps, timed by wrapping those calls),
manager RSS, memory per worker (drop of MemAvailable over the cluster's start / N), and
workers lost. Beside the manager's CPU, what shares its cores here: the CPU of the workers'
own processes per bundle (each local worker's session: the ``vine_worker``, its library,
their children; from /proc) and the share of the host's cores busy over the run. The same
graph runs on DaskVine function-calls (``--daskvine-max``) and distributed
(``--distributed-max``) where they fit. A count that would not fit in memory (the resident
memory of each worker's processes at the previous count) is skipped and the reason printed.

Where the clusters' folders go (``--workspaces``): ``memory`` (the default since 2026-11-28
19:40, and from 16:41 to 17:51 that day) puts the benchmark's folder, with the manager's logs
and the workers' workspaces, on a tmpfs (``/dev/shm``; Debian's ``/tmp`` is one by default
since trixie), removed at the end; without a writable tmpfs it says so and uses ``disk``.
``disk`` (where every recorded figure before 16:41 ran) keeps each cluster's folder in the
system's temporary folder. The 256 workers share this host's 2 cores with the manager being
measured, and every call makes and removes a sandbox of files on its worker. On this
machine's disk (ext4 without a journal) each new file first steps over the inodes removed in
the last minute or more (the kernel's ``recently_deleted``, checked only where there is no
journal): 35-40% of a worker's and of a library's CPU in the scale test (perf). On the disk
the host's cores are busier over a run (0.048-0.086 of them against 0.040-0.058 on the tmpfs,
5 alternated pairs of ``--counts 256 --repeat 2`` at 18:59-19:17; the extra is not
consistently in the workers' own processes: most likely the kernel's threads'), and the
manager's CPU per bundle is higher and spread wider (0.48-0.68 ms against 0.43-0.47, in
every pair; 14 of 16 pairs that day). At a facility the workers and their disks are on
other hosts and take none of the manager's cores: the tmpfs is the nearer of the two to that
(benchmarks/HISTORY.md, workers).

    .venv/bin/python benchmarks/workers.py [--counts 8 32 128 256] [--sleep 10] [--waves 3]
        [--repeat 3] [--daskvine-max 32] [--distributed-max 32] [--no-speculation]
        [--workspaces memory|disk]

Last line: ``concurrency_ratio_<largest>=... manager_cpu_per_bundle_growth=...
decision_us_per_bundle=... workers_lost=... largest=...`` and, per count,
``cpu_ms_per_bundle_<N>=... workers_cpu_ms_per_bundle_<N>=... host_busy_<N>=...``.
"""

from __future__ import annotations

import argparse
import contextlib
import functools
import os
import resource
import shutil
import statistics
import sys
import tempfile
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import common
import dask
from dask import delayed


def sleep_task(path: str, seconds: float) -> tuple[float, float]:
    """Sleep ``seconds``; ``path`` (never opened) makes datavine place the task like a
    file-reading one. Returns (start, end) on this host's clock."""
    start = time.time()
    time.sleep(seconds)
    return start, time.time()


def collect(*intervals: tuple[float, float]) -> list[tuple[float, float]]:
    return list(intervals)


def make_graph(n_tasks: int, seconds: float, run: int = 0) -> Any:
    """``run`` makes the paths new for each repeat: every run places its tasks as a first
    run does (a repeat would otherwise send each task to the worker that "read" its path)."""
    parts = [delayed(sleep_task, pure=True)(f"/bench/workers/run-{run}/file-{i:06d}.root",
                                            seconds, dask_key_name=f"sleep-{run}-{i}")
             for i in range(n_tasks)]
    return delayed(collect, pure=True)(*parts, dask_key_name=f"collect-{run}")


@dataclass
class Run:
    peer: str
    workers: int
    wall_s: float
    ideal_s: float
    all_busy_s: float | None
    max_concurrency: int
    start_s: float = 0.0
    bundles: int = 0
    cpu_s: float = 0.0
    decision_s: float = 0.0
    taskvine_wait_s: float = 0.0  # of cpu_s: inside TaskVine's Manager.wait (datavine only)
    rss_mb: float = 0.0
    mb_per_worker: float = 0.0
    lost: int = 0
    note: str = ""
    extra: dict[str, Any] = field(default_factory=dict)

    @property
    def concurrency_ratio(self) -> float:
        return self.ideal_s / self.wall_s if self.wall_s else 0.0


def busy_profile(intervals: list[tuple[float, float]], t0: float,
                 n: int) -> tuple[float | None, int]:
    """(seconds from ``t0`` until ``n`` tasks ran at once, or None; the most at once)."""
    events = sorted([(s, 1) for s, _ in intervals] + [(e, -1) for _, e in intervals])
    running = best = 0
    reached = None
    for t, step in events:
        running += step
        best = max(best, running)
        if reached is None and running >= n:
            reached = t - t0
    return reached, best


def mem_available_mb() -> float:
    for line in Path("/proc/meminfo").read_text().splitlines():
        if line.startswith("MemAvailable:"):
            return int(line.split()[1]) / 1024
    return 0.0


def _in_sessions(sessions: set[int]) -> Iterator[tuple[Path, list[str]]]:
    """(its /proc folder, the fields of its ``stat`` after the command's name) of every
    process in the sessions ``sessions`` (a local worker leads a session of its own, with its
    library and their children); a process gone meanwhile is left out."""
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            # pid (comm) state ppid pgrp session ...: comm may hold spaces, so after its ')'
            fields = (entry / "stat").read_text().rpartition(")")[2].split()
        except OSError:
            continue
        if int(fields[3]) in sessions:
            yield entry, fields


def sessions_rss_mb(sessions: set[int]) -> float:
    """Resident memory of every process in the sessions ``sessions``, from /proc."""
    page_mb = os.sysconf("SC_PAGE_SIZE") / 2**20
    total = 0.0
    for entry, _ in _in_sessions(sessions):
        try:
            total += int((entry / "statm").read_text().split()[1]) * page_mb
        except (OSError, IndexError, ValueError):
            continue  # gone meanwhile
    return total


def sessions_cpu_s(sessions: set[int]) -> float:
    """CPU seconds (user and system, with those of reaped children) of every process in the
    sessions ``sessions``, from /proc."""
    # after comm: ... utime stime cutime cstime are the 12th to 15th fields
    ticks = sum(sum(int(v) for v in fields[11:15]) for _, fields in _in_sessions(sessions))
    return ticks / os.sysconf("SC_CLK_TCK")


def rss_mb() -> float:
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    return 0.0


def cpu_s() -> float:
    """CPU seconds of this thread: the manager's (TaskVine's manager and datavine's loop run
    in the thread that calls ``get``), without the process's other threads (the local
    workers' watch thread, distributed's scheduler, ...)."""
    return time.thread_time()


def process_cpu_s() -> float:
    usage = resource.getrusage(resource.RUSAGE_SELF)
    return usage.ru_utime + usage.ru_stime


@contextlib.contextmanager
def timed_decisions() -> Iterator[list[float]]:
    """Time datavine's decisions (planner, placement, caps) by wrapping those calls."""
    from datavine.scheduler.dispatch import Dispatcher
    from datavine.scheduler.memory import MemoryState

    spent = [0.0]
    # Dispatcher.fill: the planner's bundles, held or placed (topology views, decide)
    targets = [(Dispatcher, "fill"), (MemoryState, "cap_for"),
               (MemoryState, "dominant_category")]
    saved = [(cls, name, getattr(cls, name)) for cls, name in targets]

    def wrap(fn: Callable[..., Any]) -> Callable[..., Any]:
        def timed(*args: Any, **kwargs: Any) -> Any:
            started = time.perf_counter()
            try:
                return fn(*args, **kwargs)
            finally:
                spent[0] += time.perf_counter() - started
        return timed

    for cls, name, fn in saved:
        setattr(cls, name, wrap(fn))
    try:
        yield spent
    finally:
        for cls, name, fn in saved:
            setattr(cls, name, fn)


@contextlib.contextmanager
def timed_waits() -> Iterator[list[float]]:
    """CPU seconds this thread spends inside TaskVine's ``Manager.wait`` (its C loop:
    polling every worker's link, receiving results, dispatching calls), by wrapping
    ``Runtime.wait``; the rest of the manager thread's CPU is datavine's own."""
    from datavine.manager.runtime import Runtime

    spent = [0.0]
    original = Runtime.wait

    def wait(self: Any, timeout_s: int) -> Any:
        started = time.thread_time()
        try:
            return original(self, timeout_s)
        finally:
            spent[0] += time.thread_time() - started

    Runtime.wait = wait  # type: ignore[method-assign]
    try:
        yield spent
    finally:
        Runtime.wait = original  # type: ignore[method-assign]


def run_datavine(n: int, sleep: float, waves: int, repeat: int,
                 speculation: bool = True, root: Path | None = None) -> Run:
    """``repeat`` runs on one cluster; the best (least manager CPU per bundle) counts, the
    others are in the note (the machine is shared: load moves the figures). ``root``: the
    folder the cluster's own goes in (:func:`common.run_dir`; None: the cluster makes and
    removes its own, in the system's temporary folder)."""
    import datavine
    from datavine.config import ManagerConfig, RunConfig

    before = mem_available_mb()
    started = time.perf_counter()
    run_cfg = RunConfig(memory=None, no_worker_timeout_s=300, speculation=speculation)
    manager = ManagerConfig(run_dir=common.run_dir("datavine", root)) if root else None
    runs = []
    with datavine.LocalCluster(workers=n, cores=1, run=run_cfg, manager=manager,
                               connect_timeout_s=900) as cluster:
        start_s = time.perf_counter() - started
        per_worker = (before - mem_available_mb()) / n
        # what the next count's fit is judged by: the workers' own memory (MemAvailable moves
        # with everything else on the host: at 8 workers a 0.5 GB swing read as 69 MB each)
        sessions = set(cluster._worker_pids().values())
        rss_per_worker = sessions_rss_mb(sessions) / n
        warm = len(cluster.warm_libraries)
        lost = retries = 0
        for i in range(repeat):
            graph = make_graph(waves * n, sleep, run=i)
            with timed_decisions() as spent, timed_waits() as waited:
                wcpu0, host0 = sessions_cpu_s(sessions), common.host_cpu()
                cpu0, pcpu0, t0 = cpu_s(), process_cpu_s(), time.time()
                (intervals,) = dask.compute(graph, scheduler=cluster.get)
                wall, cpu = time.time() - t0, cpu_s() - cpu0
                pcpu = process_cpu_s() - pcpu0
                wcpu, host1 = sessions_cpu_s(sessions) - wcpu0, common.host_cpu()
            summary = cluster.last_summary
            reached, most = busy_profile(intervals, t0, n)
            lost += len(summary.lost_workers)
            retries += summary.retries
            runs.append(Run("datavine", n, wall, waves * sleep, reached, most,
                            start_s=start_s, bundles=summary.bundles, cpu_s=cpu,
                            decision_s=spent[0], rss_mb=rss_mb(), mb_per_worker=per_worker,
                            extra={"process_cpu_s": pcpu, "load": os.getloadavg()[0],
                                   "taskvine_wait_cpu_s": waited[0],
                                   "workers_cpu_s": wcpu,
                                   "host_busy": (host1[0] - host0[0])
                                   / max(host1[1] - host0[1], 1),
                                   "rss_per_worker_mb": rss_per_worker}))
        # what the loop costs per second with one bundle in flight (housekeeping: the pool
        # sampled once a second, TaskVine's wait polling the workers): at few workers and
        # long bundles this, not the bundles, is most of the CPU per bundle
        idle = delayed(sleep_task, pure=True)(f"/bench/workers/idle-{n}.root", sleep,
                                              dask_key_name=f"idle-{n}")
        cpu0, t0 = cpu_s(), time.time()
        dask.compute(idle, scheduler=cluster.get)
        idle_rate = (cpu_s() - cpu0) / (time.time() - t0)
        connected = cluster.runtime.connected_workers()
    best = min(runs, key=lambda r: r.cpu_s / max(r.bundles, 1))
    best.extra["housekeeping_s_per_s"] = idle_rate
    best.extra["marginal_cpu_s"] = (max(0.0, best.cpu_s - idle_rate * best.wall_s)
                                    / max(best.bundles, 1))
    best.lost = lost + max(0, n - connected)
    best.note = (f"{warm} libraries warm before the clock; {retries} retries; runs: " + ", ".join(
        f"{r.wall_s:.1f} s / {1e3 * r.cpu_s / r.bundles:.1f} ms (load {r.extra['load']:.0f})"
        for r in runs) + f"; all threads {1e3 * best.extra['process_cpu_s'] / best.bundles:.2f}"
        f" ms CPU per bundle; housekeeping {1e3 * idle_rate:.2f} ms CPU per s, beyond it "
        f"{1e3 * best.extra['marginal_cpu_s']:.2f} ms per bundle; the workers' processes "
        f"{1e3 * best.extra['workers_cpu_s'] / best.bundles:.2f} ms CPU per bundle, the host's "
        f"cores busy {best.extra['host_busy']:.3f} of the run")
    best.taskvine_wait_s = best.extra["taskvine_wait_cpu_s"]
    best.extra["ratios"] = [r.concurrency_ratio for r in runs]
    return best


def run_daskvine(n: int, sleep: float, waves: int, root: Path | None = None) -> Run:
    before = mem_available_mb()
    started = time.perf_counter()
    with common.daskvine(n, 1, timeout_s=600, root=root) as manager:
        start_s = time.perf_counter() - started
        graph = make_graph(waves * n, sleep)
        get = common.daskvine_get(manager, "function-calls")
        cpu0, t0 = cpu_s(), time.time()
        # DaskVine.get takes a dict graph and keys (it fails on dask >= 2025.4 expressions)
        (intervals,) = get(dict(graph.__dask_graph__()), graph.__dask_keys__())
        wall, cpu = time.time() - t0, cpu_s() - cpu0
        reached, most = busy_profile(intervals, t0, n)
        return Run("DaskVine function-calls", n, wall, waves * sleep, reached, most,
                   start_s=start_s, bundles=waves * n + 1, cpu_s=cpu, rss_mb=rss_mb(),
                   mb_per_worker=(before - mem_available_mb()) / n,
                   lost=max(0, n - manager.stats.workers_connected),
                   note="a library per worker, started by the first call (inside the clock)")


def run_distributed(n: int, sleep: float, waves: int) -> Run:
    before = mem_available_mb()
    started = time.perf_counter()
    with common.distributed_client(n, 1) as client:
        start_s = time.perf_counter() - started
        graph = make_graph(waves * n, sleep)
        cpu0, t0 = cpu_s(), time.time()
        (intervals,) = dask.compute(graph, scheduler=client.get)
        wall, cpu = time.time() - t0, cpu_s() - cpu0
        reached, most = busy_profile(intervals, t0, n)
        alive = len(client.scheduler_info()["workers"])
        return Run("distributed", n, wall, waves * sleep, reached, most, start_s=start_s,
                   bundles=waves * n + 1, cpu_s=cpu, rss_mb=rss_mb(),
                   mb_per_worker=(before - mem_available_mb()) / n, lost=max(0, n - alive),
                   note="the scheduler runs in this process (a thread)")


def table(runs: list[Run]) -> str:
    lines = ["| peer | workers | start s | wall s | ideal s | concurrency / ideal | "
             "all busy after s | most at once | bundles | manager CPU ms per bundle | "
             "of which in TaskVine's wait | decision us per bundle | manager RSS MB | "
             "MB per worker | lost | note |",
             "|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---|"]
    for r in runs:
        busy = f"{r.all_busy_s:.2f}" if r.all_busy_s is not None else "never"
        decision = f"{1e6 * r.decision_s / r.bundles:.0f}" if r.decision_s else "-"
        in_wait = f"{1e3 * r.taskvine_wait_s / r.bundles:.2f}" if r.taskvine_wait_s else "-"
        lines.append(
            f"| {r.peer} | {r.workers} | {r.start_s:.1f} | {r.wall_s:.2f} | {r.ideal_s:.1f} | "
            f"{r.concurrency_ratio:.3f} | {busy} | {r.max_concurrency} | {r.bundles} | "
            f"{1e3 * r.cpu_s / max(r.bundles, 1):.2f} | {in_wait} | {decision} | "
            f"{r.rss_mb:.0f} | "
            f"{r.mb_per_worker:.0f} | {r.lost} | {r.note} |")
    return "\n".join(lines)


def workspaces_root(choice: str) -> Path | None:
    """The folder the clusters' folders go in for ``--workspaces`` (None: each cluster's
    default, the system's temporary folder); ``memory`` without a tmpfs says so and falls
    back to that."""
    if choice == "disk":
        return None
    root = common.memory_scratch()
    if root is None:
        print(f"# --workspaces memory: {common.MEMORY_SCRATCH} is not a writable tmpfs here; "
              "the workspaces go in the system's temporary folder", flush=True)
    return root


def fits(n: int, mb_per_worker: float, margin: float = 0.75) -> tuple[bool, str]:
    need, have = n * mb_per_worker, mem_available_mb()
    ok = need <= margin * have
    return ok, (f"{n} workers x {mb_per_worker:.0f} MB = {need:,.0f} MB against "
                f"{have:,.0f} MB available ({margin:.0%} usable)")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--counts", type=int, nargs="+", default=[8, 32, 128, 256])
    parser.add_argument("--sleep", type=float, default=10.0)
    parser.add_argument("--waves", type=int, default=3)
    parser.add_argument("--repeat", type=int, default=3,
                        help="datavine runs per count on one cluster; the best counts")
    parser.add_argument("--no-speculation", dest="speculation", action="store_false",
                        help="RunConfig(speculation=False): no backup copies (to measure "
                             "what looking for them costs the manager)")
    parser.add_argument("--daskvine-max", type=int, default=32)
    parser.add_argument("--distributed-max", type=int, default=32)
    parser.add_argument("--workspaces", choices=("memory", "disk"), default="memory",
                        help="where the clusters' folders go: a tmpfs (/dev/shm, the "
                             "default) or the system's temporary folder (see the docstring)")
    args = parser.parse_args(argv)
    common.setup()
    print(f"# {common.machine_info()}", flush=True)
    memory = workspaces_root(args.workspaces)
    where = memory or Path(tempfile.gettempdir())
    print(f"# workspaces: {where} ({common.filesystem_of(where) or 'filesystem unknown'})",
          flush=True)
    # one folder for the whole benchmark there (each peer's cluster in its own), removed at
    # the end, when every peer's manager has let go of its files
    root = Path(tempfile.mkdtemp(prefix="workers-bench-", dir=memory)) if memory else None
    try:
        return _main(args, root)
    finally:
        if root is not None:
            shutil.rmtree(root, ignore_errors=True)


def _main(args: argparse.Namespace, root: Path | None) -> int:
    runs: list[Run] = []
    mb_per_worker = 0.0
    for n in sorted(args.counts):
        if mb_per_worker:
            ok, why = fits(n, mb_per_worker)
            if not ok:
                print(f"# skipped {n} workers: {why}", flush=True)
                continue
        run = run_datavine(n, args.sleep, args.waves, args.repeat, args.speculation, root)
        mb_per_worker = max(mb_per_worker, run.extra.get("rss_per_worker_mb", run.mb_per_worker))
        runs.append(run)
        print(f"# datavine {n}: {run.wall_s:.2f} s, ratio {run.concurrency_ratio:.3f}, "
              f"{1e3 * run.cpu_s / max(run.bundles, 1):.2f} ms CPU per bundle "
              f"(load {common.machine_info().split('load=')[1].split(']')[0]}])", flush=True)
        others: tuple[tuple[str, int, Callable[[], Run]], ...] = (
            ("daskvine", args.daskvine_max,
             functools.partial(run_daskvine, n, args.sleep, args.waves, root)),
            ("distributed", args.distributed_max,
             functools.partial(run_distributed, n, args.sleep, args.waves)))
        for peer, limit, fn in others:
            if n <= limit:
                try:
                    runs.append(fn())
                except Exception as exc:  # a peer that fails is reported, not fatal
                    print(f"# {peer} {n}: failed: {type(exc).__name__}: {exc}", flush=True)
    print(table(runs))
    ours = [r for r in runs if r.peer == "datavine"]
    if not ours:
        return 1
    small, large = ours[0], ours[-1]
    per_bundle = {r.workers: r.cpu_s / max(r.bundles, 1) for r in ours}
    peers = {(r.peer, r.workers): r for r in runs if r.peer != "datavine"}
    pairs: dict[str, Any] = {
        f"concurrency_ratio_{large.workers}": round(max(large.extra["ratios"]), 3),
        "manager_cpu_per_bundle_growth": round(per_bundle[large.workers]
                                               / per_bundle[small.workers], 2),
        # the same split in two: TaskVine's wait loop, and the rest of the thread (datavine)
        "taskvine_wait_cpu_per_bundle_growth": round(
            (large.taskvine_wait_s / max(large.bundles, 1))
            / max(small.taskvine_wait_s / max(small.bundles, 1), 1e-9), 2),
        "datavine_cpu_per_bundle_growth": round(
            ((large.cpu_s - large.taskvine_wait_s) / max(large.bundles, 1))
            / max((small.cpu_s - small.taskvine_wait_s) / max(small.bundles, 1), 1e-9), 2),
        "decision_us_per_bundle": round(1e6 * large.decision_s / max(large.bundles, 1)),
        "workers_lost": sum(r.lost for r in ours), "largest": large.workers,
        "all_busy_s_largest": (round(large.all_busy_s, 2) if large.all_busy_s is not None
                               else "never"),
        "manager_rss_mb_largest": round(large.rss_mb),
        "mb_per_worker": round(statistics.median(r.mb_per_worker for r in ours)),
    }
    for r in ours:
        pairs[f"concurrency_ratio_{r.workers}"] = round(max(r.extra["ratios"]), 3)
        pairs[f"cpu_ms_per_bundle_{r.workers}"] = round(1e3 * per_bundle[r.workers], 2)
        # the loop's cost per second with nothing to do, and the CPU per bundle beyond it
        pairs[f"housekeeping_ms_per_s_{r.workers}"] = round(
            1e3 * r.extra["housekeeping_s_per_s"], 2)
        pairs[f"marginal_cpu_ms_per_bundle_{r.workers}"] = round(
            1e3 * r.extra["marginal_cpu_s"], 2)
        # what the workers' own processes took of the cores the manager shares with them
        pairs[f"workers_cpu_ms_per_bundle_{r.workers}"] = round(
            1e3 * r.extra["workers_cpu_s"] / max(r.bundles, 1), 2)
        pairs[f"host_busy_{r.workers}"] = round(r.extra["host_busy"], 3)
        for name, key in (("daskvine_fc", "DaskVine function-calls"),
                          ("distributed", "distributed")):
            peer = peers.get((key, r.workers))
            if peer is not None:
                pairs[f"{name}_concurrency_ratio_{r.workers}"] = round(
                    peer.concurrency_ratio, 3)
    print(common.kv_line(pairs))
    return 0


if __name__ == "__main__":
    sys.exit(main())
