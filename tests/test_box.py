"""The facility in a box, for real: hosts with their own names and routes, racks behind a
shaped spine whose kernel counters count what crosses racks, cuts, and nothing left behind."""

from __future__ import annotations

import subprocess
import sys
import time
from collections.abc import Callable

import pytest

from datavine.deploy.box.net import Box

pytestmark = pytest.mark.box

SINK = ("import socket,sys\ns=socket.socket()\n"
        "s.setsockopt(socket.SOL_SOCKET,socket.SO_REUSEADDR,1)\n"
        "s.bind(('0.0.0.0',int(sys.argv[1])));s.listen()\n"
        "while True:\n c,_=s.accept()\n while c.recv(1<<16): pass\n c.close()\n")


def send(box: Box, host: str, to: str, nbytes: int, timeout_s: float = 5.0) -> str:
    """What a client on ``host`` sees sending ``nbytes`` to ``to``:5555: 'ok' or the error."""
    code = ("import socket,sys\ntry:\n"
            f" c=socket.create_connection(('{to}',5555),timeout={timeout_s})\n"
            f" c.sendall(b'x'*{nbytes});c.shutdown(socket.SHUT_WR)\n"
            " c.recv(1);c.close();print('ok')\n"  # the sink closes once it read everything
            "except OSError as e: print(type(e).__name__)")
    return box.run(host, [sys.executable, "-c", code], timeout_s=timeout_s + 20).stdout.strip()


def start_sinks(box: Box, *hosts: str) -> None:
    """A sink on port 5555 of each host, listening before this returns (bounded)."""
    for host in hosts:
        box.start(host, [sys.executable, "-c", SINK, "5555"], name="sink")
    for host in hosts:
        deadline = time.monotonic() + 20
        while send(box, "mgr", f"{host}.box", 1) != "ok":
            assert time.monotonic() < deadline, f"the sink on {host} is not listening"
            time.sleep(0.1)


def test_hosts_have_their_names_and_reach_each_other(make_box: Callable[..., Box]) -> None:
    box = make_box(racks=2, hosts_per_rack=2)
    for host in ("mgr", "a2", "b1"):
        assert box.run(host, ["uname", "-n"]).stdout.strip() == f"{host}.box"
    # every name resolves from the hosts file (getent answers without a name server)
    got = box.run("a1", ["getent", "hosts", "b2.box"]).stdout.split()
    assert got[:2] == ["198.18.12.12", "b2.box"]
    start_sinks(box, "b2", "a2", "mgr")
    assert send(box, "a1", "mgr.box", 1000) == "ok"
    assert send(box, "b1", "a2.box", 1000) == "ok"


def test_only_traffic_between_racks_crosses_the_spine(make_box: Callable[..., Box]) -> None:
    box = make_box(racks=2, hosts_per_rack=2)
    start_sinks(box, "a2", "b2", "mgr")
    before = box.interrack_bytes()
    assert send(box, "a1", "a2.box", 4_000_000) == "ok"  # same rack
    assert send(box, "a1", "mgr.box", 4_000_000) == "ok"  # to the manager host: the core
    within = box.interrack_bytes() - before
    assert send(box, "a1", "b2.box", 4_000_000) == "ok"  # across racks
    across = box.interrack_bytes() - before - within
    assert within < 50_000
    assert 4_000_000 <= across < 4_400_000  # the payload plus TCP/IP headers
    assert box.interrack_by_rack()["A"] >= 4_000_000


def test_shaping_and_cuts_are_live_and_undone(make_box: Callable[..., Box]) -> None:
    box = make_box(racks=2, hosts_per_rack=1, link_mbit=100)
    qdisc = subprocess.run(["tc", "-n", box.plan.rack_router("A").namespace, "qdisc", "show",
                            "dev", "spine"], capture_output=True, text=True, check=True).stdout
    assert "tbf" in qdisc and "100Mbit" in qdisc
    box.shape(50)
    qdisc = subprocess.run(["tc", "-n", box.plan.rack_router("A").namespace, "qdisc", "show",
                            "dev", "spine"], capture_output=True, text=True, check=True).stdout
    assert "50Mbit" in qdisc and box.link_mbit == 50
    start_sinks(box, "b1", "mgr")
    assert send(box, "a1", "b1.box", 1) == "ok"
    box.cut_racks("prohibit")  # refused at once
    assert send(box, "a1", "b1.box", 1) != "ok"
    assert send(box, "a1", "mgr.box", 1) == "ok"  # the manager host is still reachable
    assert box.restore() == 4  # each rack's route to the other, in two halves
    assert send(box, "a1", "b1.box", 1) == "ok"
    box.cut_racks("blackhole")  # dropped: the sender times out
    assert send(box, "a1", "b1.box", 1, timeout_s=1.0) in ("TimeoutError", "timeout")
    box.restore()
    box.cut_rack_from_manager("A")
    assert send(box, "a1", "mgr.box", 1, timeout_s=1.0) in ("TimeoutError", "timeout")
    assert send(box, "a1", "b1.box", 1) == "ok"


def test_down_stops_what_runs_on_the_box(make_box: Callable[..., Box]) -> None:
    from datavine.deploy.box.facility import take_down
    from datavine.deploy.sessions import proc_stat
    from tests.fixtures_box import assert_gone

    box = make_box(racks=1, hosts_per_rack=1)
    proc = box.start("a1", ["sleep", "600"], name="sleeper")
    loose = box.run("a1", ["sh", "-c", "sleep 600 >/dev/null 2>&1 & echo $!"]).stdout.strip()
    take_down(box)
    assert_gone(box)
    assert proc.wait(timeout=10) is not None
    assert proc_stat(int(loose)) is None or proc_stat(int(loose))[2] == "Z"
