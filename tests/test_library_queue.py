"""The library's queue of calls (TaskVine patch 0015), on a real manager and worker.

datavine's library runs in TaskVine's 'direct' mode with ``RunConfig.bundles_per_slot``
function slots per instance: one call runs, the next waits in the library's pipe and starts
as it ends, with no round trip to the manager in between. These tests check the mechanism,
not its speed:

- two calls on a one-core worker are both taken by the worker at once (stock TaskVine gave a
  direct library one slot: the second waited at the manager);
- a call cancelled while it waits behind another is skipped: the library lives on (same
  PID), the call never runs, and the slot it held comes back for later calls;
- a running capped call that is cancelled is stopped (its capped child is killed), and the
  library serves the next call;
- on two one-core workers, a call sent while the other worker runs one goes to the idle
  worker, not behind the running call (patch 0020: the library with the most free slots);
- a call that finds every slot taken waits at the manager and goes to the first slot that
  frees; a call for a named worker goes there, waits while that worker is full although
  another is idle, and a call for a worker that does not exist goes nowhere (patch 0027:
  the workers that may have a free slot, and the workers by feature, instead of a walk); a
  task for the feature of a worker that left waits for the next worker with it;
- a worker told to drain is released once its calls end (patch 0027: the look for drained
  workers only while one is draining).
"""

from __future__ import annotations

import os
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import cloudpickle
import pytest

from datavine.deploy.sessions import stop_session
from datavine.manager.runtime import Runtime
from datavine.protocol import BundleResult, BundleSpec
from datavine.scheduler import graph as graphs
from tests.bare_manager import manager_with_workers, one_core_worker, until
from tests.conftest import started_library


def sleep_then_mark(seconds: float, mark: str) -> int:
    """Sleep, then leave a mark file (which proves the call ran); returns this PID."""
    time.sleep(seconds)
    Path(mark).write_text("ran")
    return os.getpid()


def payload(rt: Runtime, fn: Callable[..., object], *args: object) -> bytes:
    """A bundle of one task, ``fn(*args)``; this module's functions travel by value."""
    cloudpickle.register_pickle_by_value(sys.modules[__name__])
    graph = graphs.build({"x": (fn, *args)}, ["x"])
    spec = BundleSpec(nodes=[("x", graph.nodes["x"])], outputs=["x"], inline_max=1 << 20)
    return rt.dumps(spec.encode())


class Results:
    """Turns the manager's loop and keeps what comes back (a call's encoded result)."""

    def __init__(self, rt: Runtime) -> None:
        self.rt = rt
        self.got: dict[int, BundleResult] = {}

    def turn(self) -> None:
        done = self.rt.wait(1)  # TaskVine's wait does nothing with 0
        if done is not None and done.result is not None:
            self.got[done.id] = BundleResult.decode(done.result)

    def until(self, check: Callable[[], bool], timeout_s: float) -> bool:
        deadline = time.monotonic() + timeout_s
        while not check() and time.monotonic() < deadline:
            self.turn()
        return check()

    def wait_for(self, calls: set[int], timeout_s: float) -> dict[int, BundleResult]:
        """The results of ``calls`` that came back within ``timeout_s``."""
        self.until(lambda: not calls - self.got.keys(), timeout_s)
        return {c: self.got[c] for c in calls if c in self.got}


def pinned(rt: Runtime, seconds: float, mark: Path, worker: str | None) -> int:
    """A capped call that sleeps ``seconds`` on ``worker`` (None: anywhere)."""
    return rt.submit_bundle(payload(rt, sleep_then_mark, seconds, str(mark)), 500.0, (), None,
                            features=[f"worker:{worker}"] if worker else ())


def submit(rt: Runtime, seconds: float, mark: Path) -> int:
    """A capped call that sleeps ``seconds``, then leaves ``mark``."""
    return pinned(rt, seconds, mark, None)


def one_behind_another(rt: Runtime, results: Results, tmp_path: Path,
                       seconds: float) -> tuple[int, int]:
    """A call that runs ``seconds`` (mark ``first``) and one sent after it started, which
    waits behind it in the library's pipe (mark ``queued``)."""
    first = submit(rt, seconds, tmp_path / "first")
    assert results.until(lambda: rt.call_state(first) == "RUNNING", 20)
    queued = submit(rt, 0.0, tmp_path / "queued")
    both_sent = results.until(lambda: rt.call_state(queued) == "RUNNING", 20)
    assert both_sent, (f"the worker took {rt.call_state(first)}/{rt.call_state(queued)}: the "
                       "library's second slot (patch 0015) is missing")
    return first, queued


@pytest.fixture
def results(one_core: Runtime) -> Results:
    return Results(one_core)


def test_two_calls_on_a_one_core_worker_are_both_at_the_worker(
        one_core: Runtime, results: Results, tmp_path: Path) -> None:
    rt = one_core
    first, second = one_behind_another(rt, results, tmp_path, 3.0)
    assert rt.call_state(first) == "RUNNING"
    got = results.wait_for({first, second}, 30)
    assert len(got) == 2 and all(r.ok for r in got.values())


def test_a_call_cancelled_in_the_queue_is_skipped_and_frees_its_slot(
        one_core: Runtime, results: Results, tmp_path: Path) -> None:
    rt = one_core
    first, queued = one_behind_another(rt, results, tmp_path, 3.0)
    rt.cancel(queued)  # it waits in the library's pipe behind ``first``
    got = results.wait_for({first}, 30)
    assert got[first].ok
    pid = got[first].pid
    # the slot the cancelled call held comes back: two more calls both run, in that library
    later = {submit(rt, 0.0, tmp_path / f"later-{i}") for i in range(2)}
    after = results.wait_for(later, 30)
    assert len(after) == 2, "a call waited for a slot the cancelled call never gave back"
    assert {r.pid for r in after.values()} == {pid}, "the library died and was restarted"
    assert not (tmp_path / "queued").exists(), "the cancelled call ran"


def test_a_running_capped_call_that_is_cancelled_is_stopped(
        one_core: Runtime, results: Results, tmp_path: Path) -> None:
    rt = one_core
    warm = results.wait_for({rt.submit_bundle(payload(rt, os.getpid), 500.0, (), None)}, 30)
    (library,) = {r.pid for r in warm.values()}
    long = submit(rt, 60.0, tmp_path / "long")
    assert results.until(lambda: rt.call_state(long) == "RUNNING", 20)
    time.sleep(0.5)  # it runs in the library's capped child now
    rt.cancel(long)
    after = submit(rt, 0.0, tmp_path / "after")
    got = results.wait_for({after}, 30)  # far less than the 60 s the cancelled call sleeps
    assert after in got and got[after].ok, "the next call waited for a cancelled one"
    assert got[after].pid == library, "the library died and was restarted"
    assert not (tmp_path / "long").exists()


def test_the_project_build_queues_calls_and_the_library_asks_for_its_slots() -> None:
    """The library's slots follow RunConfig.bundles_per_slot only where the TaskVine in use
    takes them (patch 0015); a stock library would die at its start."""
    from datavine.manager.taskvine_port import library_queues_calls

    assert library_queues_calls()


def thread_pools_here() -> tuple[object, list[int]]:
    """In the library: how often it has looked for its loaded libraries' thread pools (patch
    0030's count; None without the patch) and the BLAS pools' thread counts in this call."""
    import numpy  # noqa: F401  # a BLAS pool to limit
    import threadpoolctl

    library = sys.modules["__main__"]
    blas = {pool["num_threads"] for pool in threadpoolctl.threadpool_info()
            if pool["user_api"] == "blas"}
    return getattr(library, "thread_pool_scans", None), sorted(blas)


def test_the_library_finds_thread_pools_once_and_limits_every_call(
        one_core: Runtime, results: Results) -> None:
    """Patch 0030: the library looked for the thread pools of its loaded libraries at every
    call (~0.55 ms with numpy loaded); now once, and again only after it imported modules.
    Each call still runs with them limited to the library's thread limit (1: one core, two
    slots)."""
    rt = one_core
    seen = []
    for _ in range(5):  # one after another, uncapped: they run in the library's process
        call = rt.submit_bundle(payload(rt, thread_pools_here), None, (), None)
        got = results.wait_for({call}, 30)
        assert call in got and got[call].ok, f"the call came back as {got}"
        seen.append(cloudpickle.loads(got[call].values["x"]))
    scans = [count for count, _ in seen]
    assert None not in scans, "the library lacks patch 0030 (no thread_pool_scans)"
    assert len(set(scans[2:])) == 1, f"the library looked for the pools again: {scans}"
    assert all(blas == [1] for _, blas in seen), f"a call's BLAS pool was not limited: {seen}"


def test_a_call_queued_behind_a_cancelled_one_runs_and_answers(
        one_core: Runtime, results: Results, tmp_path: Path) -> None:
    rt = one_core
    long, queued = one_behind_another(rt, results, tmp_path, 60.0)
    time.sleep(0.5)
    rt.cancel(long)  # it runs; ``queued`` waits behind it in the library's pipe
    got = results.wait_for({queued}, 30)
    assert queued in got and got[queued].ok, f"the queued call came back as {got}"
    assert (tmp_path / "queued").exists() and not (tmp_path / "first").exists()


@pytest.fixture
def two_workers(tmp_path: Path) -> Iterator[Runtime]:
    """Two one-core workers, each with its library started (a call has run on each)."""
    with started_library(tmp_path, 2) as rt:
        yield rt


def test_a_call_goes_to_the_idle_worker_not_behind_a_running_one(
        two_workers: Runtime, tmp_path: Path) -> None:
    rt, results = two_workers, Results(two_workers)
    for round_ in range(3):  # the same order each time: the walk's first worker is fixed
        first = submit(rt, 3.0, tmp_path / f"first-{round_}")
        assert results.until(lambda first=first: rt.call_state(first) == "RUNNING", 30)
        second = submit(rt, 0.0, tmp_path / f"second-{round_}")
        got = results.wait_for({second}, 30)
        assert second in got and got[second].ok
        assert rt.call_state(first) == "RUNNING", (
            "the second call ended after the first: it waited behind it in one library "
            "while the other worker was idle (patch 0020)")
        done = results.wait_for({first}, 30)
        assert done[first].pid != got[second].pid, "both calls ran in the same library"


def test_a_call_waits_for_a_slot_and_takes_the_first_that_frees(
        two_workers: Runtime, tmp_path: Path) -> None:
    """Patch 0027: every slot taken (two per one-core worker), a call waits at the manager;
    when a slot on local-0 frees it goes there, and comes back while local-1's calls still
    run. A call for local-1 waits for local-1 although local-0 is idle by then; a call for a
    worker that does not exist stays waiting."""
    rt, results = two_workers, Results(two_workers)
    short = {pinned(rt, 3.0, tmp_path / f"short-{i}", "local-0") for i in range(2)}
    long = {pinned(rt, 30.0, tmp_path / f"long-{i}", "local-1") for i in range(2)}
    assert results.until(lambda: all(rt.call_state(c) == "RUNNING" for c in short | long), 30)
    waiting = pinned(rt, 0.0, tmp_path / "waiting", None)
    for_busy = pinned(rt, 0.0, tmp_path / "for-busy", "local-1")
    nowhere = pinned(rt, 0.0, tmp_path / "nowhere", "no-such-worker")
    results.turn()
    assert rt.call_state(waiting) == "READY", "a call was sent to a library with no free slot"
    got = results.wait_for(short | {waiting}, 30)
    assert waiting in got and got[waiting].ok and got[waiting].worker == "local-0", got
    assert all(rt.call_state(c) == "RUNNING" for c in long)
    results.turn()
    assert rt.call_state(for_busy) == "READY", "a call for local-1 was sent elsewhere"
    assert rt.call_state(nowhere) == "READY", "a call for no existing worker was sent"
    for call in (*long, for_busy, nowhere):
        rt.cancel(call)


def test_a_task_for_a_worker_that_left_waits_for_one_with_its_feature(tmp_path: Path) -> None:
    """Patch 0027's index of the workers by feature follows workers that leave and join: a
    task for the feature of a worker that left stays waiting (not sent, no crash), and runs
    on the next worker that has the feature."""
    with manager_with_workers(tmp_path, 1, features=("site:b",)) as rt:
        manager, vine = rt.manager, rt.taskvine.vine
        leaving = one_core_worker(rt, tmp_path / "first", "--feature", "site:a")
        assert until(lambda: manager.wait(1) is None and rt.connected_workers() == 2, 30)
        stop_session(leaving.pid)
        leaving.wait(timeout=10)
        assert until(lambda: manager.wait(1) is None and rt.connected_workers() == 1, 30)
        task = vine.Task("true")
        task.set_cores(1)
        task.add_feature("site:a")
        manager.submit(task)
        for _ in range(3):
            assert manager.wait(1) is None, "a task for a worker that left ran elsewhere"
        newcomer = one_core_worker(rt, tmp_path / "again", "--feature", "site:a")
        try:
            done = manager.wait(30)
            assert done is not None and done.successful(), "the new site:a worker never took it"
            assert "site:a" in str([w.get("features") for w in manager.status("workers") or ()])
        finally:
            stop_session(newcomer.pid)
            newcomer.wait(timeout=10)


def test_a_worker_told_to_drain_is_released_when_its_tasks_end(tmp_path: Path) -> None:
    """Patch 0027 looks for drained workers only while one drains: both workers (one host)
    told to drain while a task runs are released once it has come back. (A worker running
    a library never drains: the library is a task it runs, in stock TaskVine too.)"""
    with manager_with_workers(tmp_path, 2) as rt:
        manager, vine = rt.manager, rt.taskvine.vine
        task = vine.Task("sleep 2")
        task.set_cores(1)
        manager.submit(task)
        assert until(lambda: manager.wait(1) is None and manager.stats.tasks_running == 1, 30)
        assert manager.set_draining_by_hostname(os.uname().nodename, True) == 2
        done = manager.wait(30)
        assert done is not None and done.successful(), "the task on a draining worker failed"
        assert until(lambda: manager.wait(1) is None and manager.stats.workers_connected == 0,
                     30), (
            f"{manager.stats.workers_connected} drained workers were never released")
