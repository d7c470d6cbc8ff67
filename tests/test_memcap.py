"""``memcap``: real forks, real allocations, real signals.

Caps are set above this test process's own RSS (the child inherits it), so "100 MB over
the baseline" is what a call may add before it is killed.
"""

from __future__ import annotations

import os
import signal
import statistics
import subprocess
import sys
import threading
import time
from pathlib import Path

import numpy as np
import psutil
import pytest

from datavine.worker import memcap
from datavine.worker.memcap import CappedResult, ChildFailedError, measure_peak, run_capped

MB = 2**20


def baseline_mb() -> float:
    """RSS of a freshly forked child that does nothing. Not the parent's RSS: a fork does not
    copy the page tables of file-backed mappings, so the child starts smaller than its parent
    (by more when the parent mapped many files, e.g. with a TaskVine manager in it)."""
    return run_capped(int, cap_mb=None).peak_mb


def allocate_and_hold(mb: int, hold_s: float, held: str | None = None) -> int:
    """Touch ``mb`` MB and hold them ``hold_s`` s; then write the file ``held`` (if named):
    a call killed while it held the memory never writes it."""
    block = np.ones(mb * MB // 8)  # ones, not zeros: every page is touched
    time.sleep(hold_s)
    if held is not None:
        Path(held).touch()
    return int(block[-1])


# Processes this test session started elsewhere (the shared cluster's vine_workers).
_OTHERS: set[int] = set()


@pytest.fixture(autouse=True)
def _children_before() -> None:
    _OTHERS.clear()
    _OTHERS.update(p.pid for p in psutil.Process().children(recursive=True))


def assert_no_children() -> None:
    left = [p for p in psutil.Process().children(recursive=True) if p.pid not in _OTHERS]
    assert left == []


def gone(pid: int, within_s: float = 5.0) -> bool:
    """The process exited (a zombie waiting for init counts) within ``within_s``."""
    deadline = time.monotonic() + within_s
    while time.monotonic() < deadline:
        try:
            if psutil.Process(pid).status() == psutil.STATUS_ZOMBIE:
                return True
        except psutil.NoSuchProcess:
            return True
        time.sleep(0.05)
    return False


def test_trivial_calls_return_their_values_and_leave_no_child() -> None:
    # time_limit_s bounds a stalled call (it would come back timed out): no hang, and no
    # speed asserted (~2-10 ms each on a loaded 2-core VM, printed)
    results = [run_capped(lambda x: x + 1, (41 + i,), cap_mb=baseline_mb() + 500,
                          time_limit_s=60) for i in range(30)]
    assert [r.value for r in results] == list(range(42, 72)), [r.error for r in results]
    assert all(r.ok and r.error is None and not r.exceeded and not r.timed_out
               for r in results)
    first = results[0]
    assert first.peak_mb > 0 and first.baseline_mb > 0 and first.signal is None
    median_ms = statistics.median(r.wall_s for r in results) * 1e3
    print(f"fork + return of a trivial call: median {median_ms:.2f} ms")
    assert_no_children()


def test_a_call_over_its_cap_is_killed_and_the_parent_goes_on(tmp_path: Path) -> None:
    cap = baseline_mb() + 100
    held = tmp_path / "held"
    over = run_capped(allocate_and_hold, (200, 5.0, str(held)), cap_mb=cap)
    assert over.exceeded and not over.ok and over.value is None
    assert over.peak_mb >= cap and over.cap_mb == cap
    assert over.signal == signal.SIGKILL
    assert isinstance(over.error, ChildFailedError) and "memory cap" in str(over.error)
    assert not held.exists()  # killed while it held the memory, not after its 5 s
    assert_no_children()
    fits = run_capped(allocate_and_hold, (200, 0.1), cap_mb=baseline_mb() + 1000)
    assert fits.ok and fits.value == 1 and not fits.exceeded
    assert fits.peak_mb >= 180  # the child touched 200 MB (inherited pages may not all count)
    assert_no_children()


def test_without_a_cap_the_peak_is_only_measured() -> None:
    result = run_capped(allocate_and_hold, (150, 0.0), cap_mb=None)
    assert result.ok and not result.exceeded and result.cap_mb is None
    assert result.peak_mb >= 140


def test_descendants_count_towards_the_cap_and_die_with_the_call(tmp_path: Path) -> None:
    pid_file = tmp_path / "grandchild.pid"

    def spawn_hog() -> None:
        hog = subprocess.Popen([sys.executable, "-c",
                                "import time; b = b'x' * (300 << 20); time.sleep(30)"])
        pid_file.write_text(str(hog.pid))
        hog.wait()

    result = run_capped(spawn_hog, cap_mb=baseline_mb() + 150, scan_every_s=0.1)
    assert result.exceeded and result.peak_mb >= baseline_mb() + 150
    assert result.wall_s < 10
    assert gone(int(pid_file.read_text()))


def test_an_orphaned_descendant_counts_towards_the_cap(tmp_path: Path) -> None:
    """The group's other processes are found among the child's descendants: one whose
    parent exited is re-parented to the child (a subreaper), and still counts."""
    pid_file = tmp_path / "orphan.pid"

    def orphan_a_hog() -> None:
        hog = (f"import os, time; open({str(pid_file)!r}, 'w').write(str(os.getpid())); "
               "b = b'x' * (300 << 20); time.sleep(30)")
        subprocess.run(["sh", "-c", f"{sys.executable} -c \"{hog}\" &"], check=True)
        time.sleep(30)  # the shell is gone: the hog's parent is now this child

    result = run_capped(orphan_a_hog, cap_mb=baseline_mb() + 150, scan_every_s=0.05)
    assert result.exceeded and result.wall_s < 20
    assert gone(int(pid_file.read_text()))


def test_a_groups_rss_is_read_from_its_leaders_descendants() -> None:
    """The walk of the leader's descendants finds what a scan of every process finds: the
    group's members at any depth, not the leader, not a descendant of another group."""
    tree = subprocess.Popen(["sh", "-c", "sleep 30 & (sleep 30 & wait) & "
                             "setsid sleep 30 & wait"], start_new_session=True)
    try:
        deadline = time.monotonic() + 5
        while len(memcap.descendants(tree.pid)) < 4 and time.monotonic() < deadline:
            time.sleep(0.02)
        found = dict(memcap.descendants(tree.pid))
        assert len(found) == 4  # a sleep, a subshell and its sleep, the setsid sleep
        in_group = [f for f in found.values() if int(f[2]) == tree.pid]
        assert len(in_group) == 3
        walked = memcap._group_rss_kb(tree.pid)
        assert walked == sum(int(f[21]) for f in in_group) * memcap._PAGE_KB > 0
        assert walked == memcap._scanned_group_rss_kb(tree.pid)
    finally:
        found = dict(memcap.descendants(tree.pid))
        os.killpg(tree.pid, signal.SIGKILL)
        for pid, fields in found.items():
            if int(fields[2]) != tree.pid:  # the setsid sleep: a group of its own
                os.kill(pid, signal.SIGKILL)
        tree.wait()


def test_processes_left_behind_by_a_call_are_killed() -> None:
    def leave_a_sleeper() -> int:
        return subprocess.Popen(["sleep", "30"]).pid

    result = run_capped(leave_a_sleeper, cap_mb=None)
    assert result.ok
    assert gone(result.value), "the sleeper outlived its call"


def test_exceptions_come_back_with_their_traceback() -> None:
    def fails(n: int) -> None:
        raise ValueError(f"bad input {n}")

    result = run_capped(fails, (7,), cap_mb=None)
    assert not result.ok and not result.exceeded
    assert isinstance(result.error, ValueError) and str(result.error) == "bad input 7"
    assert result.traceback and "in fails" in result.traceback
    assert "ValueError: bad input 7" in result.traceback


def test_what_cannot_be_pickled_is_reported() -> None:
    import threading

    class Unpicklable(Exception):
        def __init__(self) -> None:
            super().__init__("holds a lock")
            self.lock = threading.Lock()

    def raise_it() -> None:
        raise Unpicklable()

    bad_exc = run_capped(raise_it, cap_mb=None)
    assert isinstance(bad_exc.error, ChildFailedError)
    assert "Unpicklable" in str(bad_exc.error) and "in raise_it" in (bad_exc.traceback or "")
    bad_value = run_capped(threading.Lock, cap_mb=None)
    assert isinstance(bad_value.error, ChildFailedError)
    assert "cannot be pickled" in str(bad_value.error)


def test_a_segfault_is_reported() -> None:
    result = run_capped(lambda: os.kill(os.getpid(), signal.SIGSEGV), cap_mb=None)
    assert not result.ok and not result.exceeded
    assert result.signal == signal.SIGSEGV and "SIGSEGV" in str(result.error)
    assert_no_children()


def test_an_exit_without_result_is_reported() -> None:
    result = run_capped(lambda: os._exit(3), cap_mb=None)
    assert not result.ok and "status 3" in str(result.error) and result.signal is None


def test_large_results_come_back_intact() -> None:
    expected = np.arange(50 * MB // 8, dtype=np.int64)
    result = run_capped(lambda: (np.arange(50 * MB // 8, dtype=np.int64), b"z" * (50 * MB)),
                        cap_mb=None)
    assert result.ok
    array, blob = result.value
    assert np.array_equal(array, expected) and blob == b"z" * (50 * MB)
    print(f"2 x 50 MB result: {result.wall_s * 1e3:.0f} ms")


def test_an_exception_in_the_parent_kills_and_reaps_the_child() -> None:
    class Interrupted(Exception):
        pass

    def interrupt(signum: int, frame: object) -> None:
        raise Interrupted()

    previous = signal.signal(signal.SIGALRM, interrupt)
    try:
        signal.setitimer(signal.ITIMER_REAL, 0.3)
        started = time.monotonic()
        with pytest.raises(Interrupted):
            run_capped(time.sleep, (10,), cap_mb=None)
        assert time.monotonic() - started < 5
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, previous)
    assert_no_children()


def test_buffered_parent_output_is_not_written_twice(capfd: pytest.CaptureFixture[str]) -> None:
    print("from-the-parent", end="")
    result = run_capped(print, ("from-the-child",), cap_mb=None)
    assert result.ok
    out = capfd.readouterr().out
    assert out.count("from-the-parent") == 1 and out.count("from-the-child") == 1


def test_measure_peak_measures_one_call_in_process() -> None:
    if not os.access("/proc/self/clear_refs", os.W_OK):
        pytest.skip("the peak mark cannot be reset here")
    value, big = measure_peak(lambda: int(np.ones(150 * MB // 8).sum()))
    assert value == 150 * MB // 8 and big >= baseline_mb() + 140
    _, small = measure_peak(lambda: 1)
    assert small < big - 100  # the mark was reset: the earlier call's peak is gone


def test_the_result_type_is_a_frozen_dataclass() -> None:
    result = run_capped(int, cap_mb=None)
    assert isinstance(result, CappedResult)
    with pytest.raises(AttributeError):
        result.ok = False  # type: ignore[misc]


def test_write_all_sends_a_small_frame_in_one_write_and_wakes_its_reader_once() -> None:
    r, w = os.pipe()
    try:
        memcap.write_all(w, [b"head", b"", b"body"])
        assert os.read(r, 100) == b"headbody"  # all of it there at the first read
    finally:
        os.close(r)
        os.close(w)


def test_write_all_finishes_parts_larger_than_the_pipe_in_order() -> None:
    r, w = os.pipe()
    parts = [b"a" * 70_000, b"b" * 3, b"c" * 200_000]  # more than a pipe holds
    got = bytearray()

    def drain() -> None:
        while chunk := os.read(r, 65536):
            got.extend(chunk)

    reader = threading.Thread(target=drain)
    reader.start()
    try:
        memcap.write_all(w, parts)
    finally:
        os.close(w)
        reader.join(10)
        os.close(r)
    assert bytes(got) == b"".join(parts)


def test_write_all_resumes_after_partial_writes(monkeypatch: pytest.MonkeyPatch) -> None:
    written = bytearray()

    def three_bytes_at_most(fd: int, views: list[memoryview]) -> int:
        data = b"".join(bytes(v) for v in views)[:3]
        written.extend(data)
        return len(data)

    monkeypatch.setattr(memcap.os, "writev", three_bytes_at_most)
    memcap.write_all(-1, [b"12345", b"67", b"89abc"])
    assert bytes(written) == b"123456789abc"
