"""The worker registry: free slots per worker, targets for placement decisions, lost workers."""

from __future__ import annotations

from datavine.scheduler.labels import rack_of
from datavine.scheduler.placement import Placement, TaskInputs, Tier, decide
from datavine.scheduler.topology import ANYWHERE, Target, Topology


def two_racks() -> Topology:
    topo = Topology(bundles_per_core=2)
    for i in range(4):
        topo.announce(f"local-{i}", rack_of(i, 4, ("a", "b")), cores=1)
    return topo


def test_workers_are_split_into_rack_blocks() -> None:
    assert [rack_of(i, 4, ("a", "b")) for i in range(4)] == ["a", "a", "b", "b"]
    assert rack_of(5, 4, ("a", "b")) in ("a", "b")  # a replacement worker still gets a rack
    assert rack_of(0, 4, ()) is None


def test_free_slots_count_bundles_sent_to_a_worker_and_its_rack() -> None:
    topo = two_racks()
    topo.sent(Target(worker="local-0"))
    topo.sent(Target(worker="local-0"))
    topo.sent(Target(rack="b"))
    free = {v.id: v.free_slots for v in topo.views()}
    assert free == {"local-0": 0, "local-1": 2, "local-2": 1, "local-3": 1}
    topo.returned(Target(worker="local-0"))
    assert {v.id: v.free_slots for v in topo.views()}["local-0"] == 1


def test_a_rack_decision_targets_the_best_named_worker() -> None:
    topo = two_racks()
    task = TaskInputs(("f1",), {"f1": "b"})
    placement = decide(task, topo.views(), waited_s=0.0)
    assert placement.action == "run" and placement.tier == Tier.RACK
    target = topo.target(placement)
    assert target.worker in ("local-2", "local-3")
    assert target.features() == [f"worker:{target.worker}"]


def test_files_read_make_a_worker_the_cached_choice() -> None:
    topo = two_racks()
    topo.learn("local-3", "b", "127.0.0.1:9003", ["f1"])
    placement = decide(TaskInputs(("f1",), {"f1": "b"}), topo.views(), waited_s=0.0)
    assert placement.tier == Tier.CACHED and topo.target(placement) == Target(worker="local-3")


def test_unnamed_pool_workers_are_targeted_through_their_rack() -> None:
    topo = Topology()
    known = topo.learn(None, "b", "10.0.0.7:9123", ["f1"])
    assert known is not None and known.id == "10.0.0.7:9123" and not known.named
    placement = decide(TaskInputs(("f1",), {"f1": "b"}), topo.views(), waited_s=0.0)
    assert topo.target(placement) == Target(rack="b")
    assert topo.target(Placement("run", Tier.FAR)) == ANYWHERE
    assert ANYWHERE.features() == []


def test_workers_that_left_are_forgotten() -> None:
    topo = two_racks()
    topo.learn("local-1", "a", "127.0.0.1:9001")
    topo.learn("local-2", "b", "127.0.0.1:9002")
    assert topo.forget_missing({"127.0.0.1:9002"}) == ["local-1"]
    assert "local-1" not in topo.workers and "local-0" in topo.workers  # no address yet: kept
