"""No silent stalls from the network, on the box: with the racks cut from each other (a
firewall that drops; the manager host still reaches every host), a worker that would fetch
the library's files from a peer in the other rack waited for TCP's connect timeout (~130 s)
with its library "sent" and never started, and the summary said nothing.

Each run is bounded (``--timeout 100``, below that timeout), so a stall fails the test."""

from __future__ import annotations

import json
import sys
from collections.abc import Callable
from pathlib import Path

import pytest

from datavine.deploy.box.net import Box
from tests.fixtures_box import BOX_EVENTS as EVENTS
from tests.fixtures_box import BOX_FILES as FILES

pytestmark = [pytest.mark.box, pytest.mark.taskvine, pytest.mark.xcache]


BOUND_S = 100  # the whole run; TCP gives a peer that drops up to ~130 s



def run_cut(box: Box, data: Path, run_settings: str = "") -> dict:
    """Hand-started workers (one per rack host), the racks cut, ``datavine run`` on the
    manager host; its JSON record."""
    from datavine.deploy.box.facility import start_workers

    facility = box.dir / "facility-cut.toml"
    facility.write_text((box.dir / "facility.toml").read_text()
                        + (f"\n[run]\n{run_settings}\n" if run_settings else ""))
    start_workers(box)
    box.cut_racks()
    record = box.dir / "run.json"
    argv = [str(Path(sys.executable).parent / "datavine"), "run", "--facility", str(facility),
            "--pool-workers", "2", "--data", str(data), "--files", str(FILES),
            "--events", str(EVENTS), "--no-progress", "--json", str(record),
            "--timeout", str(BOUND_S)]
    done = box.run("mgr", argv, timeout_s=BOUND_S + 60, check=False)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    return json.loads(record.read_text())


def test_racks_cut_the_library_comes_from_the_manager_and_both_racks_work(
        make_box: Callable[..., Box], box_data: Path, xcache_tools: None) -> None:
    box = make_box(racks=2, hosts_per_rack=1, data=box_data)
    record = run_cut(box, box_data)
    assert record["events"] == FILES * EVENTS
    summary = record["summary"]
    # both racks' workers ran bundles: neither waited for a peer it cannot reach
    assert set(summary["hosts"]) == {"a1.box", "b1.box"}, summary["hosts"]
    assert summary["network"] == []


def test_a_worker_whose_library_does_not_start_is_dropped_and_the_summary_says_so(
        make_box: Callable[..., Box], box_data: Path, xcache_tools: None) -> None:
    """With the library's files shared between peers (TaskVine's default), the second
    worker fetches them from the first, across the cut: it is dropped after the bound and
    the run goes on without it."""
    box = make_box(racks=2, hosts_per_rack=1, data=box_data)
    record = run_cut(box, box_data, "library_from_peers = true\nlibrary_start_timeout_s = 5")
    assert record["events"] == FILES * EVENTS
    network = record["summary"]["network"]
    dropped = [n for n in network if "did not start within 5 s" in n["failed"]]
    assert dropped, network
    worker = dropped[0]
    assert (worker["worker"], worker["host"]) in {("w-a1", "a1.box"), ("w-b1", "b1.box")}
    assert "dropped: its host blocked" in worker["done"]
    assert any("peer transfers off" in n["done"] for n in network), network
    # the other rack's worker ran every bundle
    other = "b1.box" if worker["host"] == "a1.box" else "a1.box"
    assert set(record["summary"]["hosts"]) == {other}, record["summary"]["hosts"]
