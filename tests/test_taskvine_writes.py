"""datavine's TaskVine patches for the manager's writes (scripts/patches/cctools), on a real
manager and workers:

- ``0022``: what a task sends its worker (a small buffer input, its description) and what
  its result does (the buffer's unlink, the kill) go in one write each (strace of the
  manager); a large buffer's bytes still follow their headers.
- ``0023``: the transactions log's lines go several to a write, whole lines only, and a line
  waits at most 0.1 s while the manager sleeps.
- ``0024``: a worker sending results is never asked whether it is alive; an idle one is.
"""

from __future__ import annotations

import contextlib
import os
import re
import shutil
import subprocess
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from datavine.manager.runtime import Runtime
from tests.bare_manager import manager_with_workers, until

pytestmark = [pytest.mark.taskvine]


@contextlib.contextmanager
def traced_writes(path: Path) -> Iterator[Callable[[], list[tuple[int, str]]]]:
    """strace on this process's main thread (where the manager runs), its ``write`` calls
    only; yields a function that returns (descriptor, data as strace prints it) of each
    write so far: a newline shows as ``\\n``."""
    tracer = subprocess.Popen(["strace", "-qq", "-e", "trace=write", "-e", "signal=none",
                               "-s", "65536", "-o", str(path), "-p", str(os.getpid())],
                              stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    try:
        traced = until(lambda: "TracerPid:\t0" not in Path("/proc/self/status").read_text(), 10)
        assert traced, tracer.stderr.read().decode() if tracer.poll() is not None else ""

        def writes() -> list[tuple[int, str]]:
            found = re.findall(r'^write\((\d+), "(.*)"\.{0,3}, \d+\)', path.read_text(),
                               re.MULTILINE)
            return [(int(fd), data) for fd, data in found]

        yield writes
    finally:
        tracer.terminate()
        tracer.wait(timeout=10)


def outputs_of(rt: Runtime, ids: list[int], timeout_s: float = 60,
               wait_s: int = 1) -> dict[int, str]:
    """Each task's output once all of ``ids`` came back successful."""
    out: dict[int, str] = {}
    deadline = time.monotonic() + timeout_s
    while len(out) < len(ids) and time.monotonic() < deadline:
        task = rt.manager.wait(wait_s)
        if task is not None:
            assert task.successful(), (task.id, task.result, task.output)
            out[task.id] = task.output
    assert len(out) == len(ids), f"tasks {sorted(set(ids) - set(out))} did not finish"
    return out


@pytest.mark.skipif(shutil.which("strace") is None, reason="strace is missing")
def test_a_task_and_its_small_inputs_go_in_one_write(tmp_path: Path) -> None:
    """0022: a task's small buffer input goes with its description in one write, and the
    unlink of that buffer with the task's kill when it comes back; a large buffer's bytes
    are written after what was gathered before them, so both kinds read whole."""
    import hashlib

    big = os.urandom(1 << 20)
    with manager_with_workers(tmp_path, 1) as rt, \
            traced_writes(tmp_path / "writes.txt") as writes:
        small: dict[int, str] = {}
        for i in range(3):
            task = rt.taskvine.vine.Task("cat in")
            task.add_input(rt.manager.declare_buffer(f"small-{i}".encode()), "in")
            small[rt.manager.submit(task)] = f"small-{i}"
        task = rt.taskvine.vine.Task("md5sum < in")
        task.add_input(rt.manager.declare_buffer(big), "in")
        large = rt.manager.submit(task)
        out = outputs_of(rt, [*small, large])
        sent = [data for _, data in writes()]
    assert {i: out[i] for i in small} == small
    assert out[large].split()[0] == hashlib.md5(big).hexdigest()
    for task_id in small:
        (described,) = [d for d in sent if f"task {task_id}\\n" in d]
        assert "put buffer-" in described.split(f"task {task_id}\\n")[0], described[:300]
        (killed,) = [d for d in sent if f"kill {task_id}\\n" in d]
        assert killed.startswith("unlink buffer-"), killed


@pytest.mark.skipif(shutil.which("strace") is None, reason="strace is missing")
def test_the_transactions_log_is_written_in_batches_within_its_interval(
        tmp_path: Path) -> None:
    """0023: the transactions log's lines go out several to a write, each write ends a
    line, and a line waits at most the interval (0.1 s) while the manager sleeps: the
    RUNNING line of a 3-s task is in the file long before the task ends."""
    import threading

    with manager_with_workers(tmp_path, 1) as rt:
        log = rt.taskvine.info_dir / "vine-logs" / "transactions"
        seen: dict[str, float] = {}  # a line -> when this test first read it
        stop = threading.Event()

        def watch() -> None:
            while not stop.wait(0.01):
                now = time.time()
                for line in log.read_text().splitlines():
                    seen.setdefault(line, now)

        watcher = threading.Thread(target=watch, daemon=True)
        with traced_writes(tmp_path / "writes.txt") as writes:
            quick = [rt.manager.submit(rt.taskvine.vine.Task("true")) for _ in range(4)]
            outputs_of(rt, quick)
            watcher.start()
            slow = rt.manager.submit(rt.taskvine.vine.Task("sleep 3"))
            outputs_of(rt, [slow], wait_s=10)  # the manager sleeps while the task runs
            stop.set()
            watcher.join(timeout=5)
            logged = [data for _, data in writes() if " TASK " in data]
    assert logged and all(data.endswith("\\n") for data in logged), logged[:3]
    assert max(data.count(" TASK ") for data in logged) >= 4, logged  # 4 READY lines at once
    running = [line for line in seen if re.search(rf" TASK {slow} RUNNING ", line)]
    assert running, "the slow task's RUNNING line never showed"
    stamped_s = int(running[0].split()[0]) / 1e6  # TaskVine's time of the line, in us
    assert seen[running[0]] - stamped_s < 1.0, seen[running[0]] - stamped_s  # not at its end


def test_only_silent_workers_get_keepalive_checks(tmp_path: Path) -> None:
    """0024: with a 1-s keep-alive interval, a worker that sends a result every ~0.3 s is
    never asked whether it is alive, while an idle one is, about once a second."""
    with manager_with_workers(tmp_path, 2, debug_log=True, features=("busy", "idle")) as rt:
        rt.manager.tune("keepalive-interval", 1)
        busy = ""
        ends = time.monotonic() + 5
        while time.monotonic() < ends:
            task = rt.taskvine.vine.Task("sleep 0.3")
            task.add_feature("busy")
            rt.manager.submit(task)
            done = until(lambda: rt.manager.wait(1), 30)
            assert done is not None and done.successful(), done
            busy = done.addrport
        log = (rt.taskvine.info_dir / "vine-logs" / "debug").read_text(errors="replace")
        addresses = {w["addrport"] for w in rt.manager.status("workers")}
    checks = {addr: len(re.findall(rf"tx to \S+ \({re.escape(addr)}\): check", log))
              for addr in addresses}
    (idle,) = addresses - {busy}
    assert checks[busy] == 0 and checks[idle] >= 3, checks
