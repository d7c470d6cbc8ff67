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
- with both libraries idle, a call goes to the worker a call just came back from (patch
  0025: that worker is looked at before any walk).
"""

from __future__ import annotations

import os
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import cloudpickle
import pytest

from datavine.manager.runtime import Runtime
from datavine.protocol import BundleResult, BundleSpec
from datavine.scheduler import graph as graphs
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


def submit(rt: Runtime, seconds: float, mark: Path) -> int:
    """A capped call that sleeps ``seconds``, then leaves ``mark``."""
    return rt.submit_bundle(payload(rt, sleep_then_mark, seconds, str(mark)), 500.0, (), None)


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


def test_a_call_goes_first_to_the_worker_whose_library_just_freed_a_slot(
        two_workers: Runtime) -> None:
    """Patch 0025: with both libraries idle, a call goes to the worker a call just came back
    from (a busy pool's one idle library), looked at before any walk. Each worker in turn:
    a call pinned to it comes back, then a free call goes there too; the walk alone would
    take its first worker both times."""
    rt, results = two_workers, Results(two_workers)
    for name in ("local-0", "local-1"):
        pinned = rt.submit_bundle(payload(rt, os.getpid), 500.0, (), None,
                                  features=[f"worker:{name}"])
        got = results.wait_for({pinned}, 30)
        assert pinned in got and got[pinned].ok and got[pinned].worker == name, got
        free = rt.submit_bundle(payload(rt, os.getpid), 500.0, (), None)
        after = results.wait_for({free}, 30)
        assert free in after and after[free].worker == name, (name, after)
