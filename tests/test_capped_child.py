"""``capped_child``: one long-lived child, real allocations, real kills, real signals.

Caps are set above the child's own RSS (it starts as a fork of this test process), so
"``cap`` MB over the idle child" is what a call may add before it is killed.
"""

from __future__ import annotations

import ctypes
import os
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import psutil
import pytest
from hypothesis import given
from hypothesis import strategies as st

from datavine.worker.capped_child import (
    QUEUED_AHEAD,
    QUEUED_MAX_BYTES,
    CappedChild,
    needs_fresh_child,
)
from datavine.worker.memcap import ChildFailedError

MB = 2**20


def allocate(mb: int, hold_s: float = 0.0, held: str | None = None) -> int:
    """Touch ``mb`` MB and hold them ``hold_s`` s; then write the file ``held`` (if named):
    a call killed while it held the memory never writes it."""
    block = np.ones(mb * MB // 8)  # ones, not zeros: every page is touched
    time.sleep(hold_s)
    if held is not None:
        Path(held).touch()
    return int(block.sum()) * 8 // MB


def keep(mb: int) -> int:
    """Leak ``mb`` MB in the calling process: how many blocks it now holds. (Held on ``sys``:
    a function of a test module may travel by value, with globals of its own.)"""
    kept = sys.__dict__.setdefault("_capped_child_test_kept", [])
    kept.append(np.ones(mb * MB // 8))
    return len(kept)


def drop_kept(mb: float) -> float:
    """A ``make_room`` that drops what :func:`keep` leaked; returns the MB it was asked for."""
    sys.__dict__.setdefault("_capped_child_test_kept", []).clear()
    return mb


def keep_all(mb: float) -> float:
    """A ``make_room`` that hands nothing back."""
    return mb


def whoami() -> tuple[int, int]:
    return os.getpid(), os.getppid()


def leave_a_process_behind() -> int:
    return subprocess.Popen(["sleep", "60"]).pid


@pytest.fixture
def child() -> Iterator[CappedChild]:
    # Caps here sit 100-1000 MB above the idle child, whose RSS (a fork of pytest) may
    # exceed 100 MB: a high recycle_fraction keeps the default rule out of these tests.
    with CappedChild(recycle_fraction=0.95) as c:
        yield c
    assert c.pid is None


def idle_mb(child: CappedChild) -> float:
    """The child's resident MB between calls (starting one first)."""
    child.run(int, cap_mb=None)
    assert child.pid is not None
    return psutil.Process(child.pid).memory_info().rss / MB


def test_calls_run_one_after_another_in_the_same_child(child: CappedChild) -> None:
    results = [child.run(whoami, cap_mb=idle_mb(child) + 200) for _ in range(20)]
    assert all(r.ok and not r.exceeded for r in results)
    pids = {r.value for r in results}
    assert pids == {(child.pid, os.getpid())}  # one child, forked by this process
    assert child.started == 1


def test_a_call_over_its_cap_is_killed_and_the_next_call_gets_a_new_child(
        child: CappedChild, tmp_path: Path) -> None:
    cap = idle_mb(child) + 100
    first_pid = child.pid
    held = tmp_path / "held"
    over = child.run(allocate, (300, 5.0, str(held)), cap_mb=cap)
    assert over.exceeded and not over.ok and over.value is None
    assert isinstance(over.error, ChildFailedError) and "memory cap" in str(over.error)
    assert over.peak_mb >= cap and over.cap_mb == cap and over.signal == signal.SIGKILL
    assert not held.exists()  # killed while it held the memory, not after its 5 s
    assert first_pid is not None and not psutil.pid_exists(first_pid)
    assert child.pid is None and child.started == 1
    fits = child.run(allocate, (50,), cap_mb=cap)
    assert fits.ok and fits.value == 50 and child.pid not in (None, first_pid)
    assert child.started == 2


def test_a_call_whose_sandbox_is_removed_is_stopped_and_the_next_gets_a_new_child(
        child: CappedChild, tmp_path: Path) -> None:
    """The worker removes a cancelled call's sandbox: the call is stopped there."""
    sandbox = tmp_path / "func.7"
    sandbox.mkdir()
    child.run(int, cap_mb=None)
    first_pid = child.pid
    timer = threading.Timer(0.3, sandbox.rmdir)
    timer.start()
    stopped = child.run(time.sleep, (60.0,), cap_mb=None, sandbox=str(sandbox))
    timer.join()
    assert stopped.cancelled and not stopped.ok and "cancelled" in str(stopped.error)
    assert first_pid is not None and not psutil.pid_exists(first_pid)
    after = child.run(whoami, cap_mb=None, sandbox=str(tmp_path))
    assert after.ok and not after.cancelled and child.started == 2


def test_each_call_reports_its_own_peak_not_an_earlier_calls(child: CappedChild) -> None:
    cap = idle_mb(child) + 1000
    big = child.run(allocate, (400,), cap_mb=cap)
    small = child.run(allocate, (10,), cap_mb=cap)
    assert big.ok and small.ok and child.started == 1
    assert big.peak_mb >= big.baseline_mb + 380  # the call's 400 MB, even between two polls
    assert small.peak_mb < big.peak_mb - 300  # the peak mark was reset between the calls


def test_exceptions_come_back_with_their_traceback_and_the_child_stays(
        child: CappedChild) -> None:
    cap = idle_mb(child) + 200
    pid = child.pid
    result = child.run(int, ("not a number",), cap_mb=cap)
    assert not result.ok and isinstance(result.error, ValueError)
    assert result.traceback is not None and "ValueError" in result.traceback
    assert child.pid == pid  # an exception is the call's business: the child serves on


def test_a_crash_is_reported_and_the_next_call_runs(child: CappedChild) -> None:
    cap = idle_mb(child) + 200
    crashed = child.run(ctypes.string_at, (0,), cap_mb=cap)
    assert not crashed.ok and crashed.signal == signal.SIGSEGV
    assert "SIGSEGV" in str(crashed.error)
    assert child.run(whoami, cap_mb=cap).ok and child.started == 2


def test_processes_left_behind_are_killed_and_the_child_replaced(child: CappedChild) -> None:
    cap = idle_mb(child) + 200
    result = child.run(leave_a_process_behind, cap_mb=cap)
    assert result.ok
    assert child.pid is None  # replaced before the next call
    deadline = time.monotonic() + 5
    while psutil.pid_exists(result.value) and time.monotonic() < deadline:
        if psutil.Process(result.value).status() == psutil.STATUS_ZOMBIE:
            break
        time.sleep(0.05)
    assert (not psutil.pid_exists(result.value)
            or psutil.Process(result.value).status() == psutil.STATUS_ZOMBIE)


def test_a_child_idling_above_recycle_fraction_of_its_next_cap_is_replaced() -> None:
    with CappedChild(recycle_fraction=0.5) as child:
        base = idle_mb(child)
        assert child.run(keep, (300,), cap_mb=base + 1000).value == 1  # idles at ~base + 300
        first_pid = child.pid
        again = child.run(keep, (10,), cap_mb=(base + 300) * 1.5)  # 0.5 x cap < base + 300
        assert again.ok and again.value == 1  # a new child: it does not hold the first 300 MB
        assert child.pid != first_pid and child.started == 2
        assert again.baseline_mb < base + 100


def test_a_child_that_makes_room_for_a_lower_cap_is_kept() -> None:
    with CappedChild(recycle_fraction=0.5, make_room=drop_kept) as child:
        base = idle_mb(child)
        assert child.run(keep, (300,), cap_mb=base + 1000).value == 1  # idles at ~base + 300
        first_pid = child.pid
        again = child.run(keep, (10,), cap_mb=(base + 300) * 1.5)  # 0.5 x cap < base + 300
        assert again.ok and again.value == 1  # the 300 MB were handed back, in the same child
        assert child.pid == first_pid and child.started == 1 and child.rooms_made == 1
        assert again.baseline_mb < base + 100
        assert child.run(whoami, cap_mb=(base + 300) * 1.5).value[0] == first_pid


def test_a_child_that_cannot_make_room_is_replaced() -> None:
    with CappedChild(recycle_fraction=0.5, make_room=keep_all) as child:
        base = idle_mb(child)
        assert child.run(keep, (300,), cap_mb=base + 1000).value == 1
        first_pid = child.pid
        again = child.run(keep, (10,), cap_mb=(base + 300) * 1.5)
        assert again.ok and again.value == 1  # a new child: it does not hold the first 300 MB
        assert child.pid != first_pid and child.started == 2 and child.rooms_made == 0


def test_a_child_that_fails_to_make_room_is_replaced_and_the_call_runs() -> None:
    with CappedChild(recycle_fraction=0.5, make_room=chr) as child:  # chr(float) raises
        base = idle_mb(child)
        child.run(keep, (300,), cap_mb=base + 1000)
        first_pid = child.pid
        again = child.run(whoami, cap_mb=(base + 300) * 1.5)
        assert again.ok and again.value[0] == child.pid != first_pid and child.started == 2


def test_a_child_that_died_between_calls_costs_no_call(child: CappedChild) -> None:
    cap = idle_mb(child) + 200
    assert child.pid is not None
    os.kill(child.pid, signal.SIGKILL)
    time.sleep(0.1)
    result = child.run(whoami, cap_mb=cap)
    assert result.ok and result.value[0] == child.pid and child.started == 2


def test_close_leaves_no_process() -> None:
    c = CappedChild()
    c.run(whoami, cap_mb=None)
    pid = c.pid
    c.close()
    assert pid is not None and not psutil.pid_exists(pid)


@given(alive=st.booleans(), idle=st.floats(0, 1e5), cap=st.none() | st.floats(1, 1e5),
       fraction=st.floats(0.1, 1.0))
def test_needs_fresh_child(alive: bool, idle: float, cap: float | None,
                           fraction: float) -> None:
    fresh = needs_fresh_child(alive, idle, cap, fraction)
    if not alive:
        assert fresh
    elif cap is None:
        assert not fresh  # nothing to protect
    else:
        assert fresh == (idle > fraction * cap)


# --- a queued call sent to the child ahead of its run --------------------------------------------
def started_at(seconds: float = 0.0) -> float:
    """When the call started here (this host's clock), after sleeping ``seconds``."""
    began = time.time()
    time.sleep(seconds)
    return began


def folder(tmp_path: Path, name: str) -> str:
    path = tmp_path / name
    path.mkdir()
    return str(path)


def test_a_queued_call_sent_ahead_runs_before_its_run_and_returns_there(
        child: CappedChild, tmp_path: Path) -> None:
    cap = idle_mb(child) + 200
    first, second = folder(tmp_path, "func.1"), folder(tmp_path, "func.2")
    child.queue(started_at, cap_mb=cap, sandbox=second)  # arrives while the first runs
    assert child.run(int, cap_mb=cap, sandbox=first).ok
    assert child.sent_ahead == 1  # sent as the first one's value came in
    time.sleep(0.3)
    asked = time.time()
    ahead = child.run(started_at, cap_mb=cap, sandbox=second)
    assert ahead.ok and ahead.value < asked - 0.2  # it ran before its run was called
    assert not child.send_ahead()  # nothing more queued
    assert child.started == 1


def test_a_call_sent_ahead_is_watched_against_its_cap(child: CappedChild,
                                                       tmp_path: Path) -> None:
    cap = idle_mb(child) + 100
    first, second = folder(tmp_path, "func.1"), folder(tmp_path, "func.2")
    child.queue(allocate, (300, 5.0), cap_mb=cap, sandbox=second)
    assert child.run(int, cap_mb=cap, sandbox=first).ok
    assert child.sent_ahead == 1
    over = child.run(allocate, (300, 5.0), cap_mb=cap, sandbox=second)
    assert over.exceeded and not over.ok and over.peak_mb >= cap
    assert child.pid is None  # killed with the call


def test_a_call_sent_ahead_whose_run_never_comes_is_stopped_by_the_next_run(
        child: CappedChild, tmp_path: Path) -> None:
    """The worker cancelled the queued call (removed its sandbox) after it went ahead: the
    next call's run gives it CANCELLED_GRACE_S, then stops it with the child, and runs."""
    cap = idle_mb(child) + 200
    first, cancelled, third = (folder(tmp_path, f"func.{i}") for i in (1, 2, 3))
    child.queue(time.sleep, (60.0,), cap_mb=cap, sandbox=cancelled)
    child.run(int, cap_mb=cap, sandbox=first)
    first_pid = child.pid
    assert child.sent_ahead == 1
    os.rmdir(cancelled)
    began = time.monotonic()
    after = child.run(whoami, cap_mb=cap, sandbox=third)
    assert after.ok and time.monotonic() - began < 10  # not the 60 s sleep
    assert first_pid is not None and not psutil.pid_exists(first_pid)
    assert after.value == (child.pid, os.getpid()) and child.started == 2


@pytest.mark.parametrize("cancelled", [True, False])
def test_a_call_sent_ahead_whose_run_never_comes_but_ends_soon_keeps_the_child(
        child: CappedChild, tmp_path: Path, cancelled: bool) -> None:
    """The next run is another call's: the one sent ahead is waited for and its value
    dropped. Cancelled (its sandbox removed by the worker), it gets CANCELLED_GRACE_S to end;
    one that ends within it keeps the child (its caches)."""
    cap = idle_mb(child) + 200
    first, ahead, third = (folder(tmp_path, f"func.{i}") for i in (1, 2, 3))
    marker = tmp_path / "ahead-ran"
    child.queue(allocate, (10, 0.3, str(marker)), cap_mb=cap, sandbox=ahead)
    child.run(int, cap_mb=cap, sandbox=first)
    assert child.sent_ahead == 1
    if cancelled:
        os.rmdir(ahead)
    after = child.run(whoami, cap_mb=cap, sandbox=third)
    assert after.ok and marker.exists()  # the one ahead finished first
    assert after.value == (child.pid, os.getpid()) and child.started == 1


def test_a_call_sent_ahead_of_a_bad_value_starts_again_in_a_fresh_child(
        child: CappedChild, tmp_path: Path) -> None:
    """A call that raised sends nothing ahead; one whose value its caller finds bad closes
    the child, and the call sent ahead with it: its run starts it again in a new child."""
    cap = idle_mb(child) + 200
    first, second, third = (folder(tmp_path, f"func.{i}") for i in (1, 2, 3))
    child.queue(started_at, cap_mb=cap, sandbox=second)
    raised = child.run(int, ("not a number",), cap_mb=cap, sandbox=first)
    assert not raised.ok and child.sent_ahead == 0
    child.close()  # as run_bundle does after a result that is not OK
    again = child.run(started_at, cap_mb=cap, sandbox=second)
    assert again.ok and child.started == 2
    child.queue(whoami, cap_mb=cap, sandbox=third)
    assert child.run(int, cap_mb=cap, sandbox=first).ok and child.sent_ahead == 1
    child.close()
    fresh = child.run(whoami, cap_mb=cap, sandbox=third)
    assert fresh.ok and fresh.value == (child.pid, os.getpid()) and child.started == 3


def test_nothing_goes_ahead_that_already_ran_that_is_gone_or_that_needs_a_fresh_child(
        tmp_path: Path) -> None:
    with CappedChild(recycle_fraction=0.5) as child:
        idle = idle_mb(child)
        ran, gone, big = (folder(tmp_path, f"func.{i}") for i in (1, 2, 3))
        child.run(int, cap_mb=idle + 500, sandbox=ran)
        child.queue(int, cap_mb=idle + 500, sandbox=ran)  # its hook came after its run
        assert not child.send_ahead()
        child.queue(int, cap_mb=idle + 500, sandbox=gone)
        os.rmdir(gone)
        assert not child.send_ahead()
        child.queue(int, cap_mb=idle, sandbox=big)  # idles above half of that cap
        assert not child.send_ahead()
        large = folder(tmp_path, "func.4")  # inline inputs over QUEUED_MAX_BYTES: not kept
        child.queue(len, (b"x" * (QUEUED_MAX_BYTES + 1),), cap_mb=idle + 500, sandbox=large)
        assert not child.send_ahead()
        fresh = child.run(whoami, cap_mb=idle, sandbox=big)  # the usual way: a new child
        assert fresh.ok and child.started == 2 and child.sent_ahead == 0


def test_beyond_queued_ahead_the_first_queued_calls_are_kept(child: CappedChild,
                                                             tmp_path: Path) -> None:
    """A library with many calls queued (a worker of many cores): the next to run is the
    one sent ahead, the calls beyond QUEUED_AHEAD are not kept."""
    cap = idle_mb(child) + 200
    first = folder(tmp_path, "func.0")
    queued = [folder(tmp_path, f"func.{i}") for i in range(1, QUEUED_AHEAD + 3)]
    for sandbox in queued:
        child.queue(started_at, cap_mb=cap, sandbox=sandbox)
    assert child.run(int, cap_mb=cap, sandbox=first).ok and child.sent_ahead == 1
    time.sleep(0.3)
    asked = time.time()
    ahead = child.run(started_at, cap_mb=cap, sandbox=queued[0])
    assert ahead.ok and ahead.value < asked - 0.2  # the first queued went ahead
    assert child.sent_ahead == 2 and len(child._queued) == QUEUED_AHEAD - 2


def test_calls_skipped_while_queued_leave_the_queue_and_never_go_ahead(
        child: CappedChild, tmp_path: Path) -> None:
    """The library skips a call cancelled while it waited (its sandbox removed): its run
    never comes. The run of a call queued after it drops it, and a send ahead passes over
    one whose sandbox is gone to the next call still there."""
    cap = idle_mb(child) + 200
    first, skipped, second, gone, third = (folder(tmp_path, f"func.{i}") for i in range(5))
    for sandbox in (first, skipped, second, gone, third):
        child.queue(started_at, cap_mb=cap, sandbox=sandbox)
    raised = child.run(int, ("not a number",), cap_mb=cap, sandbox=first)  # nothing ahead
    assert not raised.ok and child.sent_ahead == 0
    os.rmdir(skipped)
    os.rmdir(gone)
    assert child.run(int, cap_mb=cap, sandbox=second).ok
    assert child.sent_ahead == 1 and not child._queued  # skipped dropped, gone passed over
    time.sleep(0.3)
    asked = time.time()
    ahead = child.run(started_at, cap_mb=cap, sandbox=third)
    assert ahead.ok and ahead.value < asked - 0.2  # third went ahead


def test_a_call_whose_run_began_while_its_hook_pickled_it_is_not_kept(
        child: CappedChild, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The library's loop may start a call while its hook still pickles it: the call is not
    queued then, so it is not sent to the child a second time when it returns."""
    from datavine.worker import capped_child

    cap = idle_mb(child) + 200
    sandbox = folder(tmp_path, "func.1")
    marker = tmp_path / "runs"
    pickle = capped_child.cloudpickle.dumps
    ran: list[object] = []

    def dumps_then_run(obj: object) -> bytes:
        if not ran:  # queue()'s pickling: the library's loop runs the call meanwhile
            ran.append(None)
            ran[0] = child.run(count_run, (str(marker),), cap_mb=cap, sandbox=sandbox)
        return pickle(obj)

    monkeypatch.setattr(capped_child.cloudpickle, "dumps", dumps_then_run)
    child.queue(count_run, (str(marker),), cap_mb=cap, sandbox=sandbox)
    assert ran and ran[0].ok and not child._queued  # type: ignore[attr-defined]
    assert not child.send_ahead() and marker.read_text() == "x"  # it ran once


def count_run(path: str) -> int:
    """Append a mark to ``path``: how many times a call ran."""
    with open(path, "a") as out:
        out.write("x")
    return os.path.getsize(path)
