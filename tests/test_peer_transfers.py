"""TaskVine patch 0021 (scripts/patches/cctools): a peer transfer's links (the worker's
transfer child that connects, the transfer server's handler that accepts) turn Nagle's
algorithm off, seen with ``strace`` on two real workers moving a temp between them."""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

import pytest

from datavine.config import ManagerConfig
from datavine.deploy.binaries import vine_binary
from datavine.deploy.sessions import stop_session
from datavine.manager.runtime import Runtime
from tests.bare_manager import run_all, until


def nodelay_processes(trace: Path) -> set[int]:
    """The processes of an ``strace -f -e trace=setsockopt`` log that turned Nagle's
    algorithm off on a socket."""
    found = set()
    for line in trace.read_text().splitlines():
        if "TCP_NODELAY, [1]" in line:
            found.add(int(line.split()[0]))
    return found


@pytest.mark.skipif(shutil.which("strace") is None, reason="strace is missing")
def test_peer_transfer_links_turn_nagle_off(tmp_path: Path) -> None:
    """0021: a temp made on worker a and read by a task pinned to worker b moves a to b over
    a link both ends of which set TCP_NODELAY: in each worker's process tree a process other
    than the worker itself (which sets it on its link to the manager) sets it, the
    connecting transfer child on b and the transfer server's handler on a. Without the patch
    only the workers themselves do (their password exchange then waits on delayed
    acknowledgements, ~40 ms twice per transfer: benchmarks/HISTORY.md, traffic)."""
    rt = Runtime(ManagerConfig(run_dir=tmp_path / "manager"))
    traces = {name: tmp_path / f"strace-{name}.txt" for name in ("a", "b")}
    workers = {name: subprocess.Popen(
        ["strace", "-f", "-qq", "-e", "trace=setsockopt", "-e", "signal=none", "-o",
         str(traces[name]),
         str(vine_binary("vine_worker")), "127.0.0.1", str(rt.port), "--cores", "1",
         "--feature", f"worker:w-{name}", "--workspace", str(tmp_path / name),
         "--timeout", "60"],
        stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True)
        for name in traces}
    vine = rt.taskvine.vine
    try:
        until(lambda: rt.manager.wait(1) is None and rt.connected_workers() == 2, 30)
        assert rt.connected_workers() == 2, "2 workers did not connect"
        temp = rt.manager.declare_temp()
        make = vine.Task("head -c 1048576 /dev/zero > out")
        make.add_output(temp, "out")
        make.add_feature("worker:w-a")
        read = vine.Task("test $(wc -c < in) = 1048576")
        read.add_input(temp, "in")
        read.add_feature("worker:w-b")
        run_all(rt, [rt.manager.submit(make), rt.manager.submit(read)])
        assert make.successful() and read.successful(), (make.result, read.result)
        for name in workers:
            first = int(traces[name].read_text().split()[0])  # strace's child: the worker
            assert nodelay_processes(traces[name]) - {first}, (
                f"no process under worker {name} turned Nagle's algorithm off besides the "
                f"worker itself: {traces[name].read_text()[-2000:]}")
    finally:
        for worker in workers.values():
            stop_session(worker.pid)
            worker.wait(timeout=10)
        rt.close()
