"""Fault injection into real runs: what ``tests/test_faults.py`` asserts and
``benchmarks/faults.py`` tabulates.

Each scenario starts real processes (a :class:`~datavine.LocalCluster` of ``vine_worker`` s,
the loopback XCache testbed, or a whole ``datavine run`` as a subprocess), injects one fault
a user meets at a facility (a worker SIGKILLed or frozen, a library or capped child killed, a
runaway task, a client sent SIGTERM/SIGHUP/SIGKILL, a busy port, a missing or corrupt file),
and returns a :class:`FaultResult`: whether the run recovered (a correct result, or the
right error), how long it took, and what was left behind (live processes of the sessions it
started, files in its private temporary directory). Faults are injected by PID or session,
never by process name. The worker side imports only :func:`nap` from here.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable, Hashable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Generic, TypeVar, Unpack

from datavine.deploy.sessions import (
    kill_session,
    live_processes,
    proc_stat,
    session_pids,
    signal_session,
)

if TYPE_CHECKING:
    from datavine.config import RunChanges
    from datavine.io.xcache.testbed import XCacheTestbed
    from datavine.manager.cluster import Cluster, LocalCluster

Graph = dict[Hashable, tuple[object, ...]]  # a classic dask graph: key -> (function, *args)
T = TypeVar("T")

TASKS, NAP_S, WORKERS = 30, 0.3, 3  # the workload: ~3 s of work on 3 workers
FAULT_AT_S = 1.0  # into the run
EXIT_BOUND_S = 60.0  # a client must be gone this long after its signal
CLEAN_BOUND_S = 15.0  # and what it started this long after that


@dataclass
class FaultResult:
    """One injected fault. ``recovered``: the result was correct or the expected error was
    raised; ``seconds``: wall time of the run with the fault (for clients: signal to exit);
    ``outcome``: what happened, in words; ``left``: live processes and files left behind;
    ``injected``: whether the fault struck at all (None: nothing to inject, e.g. a busy
    port); a fault that was meant to strike and did not is never counted as recovered."""

    fault: str
    recovered: bool
    seconds: float
    outcome: str
    processes_left: int = 0
    files_left: int = 0
    injected: bool | None = None

    @property
    def leftovers(self) -> int:
        return self.processes_left + self.files_left


def nap(i: int, seconds: float) -> int:
    """The workload's task (runs on workers)."""
    time.sleep(seconds)
    return i


def spin(i: int, seconds: float) -> int:
    """Task 0 never returns (a runaway); the others nap."""
    while i == 0:
        pass
    time.sleep(seconds)
    return i


def read_entries(path: str) -> int:
    """Entries of a file's ``Events`` tree, read through the run's shard map if any."""
    import datavine

    with datavine.open_input(path) as f:
        return int(f["Events"].num_entries)


def nap_graph(n: int = TASKS, seconds: float = NAP_S,
              fn: Callable[[int, float], int] = nap) -> tuple[Graph, int]:
    """``n`` tasks and their sum: (graph with output key "total", the expected total)."""
    keys = [(f"fault-{fn.__name__}", i) for i in range(n)]
    graph: Graph = {k: (fn, k[1], seconds) for k in keys}
    graph["total"] = (sum, keys)
    return graph, n * (n - 1) // 2


# --- processes -------------------------------------------------------------------------------
def live_in_sessions(sids: set[int]) -> list[int]:
    """Live (not zombie) processes whose session is one of ``sids``."""
    return [pid for pid, (_, sid) in live_processes().items() if sid in sids]


def descendants(root: int) -> set[int]:
    """Live processes below ``root`` (by parent links), ``root`` excluded."""
    children: dict[int, list[int]] = {}
    for pid, (ppid, _) in live_processes().items():
        children.setdefault(ppid, []).append(pid)
    found, todo = set(), [root]
    while todo:
        for child in children.get(todo.pop(), ()):
            if child not in found:
                found.add(child)
                todo.append(child)
    return found


def cmdline(pid: int) -> str:
    try:
        return Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode()
    except OSError:
        return ""


def library_pids(worker_pid: int) -> tuple[list[int], list[int]]:
    """(library processes, their capped children) of one local worker."""
    python = [p for p in session_pids(worker_pid)
              if "library_code.py" in cmdline(p) and not cmdline(p).startswith("sh ")]
    libraries = [p for p in python if (proc_stat(p) or (0, 0, ""))[0] not in python]
    children = [p for p in python if p not in libraries]
    return libraries, children


def wait_until(predicate: Callable[[], bool], timeout_s: float, what: str) -> None:
    deadline = time.monotonic() + timeout_s
    while not predicate():
        if time.monotonic() > deadline:
            raise TimeoutError(f"{what} did not happen within {timeout_s:.0f} s")
        time.sleep(0.05)


# --- in-process scenarios ----------------------------------------------------------------------
@contextlib.contextmanager
def private_tmp() -> Iterator[Path]:
    """A temporary directory that ``tempfile`` uses meanwhile: what a run leaves is there,
    to be counted inside the block; it is removed on the way out."""
    root = Path(tempfile.mkdtemp(prefix="datavine-faults-"))
    root.chmod(0o755)  # the testbed's servers run as the xrootd user
    before = tempfile.tempdir
    tempfile.tempdir = str(root)
    try:
        yield root
    finally:
        tempfile.tempdir = before
        shutil.rmtree(root, ignore_errors=True)


def in_cluster(name: str, inject: Callable[[LocalCluster], None] | None, *,
               expect: type[BaseException] | None = None, naming: str | None = None,
               graph: tuple[Graph, int] | None = None, workers: int = WORKERS,
               after: Callable[[LocalCluster], str] | None = None,
               **run: Unpack[RunChanges]) -> FaultResult:
    """Run the workload on a fresh LocalCluster while ``inject(cluster)`` strikes
    ``FAULT_AT_S`` into the run. Recovered: the result is right (or ``expect`` was raised,
    its message and notes containing ``naming``) and ``after`` (a check on the still-open
    cluster) passes."""
    import datavine

    dsk, total = graph or nap_graph()
    run.setdefault("no_worker_timeout_s", 30)
    run.setdefault("timeout_s", 240)
    with private_tmp() as tmp:
        sids: set[int] = set()
        outcome, ok = "", False
        strike: Strike[LocalCluster] | None = None
        t0 = time.monotonic()
        try:
            with datavine.LocalCluster(workers=workers, cores=1,
                                       run=datavine.RunConfig(**run)) as cluster:
                assert cluster.workers is not None
                sids = {p.pid for p in cluster.workers.procs}
                if inject is not None:
                    strike = Strike(inject, cluster).start()
                t0 = time.monotonic()
                try:
                    (value,) = cluster.get(dsk, ["total"])
                    ok = expect is None and value == total
                    outcome = f"result {'correct' if ok else f'WRONG: {value} != {total}'}"
                except Exception as exc:
                    if expect is None or not isinstance(exc, expect):
                        raise
                    text = "\n".join([str(exc), *getattr(exc, "__notes__", ())])
                    ok = naming is None or naming in text
                    outcome = f"{type(exc).__name__}: {str(exc).splitlines()[0]}" + (
                        "" if ok else f"; FAILED: the error does not name {naming}")
                seconds = time.monotonic() - t0
                summary = cluster.last_summary
                assert summary is not None  # every run leaves one
                outcome += f"; {summary.retries} retries"
                if after is not None:
                    note = after(cluster)
                    ok = ok and not note.startswith("FAILED")
                    outcome += f"; {note}"
        except Exception as exc:
            seconds = time.monotonic() - t0
            ok, outcome = False, f"{type(exc).__name__}: {str(exc).splitlines()[0][:200]}"
        if strike is not None:
            strike.cancel()
            ok, outcome = strike.verdict(ok, outcome)
        wait_until_quiet(sids)
        files = sum(1 for _ in tmp.rglob("*"))
    return FaultResult(name, ok, seconds, outcome, len(live_in_sessions(sids)), files,
                       injected=strike.injected if strike is not None else None)


class FaultNotInjected(Exception):
    """The fault's target was not there: nothing was injected, so nothing was shown."""


class Strike(Generic[T]):
    """Runs ``inject(target)`` once ``FAULT_AT_S`` into a run and remembers whether it struck:
    ``injected`` is True once it returned, False if it raised or never ran."""

    def __init__(self, inject: Callable[[T], object], target: T) -> None:
        self.injected = False
        self.why = "the run ended before the fault was due"
        self._timer = threading.Timer(FAULT_AT_S, self._strike, (inject, target))
        self._timer.daemon = True

    def _strike(self, inject: Callable[[T], object], target: T) -> None:
        try:
            inject(target)
            self.injected = True
        except Exception as exc:  # a timer thread must not raise: reported in the result
            self.why = f"{type(exc).__name__}: {exc}"

    def start(self) -> Strike[T]:
        self._timer.start()
        return self

    def cancel(self) -> None:
        self._timer.cancel()

    def verdict(self, ok: bool, outcome: str) -> tuple[bool, str]:
        """``ok`` only if the fault struck; the outcome says when it did not."""
        if self.injected:
            return ok, outcome
        return False, f"FAULT NOT INJECTED ({self.why}); {outcome}"


def wait_until_quiet(sids: set[int], timeout_s: float = CLEAN_BOUND_S) -> None:
    with contextlib.suppress(TimeoutError):
        wait_until(lambda: not live_in_sessions(sids), timeout_s, "cleanup")


def _worker0(cluster: LocalCluster) -> int:
    assert cluster.workers is not None  # started
    return int(cluster.workers.procs[0].pid)


def kill_worker_alone(cluster: LocalCluster) -> None:
    os.kill(_worker0(cluster), signal.SIGKILL)  # its transfer server and library live on


def kill_worker_session(cluster: LocalCluster) -> None:
    kill_session(_worker0(cluster))


def freeze_worker(cluster: LocalCluster) -> None:
    signal_session(_worker0(cluster), signal.SIGSTOP)  # a node that stops answering


def kill_library(cluster: LocalCluster) -> None:
    libraries, _ = library_pids(_worker0(cluster))
    if not libraries:
        raise FaultNotInjected("no library process under worker 0")
    for pid in libraries:
        os.kill(pid, signal.SIGKILL)


def kill_capped_child(cluster: LocalCluster) -> None:
    _, children = library_pids(_worker0(cluster))
    if not children:
        raise FaultNotInjected("no capped child under worker 0's library")
    for pid in children:
        os.kill(pid, signal.SIGKILL)  # what the kernel's OOM killer does


def next_run_check(cluster: Cluster) -> str:
    """After a failed run: does a trivial run on the same cluster answer at once?"""
    t0 = time.monotonic()
    (value,) = cluster.get({"after": (nap, 7, 0.0)}, ["after"])
    took = time.monotonic() - t0
    return (f"next run {took:.1f} s" if value == 7 and took < 20 else
            f"FAILED: next run took {took:.1f} s")


def busy_port() -> FaultResult:
    import datavine
    from datavine.errors import ManagerStartError

    with socket.socket() as held, private_tmp() as tmp:
        held.bind(("", 0))
        held.listen()
        port = held.getsockname()[1]
        t0 = time.monotonic()
        try:
            with datavine.LocalCluster(workers=1, manager=datavine.ManagerConfig(
                    port=port, run_dir=tmp / "run")):
                ok, outcome = False, "started on a busy port"
        except ManagerStartError as exc:
            message = str(exc)
            ok = f"port {port}" in message and "\n" not in message
            outcome = f"ManagerStartError: {message[:90]}"
        files = sum(1 for _ in (tmp / "run" / "workers").rglob("*")) if ok else 0
        return FaultResult("busy port", ok, time.monotonic() - t0, outcome, 0, files)


def bad_file(kind: str, directory: Path) -> FaultResult:
    """A task reads a missing or a corrupt file: the error names it and is not retried."""
    path = directory / f"{kind}.root"
    if kind == "corrupt":
        path.write_bytes(b"root\0" + os.urandom(4096))
    graph: tuple[Graph, int] = ({"total": (read_entries, str(path))}, -1)
    expect = FileNotFoundError if kind == "missing" else Exception

    def named(cluster: Cluster) -> str:
        summary = cluster.last_summary
        assert summary is not None  # every run leaves one
        return ("not retried" if summary.retries == 0 else
                f"FAILED: retried {summary.retries} times")

    return in_cluster(f"{kind} file", None, expect=expect, naming=str(path), graph=graph,
                      workers=1, after=named)


# --- client processes -------------------------------------------------------------------------
def client_signal(name: str, sig: int, command: list[str], ready_sessions: int, *,
                  env: dict[str, str] | None = None,
                  before: Callable[[set[int]], None] | None = None) -> FaultResult:
    """Start ``command``; once its descendants span ``ready_sessions`` sessions (workers,
    servers, its reaper), call ``before(sessions)`` (another fault first), send ``sig``;
    measure the time to exit and what is left after."""
    with private_tmp() as tmp:
        proc = subprocess.Popen(command, env={**os.environ, **(env or {}), "TMPDIR": str(tmp)},
                                stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
        seen: set[int] = set()
        injected = False

        def sessions() -> set[int]:
            for pid in descendants(proc.pid):
                seen.add(pid)
            return {s for p in seen if (info := proc_stat(p)) and (s := info[1]) != proc.pid and
                    s != os.getsid(0)}

        try:
            wait_until(lambda: len(sessions()) >= ready_sessions or proc.poll() is not None,
                       120, "the client's workers")
            time.sleep(FAULT_AT_S)
            sids = sessions()
            if before is not None:
                before(sids)
                time.sleep(FAULT_AT_S)
            t0 = time.monotonic()
            injected = proc.poll() is None  # a client that already ended was not signalled
            proc.send_signal(sig)
            try:
                proc.wait(timeout=EXIT_BOUND_S)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()
            exit_s = time.monotonic() - t0
            with contextlib.suppress(TimeoutError):  # what it started: gone on its own?
                wait_until(lambda: not live_in_sessions(sids) and not any(tmp.iterdir()),
                           CLEAN_BOUND_S, "cleanup")
            seconds = time.monotonic() - t0
        finally:
            if proc.poll() is None:
                proc.kill()
        left = live_in_sessions(sids)
        files = list(tmp.rglob("*"))
        err = (proc.stderr.read().decode(errors="replace").strip().splitlines()
               if proc.stderr else [])
        proc.stderr and proc.stderr.close()
        for pid in left:  # the test must not leave them either
            with contextlib.suppress(OSError):
                os.kill(pid, signal.SIGKILL)
    expected = (128 + sig, -sig)  # its own exit code, or death by the signal itself
    ok = (injected and proc.returncode in expected and not left and not files
          and len(sids) >= ready_sessions)
    outcome = (f"exit {proc.returncode} after {exit_s:.1f} s, all gone after {seconds:.1f} s"
               + (f"; {err[-1][:80]}" if err else ""))
    if files:
        outcome += f"; left {', '.join(sorted({str(f.relative_to(tmp).parts[0]) for f in files}))}"
    if not injected:
        outcome = f"FAULT NOT INJECTED (the client ended before its signal); {outcome}"
    return FaultResult(name, ok, seconds, outcome, len(left), len(files), injected=injected)


def freeze_one_worker(sessions: set[int]) -> None:
    """SIGSTOP the session of one of the client's workers (its reaper's is left alone)."""
    workers = sorted(s for s in sessions if "vine_worker" in cmdline(s))
    signal_session(workers[0], signal.SIGSTOP)


def cluster_client_command(workers: int = 2) -> list[str]:
    """A user script holding a LocalCluster through a long run (sessions: workers + reaper)."""
    return [sys.executable, "-m", "datavine.apps.faults", "client", str(workers)]


def datavine_run_command(data: Path, workers: int = 2, shards: int = 2) -> list[str]:
    """``datavine run`` on the loopback XCache (sessions: origin, shards, workers, reaper)."""
    return [sys.executable, "-c",
            "import sys; from datavine.apps.cli import main; sys.exit(main())",
            "run", "--data", str(data), "--files", "4", "--events", "50000",
            "--chunk-events", "5000", "--workers", str(workers), "--shards", str(shards),
            "--no-progress"]


def read_and_nap(path: str, seconds: float) -> int:
    entries = read_entries(path)
    time.sleep(seconds)
    return entries


def shard_stopped(testbed: XCacheTestbed, lfns: list[str], expected: int) -> FaultResult:
    """Tasks read files through the testbed's shards; the busiest shard is stopped mid-run
    (and started again after). Recovered: the right total, reads failed over."""
    from collections import Counter

    smap = testbed.shard_map()
    urls = [f"{testbed.origin_url}/{lfn}" for lfn in lfns]
    victim = Counter(smap.shard_for(u).name for u in urls).most_common(1)[0][0]
    index = next(s.index for s in testbed.shards if s.name == victim)
    graph: Graph = {("fault-read", i): (read_and_nap, u, NAP_S * 3)
                    for i, u in enumerate(urls)}
    graph["total"] = (sum, list(graph))

    def stop(cluster: Cluster) -> None:
        testbed.stop_shard(index)

    def failed_over(cluster: Cluster) -> str:
        testbed.start_shard(index)
        summary = cluster.last_summary
        assert summary is not None  # every run leaves one
        reads = summary.reads
        return (f"{reads.failovers} failovers" if reads.failovers else
                "FAILED: no read failed over")

    return in_cluster(f"XCache shard {victim} stopped", stop, graph=(graph, expected),
                      after=failed_over, shardmap=smap)


def _client(workers: int) -> None:
    import datavine

    with datavine.LocalCluster(workers=workers, cores=1,
                               run=datavine.RunConfig(memory=None)) as cluster:
        graph, _ = nap_graph(200, 1.0)
        cluster.get(graph, ["total"])


if __name__ == "__main__" and sys.argv[1:2] == ["client"]:
    _client(int(sys.argv[2]))


def condor_worker_removed(password_file: Path, pool_dir: Path | None = None) -> FaultResult:
    """Three workers as HTCondor jobs (vine_factory, the personal pool); one job is removed
    with ``condor_rm`` mid-run, as a preempted batch slot would be. Recovered: the right
    total, and no job of the pool left once it is stopped."""
    import datavine
    from datavine.deploy.pools import CondorPool, FactoryConfig
    from datavine.deploy.pools.condor import condor_exec
    from datavine.deploy.pools.state import default_pool_dir

    name = f"faults-{os.getpid()}"
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    cfg = FactoryConfig("127.0.0.1", port, workers=3, min_workers=3, password_file=password_file,
                        idle_timeout_s=120, factory_period_s=1)
    pool = CondorPool(cfg, name=name, pool_dir=pool_dir or default_pool_dir())
    constraint = pool.constraint
    dsk, total = nap_graph()
    ok, outcome, seconds = False, "", 0.0
    with private_tmp() as tmp:
        manager = datavine.ManagerConfig(port=port, password_file=password_file,
                                         run_dir=tmp / "manager")

        def remove_one(cluster: Cluster) -> None:
            jobs = condor_exec("condor_q", "-allusers", "-constraint", constraint, "-af",
                               "ClusterId", "ProcId").stdout.split("\n")
            cluster_id, proc_id = jobs[0].split()
            condor_exec("condor_rm", f"{cluster_id}.{proc_id}")

        strike: Strike[Cluster] | None = None
        try:
            with pool, datavine.Cluster(manager, datavine.RunConfig(no_worker_timeout_s=60,
                                                                    timeout_s=240),
                                        min_workers=3, connect_timeout_s=120) as cluster:
                strike = Strike(remove_one, cluster).start()
                t0 = time.monotonic()
                (value,) = cluster.get(dsk, ["total"])
                seconds = time.monotonic() - t0
                ok = value == total
                summary = cluster.last_summary
                assert summary is not None  # every run leaves one
                outcome = f"result {'correct' if ok else 'WRONG'}; {summary.retries} retries"
        except Exception as exc:
            outcome = f"{type(exc).__name__}: {str(exc).splitlines()[0][:200]}"
        if strike is not None:
            strike.cancel()
            ok, outcome = strike.verdict(ok, outcome)
        left = condor_exec("condor_q", "-allusers", "-constraint", constraint, "-af",
                           "ClusterId").stdout.split()
    return FaultResult("HTCondor worker job removed", ok and not left, seconds, outcome,
                       len(left), 0, injected=strike.injected if strike is not None else False)
