"""Fast tests of the fault-handling pieces: TaskVine's timeouts from the worker bound, the
transactions-log parser, sessions, the reaper, SIGTERM/SIGHUP, task time limits."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from datavine.deploy import reaper as reaper_mod
from datavine.deploy.sessions import kill_session, session_pids, stop_session
from datavine.deploy.signals import Terminated, terminate_gracefully
from datavine.manager.library import LibraryLogs
from datavine.manager.library_log import LibraryLog, requeued_task
from datavine.manager.taskvine_port import check_port_free, exec_command, silence_tunes
from datavine.worker.alarm import alarm
from datavine.worker.memcap import run_capped
from datavine.worker.remote import TaskTimeLimitExceeded


def test_silence_tunes_bound_detection_by_the_worker_timeout() -> None:
    for bound in (3, 15, 60, 600):
        tunes = silence_tunes(bound)
        assert tunes["keepalive-interval"] + tunes["keepalive-timeout"] <= bound
        assert tunes["long-timeout"] <= max(2, bound / 3)
        assert all(v >= 1 for v in tunes.values())
        # checks as rare as the bound allows: a third of it left for the answer
        assert tunes["keepalive-interval"] >= 2 * bound // 3 - 1


def test_requeued_task_reads_only_new_attempts() -> None:
    line = b'1795450516751989 19610 TASK 9 READY default FIRST_RESOURCES 2 {"cores":[1,"cores"]}'
    assert requeued_task(line) == 9
    assert requeued_task(line.replace(b" 2 {", b" 1 {")) is None
    assert requeued_task(b"1795450516751906 19610 WORKER w-1 DISCONNECTION FAILURE") is None
    assert requeued_task(b"1 2 TASK 3 RUNNING worker-x FIRST_RESOURCES {}") is None
    assert requeued_task(b"garbage") is None


def test_the_log_names_tasks_put_back_with_or_without_a_new_attempt(tmp_path: Path) -> None:
    """A task TaskVine put back shows as a second READY line of its id: with a new attempt
    (its worker died) or without one (its library died: "forsaken"); its first READY line
    (the submit) does not count, nor a READY line after its DONE (an id never returns, but
    the log is read as it grows)."""
    path = tmp_path / "transactions"
    log = LibraryLog(path)

    def ready(task: int, attempt: int) -> bytes:
        return b"1 2 TASK %d READY default FIRST_RESOURCES %d {}\n" % (task, attempt)

    path.write_bytes(ready(1, 1) + ready(2, 1) + ready(3, 1)
                     + b"1 2 TASK 1 RUNNING worker-a  FIRST_RESOURCES {}\n")
    assert log.requeued(0.0) == []
    with open(path, "ab") as f:
        f.write(ready(1, 1)  # forsaken: put back without an attempt
                + ready(2, 2)  # its worker died: a new attempt
                + b"1 2 TASK 3 DONE SUCCESS  0 \n")
    assert sorted(log.requeued(1.0)) == [1, 2]
    assert log.requeued(2.0) == []  # each once
    with open(path, "ab") as f:
        f.write(ready(3, 1))
    assert log.requeued(3.0) == []  # after its DONE: as new


def test_a_tail_gives_the_matching_lines_once_they_are_whole(tmp_path: Path) -> None:
    from datavine.io.tail import LineTail, line_pattern

    path = tmp_path / "log"
    tail = LineTail(path)
    ready = line_pattern(rb"\d+ READY[^\n]*")
    assert tail.matching(ready) == []  # no file yet
    path.write_bytes(b"1 READY a\n2 RUNNING a\n3 READY b")  # the last line half written
    assert tail.matching(ready) == [b"1 READY a"]
    with open(path, "ab") as f:
        f.write(b"b\n4 READY c\n5 READY")
    assert tail.matching(ready) == [b"3 READY bb", b"4 READY c"]
    with open(path, "ab") as f:  # a pattern matches whole lines only: not a line's start
        f.write(b"NOT\n6 READY d\n")
    assert tail.matching(line_pattern(rb"\d+ READY")) == []
    assert tail.matching(ready) == [] and tail.lines() == []


def test_the_library_log_reads_the_lines_it_parses_and_skips_the_rest(tmp_path: Path) -> None:
    """TaskVine's log lines as 7.15 writes them: the library log's search keeps a worker's
    arrival and departure, its library's states and a task's READY and DONE, and none of
    the transfers, cache updates and other task states that make most of the log."""
    from datavine.io.tail import LineTail
    from datavine.manager.library_log import _READ_LINES

    keep = [b"17 9 WORKER worker-1 CONNECTION 127.0.0.1:4001",
            b"18 9 LIBRARY 3 SENT worker-1",
            b"19 9 LIBRARY 3 STARTED worker-1",
            b'20 9 TASK 448 READY default FIRST_RESOURCES 1 {"cores":[1,"cores"]}',
            b"21 9 TASK 426 DONE SUCCESS  0 ",
            b"22 9 WORKER worker-1 DISCONNECTION UNKNOWN"]
    skip = [b"23 9 WORKER worker-1 TRANSFER INPUT x 5 0.1 file-meta",
            b'24 9 WORKER worker-1 CACHE_UPDATE file-x 5 0.1 {"a":1}',
            b'25 9 WORKER worker-1 RESOURCES {"cores":[1,"cores"]}',
            b"26 9 TASK 448 RUNNING worker-1  FIRST_RESOURCES {}",
            b"27 9 TASK 448 WAITING_RETRIEVAL worker-1",
            b"28 9 TASK 448 RETRIEVED SUCCESS  0",
            b"# time manager_pid TASK task_id READY category"]
    path = tmp_path / "transactions"
    path.write_bytes(b"\n".join(line for pair in zip(skip[:-1], keep, strict=True)
                                for line in pair)
                     + b"\n" + skip[-1] + b"\n")
    assert LineTail(path).matching(_READ_LINES) == keep


def test_library_logs_find_a_traceback_written_in_pieces(tmp_path: Path) -> None:
    logs = LibraryLogs()
    assert logs.failures(tmp_path / "not-yet") == []  # TaskVine makes the folder later
    ok, bad = tmp_path / "lib-1.log", tmp_path / "lib-2.log"
    ok.write_bytes(b"library started\n")
    bad.write_bytes(b"library started\nTraceback (most rec")
    (tmp_path / "notes.txt").write_bytes(b"Traceback (most recent call last)")  # not a log
    assert logs.failures(tmp_path) == []
    with open(bad, "ab") as f:  # the mark completes in the next write
        f.write(b"ent call last):\n  File ...\nMemoryError\n")
    with open(ok, "ab") as f:
        f.write(b"call 1 done\n")
    assert logs.failures(tmp_path) == [bad]
    # each log is read once up to its end: a look reads only what was appended since
    assert logs.read_to[ok.name] == ok.stat().st_size
    with open(ok, "ab") as f:
        f.write(b"Traceback (most recent call last):\n")
    assert logs.failures(tmp_path) == sorted([ok, bad])


def test_the_library_command_is_exec_ed_once() -> None:
    assert exec_command("python library_code.py") == "exec python library_code.py"
    wrapped = "env-1/bin/run_in_env python library_code.py"  # an environment's wrapper
    assert exec_command(wrapped) == f"exec {wrapped}"
    assert exec_command(" exec python x.py") == "exec python x.py"


def test_busy_port_is_named() -> None:
    import socket

    from datavine.errors import ManagerStartError

    with socket.socket() as held:
        held.bind(("", 0))
        held.listen()
        port = held.getsockname()[1]
        with pytest.raises(ManagerStartError, match=f"port {port}"):
            check_port_free(port)
    check_port_free(0)


def test_sessions_find_descendants_in_other_groups_and_orphans() -> None:
    """Like a vine_worker: a leader whose child moves to its own process group, and is
    orphaned when the leader dies; both are found by session and stopped."""
    script = ("import os, time\n"
              "pid = os.fork()\n"
              "if pid == 0:\n"
              "    os.setpgid(0, 0); time.sleep(300)\n"
              "print(pid, flush=True); time.sleep(300)\n")
    leader = subprocess.Popen([sys.executable, "-c", script], stdout=subprocess.PIPE,
                              text=True, start_new_session=True)
    try:
        assert leader.stdout is not None
        child = int(leader.stdout.readline())
        assert set(session_pids(leader.pid)) == {leader.pid, child}
        os.kill(leader.pid, signal.SIGKILL)  # the child is orphaned, in its own group
        leader.wait(timeout=10)
        assert session_pids(leader.pid) == [child]
        assert kill_session(leader.pid) == 1
        deadline = time.monotonic() + 10
        while _alive(child) and time.monotonic() < deadline:
            time.sleep(0.05)
        assert not _alive(child)
        assert stop_session(leader.pid) == 0  # nothing left
    finally:
        kill_session(leader.pid)


def test_reaper_registrations() -> None:
    sessions: set[int] = set()
    paths: set[str] = set()
    for line in ["+s 10", "+s 11", "-s 10", "+p /tmp/a b", "+p /tmp/c", "-p /tmp/c", "+s x", ""]:
        reaper_mod.apply(line, sessions, paths)
    assert sessions == {11} and paths == {"/tmp/a b"}


def test_reaper_cleans_up_after_a_killed_client(tmp_path: Path) -> None:
    """A client registers a process session and a directory, then dies by SIGKILL: the
    reaper stops the session and removes the directory."""
    target = tmp_path / "run-dir"
    script = (
        "import subprocess, sys, time\n"
        "from datavine.deploy.reaper import reaper\n"
        "p = subprocess.Popen(['sleep', '300'], start_new_session=True)\n"
        "import os; os.mkdir(sys.argv[1])\n"
        "reaper().add_session(p.pid); reaper().add_path(sys.argv[1])\n"
        "print(p.pid, flush=True); time.sleep(300)\n")
    client = subprocess.Popen([sys.executable, "-c", script, str(target)],
                              stdout=subprocess.PIPE, text=True)
    try:
        assert client.stdout is not None
        sleeper = int(client.stdout.readline())
        assert target.is_dir()
        client.kill()
        client.wait(timeout=10)
        deadline = time.monotonic() + 20
        while (_alive(sleeper) or target.exists()) and time.monotonic() < deadline:
            time.sleep(0.1)
        assert not _alive(sleeper)
        assert not target.exists()
    finally:
        client.kill()


def _alive(pid: int) -> bool:
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except OSError:
        return False
    return state != "Z"


def test_sigterm_raises_terminated_once_and_is_handled() -> None:
    """Raised in the main thread, a second signal ignored while it unwinds; ``handled()``
    gives the defaults back (a cluster fixture may have the handler installed already)."""
    from datavine.deploy import signals

    before = {sig: signal.getsignal(sig) for sig in signals.SIGNALS}
    try:
        with pytest.raises(Terminated) as info, terminate_gracefully():
            os.kill(os.getpid(), signal.SIGTERM)
            time.sleep(5)  # interrupted by the handler
        assert info.value.exit_code == 128 + signal.SIGTERM
        assert isinstance(info.value, KeyboardInterrupt)
        assert signal.getsignal(signal.SIGHUP) == signal.SIG_IGN  # cleanup is not cut short
    finally:
        signals.handled()  # this test process must not die by the signal at exit
        for sig, handler in before.items():
            signal.signal(sig, handler)
    assert not signals._pending


def test_terminate_gracefully_restores_what_it_found() -> None:
    before = signal.getsignal(signal.SIGHUP)
    with terminate_gracefully():
        inside = signal.getsignal(signal.SIGHUP)
    assert signal.getsignal(signal.SIGHUP) == before
    assert inside not in (signal.SIG_DFL, None) or before not in (signal.SIG_DFL, None)


def test_unhandled_terminated_dies_by_the_signal_after_cleanup(tmp_path: Path) -> None:
    marker = tmp_path / "cleaned"
    script = ("import os, signal, sys\n"
              "from datavine.deploy.signals import terminate_gracefully\n"
              "with terminate_gracefully():\n"
              "    try:\n"
              "        os.kill(os.getpid(), signal.SIGHUP)\n"
              "        import time; time.sleep(5)\n"
              "    finally:\n"
              "        open(sys.argv[1], 'w').close()\n")
    proc = subprocess.run([sys.executable, "-c", script, str(marker)], capture_output=True,
                          timeout=60)
    assert proc.returncode == -signal.SIGHUP
    assert marker.exists()


def test_the_alarm_interrupts_python_code_and_puts_the_handler_back() -> None:
    before = signal.getsignal(signal.SIGALRM)
    started = time.monotonic()
    with pytest.raises(TaskTimeLimitExceeded), alarm(0.2, lambda: TaskTimeLimitExceeded(0.2)):
        time.sleep(5)
    assert time.monotonic() - started < 4
    for no_limit in (None, 0):
        with alarm(no_limit, lambda: AssertionError("no alarm was asked for")):
            time.sleep(0.05)
    assert signal.getitimer(signal.ITIMER_REAL) == (0.0, 0.0)
    assert signal.getsignal(signal.SIGALRM) == before


def test_the_alarm_is_off_outside_the_main_thread() -> None:
    import threading

    errors: list[BaseException] = []

    def elsewhere() -> None:
        try:
            with alarm(0.01, lambda: AssertionError("rang off the main thread")):
                time.sleep(0.1)
        except BaseException as exc:  # pragma: no cover - what the test guards against
            errors.append(exc)

    t = threading.Thread(target=elsewhere)
    t.start()
    t.join(10)
    assert not errors and signal.getitimer(signal.ITIMER_REAL) == (0.0, 0.0)


def test_a_task_past_its_time_limit_is_reported_with_its_key() -> None:
    import cloudpickle
    from dask._task_spec import Task

    from datavine.protocol import BundleSpec, Status
    from datavine.worker import remote

    spec = BundleSpec(nodes=[("nap", Task("nap", time.sleep, 5))], outputs=["nap"],
                      limits={"nap": 0.2})
    result = remote.execute_payload(cloudpickle.dumps(spec.encode()))
    assert result.status is Status.TIME and result.key == "nap" and result.limit_s == 0.2


def sleep_with_a_grandchild(pids_file: str) -> None:
    """Start a ``sleep`` (in the call's process group), name both processes, sleep 30 s."""
    sleeper = subprocess.Popen(["sleep", "60"])
    Path(pids_file).write_text(f"{os.getpid()} {sleeper.pid}")
    time.sleep(30)


def ended(pid: int, within_s: float = 10.0) -> bool:
    """``pid`` exited (a zombie not reaped yet counts) within ``within_s``."""
    import psutil

    deadline = time.monotonic() + within_s
    while time.monotonic() < deadline:
        try:
            if psutil.Process(pid).status() == psutil.STATUS_ZOMBIE:
                return True
        except psutil.NoSuchProcess:
            return True
        time.sleep(0.05)
    return False


def test_capped_call_past_its_time_limit_is_killed(tmp_path: Path) -> None:
    pids = tmp_path / "pids"
    result = run_capped(sleep_with_a_grandchild, (str(pids),), cap_mb=None, time_limit_s=0.5)
    assert result.timed_out and not result.ok
    assert "time limit" in str(result.error)
    assert result.signal == signal.SIGKILL  # killed, not ended by itself after its 30 s
    child, grandchild = map(int, pids.read_text().split())
    assert ended(child) and ended(grandchild), "the call's processes outlived its kill"


def test_a_fault_that_never_struck_is_not_recovered() -> None:
    import time

    from datavine.apps import faults

    def missing_target(_: object) -> None:
        raise faults.FaultNotInjected("no library process under worker 0")

    strike = faults.Strike(missing_target, object())
    strike._strike(missing_target, object())  # as the timer would
    assert not strike.injected
    ok, outcome = strike.verdict(True, "result correct")
    assert not ok and "FAULT NOT INJECTED" in outcome and "no library process" in outcome

    hits: list[object] = []
    target = object()
    strike = faults.Strike(hits.append, target)
    strike._strike(hits.append, target)
    assert strike.injected and hits == [target]
    assert strike.verdict(True, "result correct") == (True, "result correct")

    late = faults.Strike(hits.append, target).start()  # due FAULT_AT_S from now
    late.cancel()  # the run ended first
    time.sleep(0.05)
    assert late.verdict(True, "result correct")[0] is False


def test_handlers_set_in_the_main_thread_can_be_closed_from_another() -> None:
    """A cluster closed by the garbage collector on another thread exits the block there:
    no ValueError (the handler stays: only the main thread can change it)."""
    import signal
    import threading

    from datavine.deploy.signals import terminate_gracefully

    found = signal.getsignal(signal.SIGTERM)  # a cluster collected earlier may have left one
    signal.signal(signal.SIGTERM, signal.SIG_DFL)
    before = signal.SIG_DFL
    block = terminate_gracefully()
    block.__enter__()
    assert signal.getsignal(signal.SIGTERM) is not before
    errors: list[BaseException] = []

    def close() -> None:
        try:
            block.__exit__(None, None, None)
        except BaseException as exc:  # pragma: no cover - what the test guards against
            errors.append(exc)

    t = threading.Thread(target=close)
    t.start()
    t.join(10)
    assert not errors
    signal.signal(signal.SIGTERM, before)
    with terminate_gracefully():
        assert signal.getsignal(signal.SIGTERM) is not before
    assert signal.getsignal(signal.SIGTERM) is before
    signal.signal(signal.SIGTERM, found)


def test_a_warm_up_gives_up_the_calls_of_a_worker_that_left(tmp_path: Path) -> None:
    """A warm-up stops waiting for the calls of a worker that left, though the topology has
    forgotten it since (its name no longer has an address there): before, those calls were
    waited for until the warm-up's timeout (15 minutes at 256 workers, for a worker that had
    stopped answering). The calls of a worker still connected are waited for."""
    from datavine.config import RunConfig
    from datavine.manager.library import DatavineLibrary
    from datavine.scheduler.topology import Topology

    class Port:
        cancelled: list[int] = []

        def cancel_task(self, task: int) -> None:
            self.cancelled.append(task)

    path = tmp_path / "transactions"
    path.write_bytes(b"1 9 WORKER worker-aa CONNECTION 127.0.0.1:9001\n"
                     b"1 9 WORKER worker-bb CONNECTION 127.0.0.1:9002\n")
    topology = Topology()
    topology.learn("local-0", None, "127.0.0.1:9001")
    topology.learn("local-1", None, "127.0.0.1:9002")
    port = Port()
    library = DatavineLibrary(port, RunConfig(), LibraryLog(path), topology)  # type: ignore[arg-type]
    pending = {1: "local-0", 2: "local-0", 3: "local-1"}
    seen: dict[str, str] = {}
    assert library._warm_given_up(pending, seen) == set()  # both connected
    with open(path, "ab") as f:
        f.write(b"2 9 WORKER worker-aa DISCONNECTION FAILURE\n")
    topology.forget("local-0")  # as the watch does when the worker leaves
    assert library._warm_given_up(pending, seen) == {1, 2}
    assert sorted(port.cancelled) == [1, 2]


def test_a_client_that_ends_well_leaves_no_reaper_behind(tmp_path: Path) -> None:
    """The client registered and unregistered a directory, then exits normally: its reaper
    ends with it, and Python has no process left running to warn about."""
    script = (
        "import os, sys\n"
        "from datavine.deploy.reaper import reaper\n"
        "reaper().add_path(sys.argv[1]); reaper().remove_path(sys.argv[1])\n"
        "print(reaper().pid, flush=True)\n")
    done = subprocess.run([sys.executable, "-W", "always::ResourceWarning", "-c", script,
                           str(tmp_path)], capture_output=True, text=True, timeout=30)
    assert done.returncode == 0, done.stderr
    assert "ResourceWarning" not in done.stderr
    assert not _alive(int(done.stdout.strip()))
    assert tmp_path.is_dir()  # unregistered: the reaper left it
