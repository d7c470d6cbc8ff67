"""HTCondor across the box: ``datavine pool start --batch condor --rack B`` run on the manager
host lands a vine_worker on a rack-B host through the real pool (a condor_master per host,
one chroot), and taking the box down leaves no namespace, process, mount or hosts entry.

The first tests are pure (configuration text, hosts block, requirements); the last brings up
a box (root, network namespaces, the installed personal pool: skipped, saying why, where
those are missing).
"""

from __future__ import annotations

import json
import os
import secrets
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import pytest

from datavine.deploy.box.condor import (
    BoxCondor,
    box_hosts_in_chroot,
    box_mounts,
    condor_missing,
    host_config,
    missing_ancestors,
    parse_slots,
    slot_share,
    start_condor,
    with_hosts_block,
    without_hosts_block,
)
from datavine.deploy.box.facility import take_down
from datavine.deploy.box.net import Box
from datavine.deploy.box.plan import BoxSpec, make_plan
from datavine.deploy.pools.condor import rack_requirement, with_requirement
from tests.fixtures_box import assert_gone, require_box

PLAN = make_plan(BoxSpec(name="t", racks=2, hosts_per_rack=2))


# --- pure -------------------------------------------------------------------------------------
def test_host_config_names_the_host_its_folders_and_role(tmp_path: Path) -> None:
    mgr, a1 = PLAN.host("mgr"), PLAN.host("a1")
    text = host_config(PLAN, a1, tmp_path)
    lines = text.splitlines()
    assert lines[1] == "include : /etc/condor/condor_config"
    assert "DATAVINE_HOST_ADDRESS = 198.18.11.11" in lines
    assert "DATAVINE_HOST_NAME = a1.box" in lines
    assert f"DATAVINE_HOST_DIR = {tmp_path / 'a1'}" in lines
    assert "DATAVINE_MANAGER_HOST = mgr.box" in lines
    assert 'DatavineRack = "A"' in lines and 'DatavineHost = "a1.box"' in lines
    assert "DATAVINE_DAEMONS = MASTER STARTD SHARED_PORT" in lines
    # the shared settings come last, so they win over minicondor's loopback pool
    assert lines[-1] == f"LOCAL_CONFIG_FILE = {tmp_path / 'box_config.local'}"
    manager = host_config(PLAN, mgr, tmp_path).splitlines()
    assert "DATAVINE_DAEMONS = MASTER COLLECTOR NEGOTIATOR SCHEDD SHARED_PORT" in manager
    assert not any(line.startswith("DatavineRack") for line in manager)


def test_slot_share_divides_the_machine_among_the_box_slots() -> None:
    assert slot_share(PLAN, 1) == 22  # 4 rack hosts, 90 % of the machine
    assert slot_share(PLAN, 2) == 11
    assert slot_share(make_plan(BoxSpec(name="t", racks=2, hosts_per_rack=1)), 1) == 45


def test_hosts_block_is_added_replaced_and_removed() -> None:
    base = "127.0.0.1\tlocalhost\n::1\tlocalhost"
    once = with_hosts_block(base, PLAN)
    assert once.startswith(base + "\n")
    assert "198.18.0.2\tmgr.box mgr" in once and "198.18.12.12\tb2.box b2" in once
    assert with_hosts_block(once, PLAN) == once  # replaced, not added twice
    other = with_hosts_block(once, make_plan(BoxSpec(name="u", racks=1, hosts_per_rack=1)))
    assert without_hosts_block(other, "t").count("mgr.box") == 1  # box u's block stays
    assert without_hosts_block(once, "t") == base + "\n"


def test_rack_requirement_is_anded_into_the_users_requirements() -> None:
    req = rack_requirement("B")
    assert req == 'DatavineRack == "B"'
    assert with_requirement(('+DatavinePool = "p"',), req) == (
        '+DatavinePool = "p"', 'requirements = (DatavineRack == "B")')
    assert with_requirement(("Requirements = (Memory > 10)", "x = 1"), req) == (
        'requirements = ((Memory > 10)) && (DatavineRack == "B")', "x = 1")


def test_parse_slots_and_missing_ancestors(tmp_path: Path) -> None:
    slots = parse_slots("slot1@a1.box a1.box A a1.box Unclaimed Idle IDTOKENS\n"
                        "slot1@x x undefined undefined Claimed Busy FS\nbad line\n")
    assert [(s.machine, s.rack, s.host, s.auth) for s in slots] == [
        ("a1.box", "A", "a1.box", "IDTOKENS"), ("x", None, None, "FS")]
    (tmp_path / "root" / "tmp").mkdir(parents=True)
    made = missing_ancestors(tmp_path / "root", Path("/tmp/box/b"))
    assert made == [tmp_path / "root/tmp/box/b", tmp_path / "root/tmp/box"]


# --- the real pool on a real box ---------------------------------------------------------------
MANAGER = """
import json, os, sys, time
import ndcctools.taskvine as vine
port, password, out, want, timeout_s = sys.argv[1:6]
m = vine.Manager(port=int(port), run_info_path=out + ".run-info")
m.set_password_file(password)
start = time.monotonic()
def ready():  # connected, and each said its resources (they follow its features)
    workers = m.status("workers") if m.stats.workers_connected >= int(want) else []
    return len(workers) >= int(want) and all(w.get("cores_total") for w in workers)
while not ready() and time.monotonic() - start < float(timeout_s):
    m.wait(1)
with open(out + ".tmp", "w") as f:
    json.dump({"waited_s": time.monotonic() - start, "workers": m.status("workers")}, f)
os.replace(out + ".tmp", out)
"""
PORT = 9123


def _chroot_pids_in(chroot: Path, nets: set[str] | None) -> list[int]:
    """Processes rooted in ``chroot`` in one of the network namespaces ``nets`` (None: any)."""
    out = []
    for proc in Path("/proc").iterdir():
        try:
            if (proc.name.isdigit() and os.readlink(proc / "root") == str(chroot.resolve())
                    and (nets is None or os.readlink(proc / "ns/net") in nets)):
                out.append(int(proc.name))
        except OSError:
            continue
    return out


def _nets(box: Box) -> set[str]:
    return {box.run(h.name, ["readlink", "/proc/self/ns/net"]).stdout.strip()
            for h in box.plan.hosts}


def _wait_file(path: Path, timeout_s: float) -> bool:
    deadline = time.monotonic() + timeout_s
    while not path.exists() and time.monotonic() < deadline:
        time.sleep(0.2)
    return path.exists()


@pytest.mark.box
@pytest.mark.condor
@pytest.mark.taskvine
def test_rack_pool_lands_on_its_rack_through_htcondor() -> None:
    require_box()
    why = condor_missing()
    if why:
        pytest.skip(why)
    # a folder the pool user can enter (pytest's own is mode 0700); taken down in the test,
    # once, so that what it leaves can be checked
    folder = Path(tempfile.mkdtemp(prefix="datavine-box-condor-"))
    folder.chmod(0o755)
    box = Box.up(BoxSpec(name=f"c{os.getpid() % 10000}", racks=2, hosts_per_rack=1), folder)
    try:
        cb, nets = _pool_on_rack_b(box)
    finally:
        take_down(box)
        shutil.rmtree(folder, ignore_errors=True)
    assert_gone(box)
    assert not _chroot_pids_in(cb.chroot, nets), "processes of the box left in the chroot"
    assert not box_mounts(cb.chroot, box.dir), "the box's folder is still bound in the chroot"
    assert not box_hosts_in_chroot(cb.chroot, box.plan.spec.name)
    mounts = subprocess.run(["findmnt", "-rn", "-o", "TARGET"], text=True, capture_output=True,
                            check=True).stdout.split()
    shared = [m for m in mounts if m.startswith(str(cb.chroot) + "/")]
    # the chroot's shared mounts stay only while something else (the loopback pool, another
    # box) runs in it
    assert not shared or _chroot_pids_in(cb.chroot, None), (
        f"mounts left under the chroot with nobody using it: {shared}")


def _pool_on_rack_b(box: Box) -> tuple[BoxCondor, set[str]]:
    """HTCondor on ``box``, a manager on its manager host, a pool for rack B submitted from
    there; returns the pool and the box's network namespaces (to check what is left)."""
    t0 = time.monotonic()
    cb: BoxCondor = start_condor(box, timeout_s=60)
    slots = cb.slots()
    slots_s = time.monotonic() - t0
    assert {(s.machine, s.rack, s.host) for s in slots} == {
        ("a1.box", "A", "a1.box"), ("b1.box", "B", "b1.box")}
    assert {s.auth for s in slots} == {"IDTOKENS"}  # startds across hosts: tokens, not FS
    nets = _nets(box)

    password = box.dir / "vine.password"
    password.write_text(secrets.token_hex(16))
    password.chmod(0o600)
    out = box.dir / "manager.json"
    box.start("mgr", [sys.executable, "-c", MANAGER, str(PORT), str(password), str(out), "1",
                      "90"], name="manager")
    datavine = str(Path(sys.executable).parent / "datavine")
    t1 = time.monotonic()
    started = box.run("mgr", [datavine, "pool", "start", "--batch", "condor", "--workers", "1",
                              "--rack", "B", "--manager", f"mgr.box:{PORT}", "--password",
                              str(password), "--name", "rack-b", "--idle-timeout", "60"],
                      env=cb.env(), check=False, timeout_s=60)
    assert started.returncode == 0, started.stderr
    assert _wait_file(out, 100), f"the manager never wrote {out}\n{cb.logs()}"
    worker_s = time.monotonic() - t1
    workers = json.loads(out.read_text())["workers"]
    assert len(workers) == 1, f"no worker connected to the manager on mgr.box\n{cb.logs()}"
    worker = workers[0]
    assert worker["addrport"].split(":")[0] == box.plan.host("b1").address == "198.18.12.11"
    assert worker["hostname"] == "b1.box"
    assert "rack:B" in worker["features"]
    submit = (cb.pool_dir / "condor" / "rack-b" / "condor.submit").read_text()
    assert 'requirements = (DatavineRack == "B")' in submit

    # the figures (pytest -rP shows them): start to slots, submit to connected worker
    print(f"box HTCondor: slots {slots_s:.1f} s after start; worker connected "
          f"{worker_s:.1f} s after 'datavine pool start'")
    stopped = box.run("mgr", [datavine, "pool", "stop", "--name", "rack-b"], env=cb.env(),
                      check=False, timeout_s=90)
    assert stopped.returncode == 0, stopped.stderr

    return cb, nets
