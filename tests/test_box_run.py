"""datavine across the box, as a user runs it: HTCondor pools land workers on the rack
hosts, ``datavine run --facility`` on the manager host reads through the rack's shard, and
the kernel's counters on the inter-rack link agree with datavine's own accounting."""

from __future__ import annotations

import json
import os
import sys
from collections.abc import Callable
from pathlib import Path

import pytest

from datavine.deploy.box.net import Box
from tests.fixtures_box import BOX_EVENTS as EVENTS
from tests.fixtures_box import BOX_FILES as FILES

pytestmark = [pytest.mark.box, pytest.mark.condor, pytest.mark.xcache, pytest.mark.taskvine,
              pytest.mark.slow]



def run_on_manager_host(box: Box, data: Path, facility: Path, *extra: str,
                        env: dict[str, str] | None = None) -> dict:
    record = box.dir / "run.json"
    argv = [str(Path(sys.executable).parent / "datavine"), "run", "--facility", str(facility),
            "--data", str(data), "--files", str(FILES), "--events", str(EVENTS),
            "--no-progress", "--json", str(record), "--timeout", "180", *extra]
    done = box.run("mgr", argv, timeout_s=300, check=False, env=env)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    return json.loads(record.read_text())


def test_condor_pools_on_rack_hosts_read_near(make_box: Callable[..., Box],
                                              box_data: Path) -> None:
    from datavine.deploy.box.condor import condor_missing, submit_env
    from datavine.deploy.box.services import shard_map

    why = condor_missing()
    if why:
        pytest.skip(why)
    box = make_box(racks=2, hosts_per_rack=1, data=box_data, condor=True)
    env = {**os.environ, **submit_env(box)}
    # placement alone: a shard judged slow on a loaded host would be read around, and a
    # backup copy on the other rack reads across it (a cancelled copy's bytes cross the
    # spine though no summary counts them: it lost)
    facility = box.dir / "facility-placed.toml"
    facility.write_text((box.dir / "facility.toml").read_text()
                        + "\n[run]\nread_around_slow_shards = false\nspeculation = false\n")
    before = box.interrack_bytes()
    record = run_on_manager_host(box, box_data, facility, env=env)
    crossed = box.interrack_bytes() - before

    assert record["events"] == FILES * EVENTS
    summary = record["summary"]
    # the workers ran on the rack hosts (HTCondor jobs), one per rack, and the manager knew
    # where each was before its first bundle: every chunk went to its shard's host
    assert set(summary["hosts"]) == {"a1.box", "b1.box"}
    placement = summary["placement"]
    assert placement.get("anywhere", 0) == 0, placement
    assert placement.get("host", 0) + placement.get("cached", 0) >= FILES, placement
    reads = summary["reads"]
    assert reads["near_fraction"] == 1.0 and reads["far_bytes"] == 0
    shards = {s.name for s in shard_map(box).shards}
    assert set(reads["by_server"]) <= shards
    # nothing read crossed racks: what did cross is control traffic and the small merge
    data_bytes = reads["near_bytes"]
    assert crossed < 0.05 * data_bytes, (crossed, data_bytes)


def test_blind_placement_crosses_racks_and_the_counts_agree(make_box: Callable[..., Box],
                                                            box_data: Path) -> None:
    """With placement off, reads cross the spine; datavine's count of far bytes matches the
    kernel's count of bytes across racks (within 10%: TCP/IP and XRootD framing)."""
    from datavine.deploy.box.facility import start_workers

    box = make_box(racks=2, hosts_per_rack=1, data=box_data)
    facility = box.dir / "facility-blind.toml"
    facility.write_text((box.dir / "facility.toml").read_text()
                        + "\n[placement]\nenabled = false\n")
    start_workers(box)  # by hand, each saying its rack
    before = box.interrack_bytes()
    record = run_on_manager_host(box, box_data, facility, "--pool-workers", "2")
    crossed = box.interrack_bytes() - before
    reads = record["summary"]["reads"]
    assert record["events"] == FILES * EVENTS
    if reads["far_bytes"] == 0:
        pytest.skip("placement off happened to put every chunk near its shard this time")
    assert 0.9 <= reads["far_bytes"] / crossed <= 1.1, (reads["far_bytes"], crossed)


def test_pools_started_on_their_own_hosts_say_their_racks(make_box: Callable[..., Box],
                                                          box_data: Path) -> None:
    """The issue's case: `datavine pool start --batch local --rack R` run on each rack host
    with a pool folder of its own (execute nodes share no files with the manager): the
    manager learns each worker's rack when it connects, so no chunk goes "anywhere"."""
    from datavine.deploy.box.facility import password_file

    box = make_box(racks=2, hosts_per_rack=1, data=box_data)
    datavine = str(Path(sys.executable).parent / "datavine")
    pools = {h: box.dir / f"pools-{h}" for h in ("a1", "b1")}
    try:
        for host, folder in pools.items():
            box.run(host, [datavine, "pool", "start", "--batch", "local", "--workers", "1",
                           "--rack", host[0].upper(), "--manager", "mgr.box:9123",
                           "--password", str(password_file(box)), "--name", f"rack-{host}",
                           "--pool-dir", str(folder)], timeout_s=60)
        record = run_on_manager_host(box, box_data, box.dir / "facility.toml",
                                     "--pool-workers", "2")
    finally:
        for host, folder in pools.items():
            box.run(host, [datavine, "pool", "stop", "--name", f"rack-{host}", "--pool-dir",
                           str(folder)], timeout_s=60, check=False)
    summary = record["summary"]
    assert record["events"] == FILES * EVENTS
    assert set(summary["hosts"]) == {"a1.box", "b1.box"}
    assert summary["placement"].get("anywhere", 0) == 0, summary["placement"]
    assert summary["reads"]["near_fraction"] == 1.0
