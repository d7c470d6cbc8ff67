"""Slowing a host of the box down (datavine.deploy.box.slowdown): a CPU quota holds busy
processes, the ones they fork too, to its share of a core; a token bucket on a host's cable
bounds what it sends and receives; both are undone when their block ends."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path

import pytest

from datavine.deploy.box.net import Box, BoxError
from datavine.deploy.box.slowdown import (
    CpuQuota,
    cpu_quota_missing,
    descendants,
    host_link,
    slow_host_link,
)

# a busy process that forks a second one after FORK_AT_S (argv[1]); each is busy for BUSY_S
# and prints its share of a core over the window after SETTLE_S (the quota is on by then)
BUSY_S, SETTLE_S = 2.5, 0.8
BUSY = ("import os,sys,time\n"
        "time.sleep(float(sys.argv[1]))\n"
        "pid=os.fork()\n"
        "t=time.monotonic();c=None\n"
        f"while time.monotonic()-t<{BUSY_S}:\n"
        f" if c is None and time.monotonic()-t>{SETTLE_S}:\n"
        "  w=time.monotonic();c=os.times()\n"
        "d=os.times();share=(d.user+d.system-c.user-c.system)/(time.monotonic()-w)\n"
        "os.write(1,f'{share}\\n'.encode())\n"  # one write: the two lines do not mix
        "if pid: os.waitpid(pid,0)\n")


def require_cgroup() -> None:
    why = cpu_quota_missing()
    if why:
        pytest.skip(why)


def cpu_share(fork_at_s: float, move_after_s: float) -> tuple[float, dict[str, int], list[int]]:
    """Two busy processes (a parent and the child it forks ``fork_at_s`` after starting)
    under a 0.25-core quota that the parent enters ``move_after_s`` after starting: their
    shares of a core together, the group's cpu.stat, the PIDs seen inside."""
    with CpuQuota(f"dvtest{os.getpid()}", 0.25) as quota:
        assert (quota.path / "cpu.cfs_quota_us").read_text().strip() == "25000"
        assert (quota.path / "cpu.cfs_period_us").read_text().strip() == "100000"
        proc = subprocess.Popen([sys.executable, "-c", BUSY, str(fork_at_s)],
                                stdout=subprocess.PIPE, text=True)
        try:
            time.sleep(move_after_s)
            quota.follow([proc.pid], every_s=0.05)
            time.sleep(0.5)
            seen = quota.pids()
            out, _ = proc.communicate(timeout=60)
        finally:
            if proc.poll() is None:
                proc.kill()
                proc.wait()
        stat = quota.stat()
    assert not quota.path.exists(), "the group was not removed"
    return sum(float(x) for x in out.split()), stat, seen


def test_a_quota_holds_a_process_and_what_it_forks_later() -> None:
    require_cgroup()
    share, stat, seen = cpu_share(fork_at_s=0.3, move_after_s=0.1)
    assert len(seen) == 2  # the child was forked inside the group: it is there too
    # 0.25 of a core for both together (an unthrottled busy pair takes up to 2 cores)
    assert share < 0.4, f"{share:.2f} of a core under a 0.25 quota"
    if share > 0.2:  # they reached the quota (a machine busy with others' work may not let them)
        assert stat["nr_throttled"] > 0


def test_a_quota_follows_children_forked_before_their_parent_moved() -> None:
    require_cgroup()
    share, _, seen = cpu_share(fork_at_s=0.0, move_after_s=0.3)
    assert len(seen) == 2  # the child forked before the move was found and moved
    assert share < 0.4, f"{share:.2f} of a core under a 0.25 quota"


def test_a_quota_refuses_a_group_that_exists(tmp_path: Path) -> None:
    (tmp_path / "dvbusy").mkdir()
    with pytest.raises(BoxError, match="exists already"), CpuQuota("dvbusy", 0.25, tmp_path):
        pass
    with pytest.raises(ValueError, match="fraction"):
        CpuQuota("dvx", 0.0, tmp_path)
    with pytest.raises(ValueError, match="name"):
        CpuQuota("../x", 0.25, tmp_path)


def test_descendants_are_found_through_proc() -> None:
    proc = subprocess.Popen(["sh", "-c", "sleep 30 & sleep 30 & wait"])
    try:
        deadline = time.monotonic() + 10
        while len(descendants(proc.pid)) < 2 and time.monotonic() < deadline:
            time.sleep(0.05)
        assert len(descendants(proc.pid)) == 2
        assert proc.pid not in descendants(proc.pid)
    finally:
        for pid in descendants(proc.pid):
            os.kill(pid, 9)
        proc.kill()
        proc.wait()


# --- tc tbf on a host's cable (the box) -------------------------------------------------------
SINK = ("import socket\ns=socket.socket()\n"
        "s.setsockopt(socket.SOL_SOCKET,socket.SO_REUSEADDR,1)\n"
        "s.bind(('0.0.0.0',5556));s.listen()\n"
        "while True:\n c,_=s.accept()\n while c.recv(1<<16): pass\n c.close()\n")


def transfer_mbit(box: Box, host: str, to: str, nbytes: int) -> float:
    """Mbit/s of ``nbytes`` sent from ``host`` to the sink on ``to``, until all arrived."""
    code = ("import socket,time\n"
            f"c=socket.create_connection(('{to}',5556),timeout=30)\n"
            f"t=time.monotonic();c.sendall(b'x'*{nbytes});c.shutdown(socket.SHUT_WR)\n"
            "c.recv(1);print(time.monotonic()-t)\n")  # the sink closes once it read all
    seconds = float(box.run(host, [sys.executable, "-c", code], timeout_s=60).stdout)
    return nbytes * 8 / seconds / 1e6


def qdiscs(namespace: str, interface: str) -> str:
    return subprocess.run(["tc", "-n", namespace, "qdisc", "show", "dev", interface],
                          capture_output=True, text=True, check=True).stdout


@pytest.mark.box
def test_a_shaped_host_link_bounds_both_ways_and_is_undone(
        make_box: Callable[..., Box]) -> None:
    box = make_box(racks=1, hosts_per_rack=2)
    for host in ("a1", "a2"):
        box.start(host, [sys.executable, "-c", SINK], name="sink")
    deadline = time.monotonic() + 20
    while True:  # both sinks listening
        try:
            transfer_mbit(box, "a1", "a2.box", 1)
            transfer_mbit(box, "a2", "a1.box", 1)
            break
        except (BoxError, ValueError):
            assert time.monotonic() < deadline, "the sinks are not listening"
            time.sleep(0.1)
    limit, nbytes = 20.0, 3_000_000  # 1.2 s at the limit; the bucket's burst is 256 KB
    ends = host_link(box, "a1")
    assert ends[0] == (box.plan.host("a1").namespace, "eth0")
    with slow_host_link(box, "a1", limit):
        assert all("tbf" in qdiscs(ns, ifname) for ns, ifname in ends)
        sent = transfer_mbit(box, "a1", "a2.box", nbytes)  # a1's egress
        received = transfer_mbit(box, "a2", "a1.box", nbytes)  # its router's port
    assert sent < 1.25 * limit, f"a1 sent at {sent:.1f} Mbit/s through a {limit} Mbit/s tbf"
    assert received < 1.25 * limit, f"a1 received at {received:.1f} Mbit/s"
    # undone (a speed check would fail on a loaded machine, not for the shaping)
    assert not any("tbf" in qdiscs(ns, ifname) for ns, ifname in ends)
