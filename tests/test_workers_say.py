"""Workers say where they are: real vine_workers, and the manager knows each one's name, rack
and host from TaskVine's list of workers when it connects, before any bundle ran on it (no
announcement, no shared file, no result)."""

from __future__ import annotations

from pathlib import Path

import dask
import pytest
from dask import delayed

from datavine.config import ManagerConfig
from datavine.manager.cluster import LocalCluster
from datavine.manager.listen import local_host
from datavine.scheduler.racks import RackMap

pytestmark = pytest.mark.taskvine


def test_the_manager_learns_names_racks_and_hosts_at_connect(tmp_path: Path) -> None:
    with LocalCluster(workers=2, racks=("A", "B"), manager=ManagerConfig(run_dir=tmp_path),
                      warm_up=False) as cluster:
        rt = cluster.runtime
        entries = rt.manager.status("workers")
        if not all("features" in e for e in entries):
            pytest.skip("this TaskVine lists no features (build it with "
                        "scripts/patches/cctools)")
        for wid in list(rt.topology.workers):  # what LocalCluster announced: forget it
            rt.topology.forget(wid)
        rt.watch.look_again()  # the next look reads the worker list
        assert rt.drop_lost_workers() == (set(), set())
        known = {w.id: (w.named, w.rack, w.host, w.cores, bool(w.addrport))
                 for w in rt.topology.workers.values()}
        assert known == {"local-0": (True, "A", local_host(), 1, True),
                         "local-1": (True, "B", local_host(), 1, True)}


def test_a_rack_map_places_workers_that_name_no_rack(tmp_path: Path) -> None:
    # local workers connect over loopback: they are on this host, which the map puts in C
    racks = RackMap.of({"C": [local_host()]})
    with LocalCluster(workers=1, manager=ManagerConfig(run_dir=tmp_path), warm_up=False,
                      racks=()) as cluster:
        rt = cluster.runtime
        rt.topology.racks = racks
        for wid in list(rt.topology.workers):
            rt.topology.forget(wid)
        rt.watch.look_again()  # the next look reads the worker list
        rt.drop_lost_workers()
        (worker,) = rt.topology.workers.values()
        assert (worker.rack, worker.host) == ("C", local_host())
        (total,) = dask.compute(delayed(sum)([1, 2, 3]), scheduler=cluster.get)
        assert total == 6 and len(rt.topology.workers) == 1  # its result names the same one
