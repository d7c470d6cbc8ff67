"""The dispatcher: room per slot, delay scheduling towards a busy rack, crashed bundles
anywhere; pure, with the clock passed in."""

from __future__ import annotations

from typing import Any

from datavine.io.shards import ShardHealth, ShardMap
from datavine.scheduler import graph as graphs
from datavine.scheduler.bundling import CostModel, Planner
from datavine.scheduler.dispatch import Dispatcher
from datavine.scheduler.placement import PlacementPolicy, Tier
from datavine.scheduler.topology import ANYWHERE, Topology


def reader(path: str) -> int:
    return len(path)


def setup(n: int, *, policy: PlacementPolicy | None) -> tuple[Dispatcher, Topology]:
    dsk: dict[Any, Any] = {("read", i): (reader, f"/store/f{i}.root") for i in range(n)}
    graph = graphs.build(dsk, list(dsk))
    from datavine.scheduler.inputs import task_files

    files = {k: task_files(node) for k, node in graph.nodes.items()}
    planner = Planner(graph, files=files.__getitem__, costs=CostModel(), target_s=1.0,
                      max_tasks=1)
    topology = Topology(bundles_per_core=1)
    topology.announce("a0", "A", 1)  # one worker in rack A, none in B
    shardmap = ShardMap.from_urls(["root://a:1", "root://b:1"], racks=["A", "B"])
    return Dispatcher(planner, topology, policy, shardmap, ShardHealth(), 1), topology


def test_fill_uses_only_the_free_room() -> None:
    dispatch, _ = setup(10, policy=None)
    assert len(dispatch.fill(0.0, slots=3, inflight=1)) == 2
    assert dispatch.fill(0.0, slots=3, inflight=3) == []
    assert all(target == ANYWHERE for _, target, _ in dispatch.fill(0.0, slots=8, inflight=0))


def test_bundle_for_a_rack_without_room_is_held_then_goes_far() -> None:
    policy = PlacementPolicy(max_wait_s=5.0, cache_wait_s=1.0)
    dispatch, _ = setup(12, policy=policy)
    sent = dispatch.fill(0.0, slots=4, inflight=0)
    racks = {t.rack or t.worker for _, t, _ in sent}
    assert racks <= {"A", "a0", None}  # near rack A, or far for rack B's files (no B worker)
    held = [b.id for b, _ in dispatch.held]
    assert len(held) > 4  # rack A is full: its other files wait (more than the next fill takes)
    later = dispatch.fill(10.0, slots=4, inflight=0)  # past max_wait_s: they go anywhere
    # the bundles held longest go first, anywhere; the rest are still held, in order
    assert [b.id for b, _, _ in later] == held[:4]
    assert all(t == ANYWHERE and p.tier == Tier.FAR and p.anywhere for _, t, p in later), later
    assert [b.id for b, _ in dispatch.held] == held[4:]


def test_crashed_bundle_goes_anywhere() -> None:
    dispatch, _ = setup(2, policy=PlacementPolicy())
    first = dispatch.planner.next_bundles(1)[0]
    dispatch.anywhere.update(first.keys)
    placement, home = dispatch.place(first, now=0.0, since=0.0)
    assert placement.action == "run" and home is None and "anywhere" in placement.reason


def test_a_bundle_goes_to_the_worker_on_its_shards_host() -> None:
    dsk: dict[Any, Any] = {("read", i): (reader, f"/store/f{i}.root") for i in range(8)}
    graph = graphs.build(dsk, list(dsk))
    from datavine.scheduler.inputs import task_files

    files = {k: task_files(node) for k, node in graph.nodes.items()}
    planner = Planner(graph, files=files.__getitem__, costs=CostModel(), target_s=1.0,
                      max_tasks=1)
    topology = Topology(bundles_per_core=4, here="mgr.box")
    topology.see([{"hostname": h, "addrport": f"10.0.0.{i}:9", "cores_total": 1,
                   "features": [f"worker:w-{h}", f"rack:{h[0].upper()}"]}
                  for i, h in enumerate(["a1.box", "a2.box", "b1.box", "b2.box"])])
    shardmap = ShardMap.from_urls(["root://a1.box:1094", "root://B1.box.:1094"],
                                  racks=["A", "B"])
    dispatch = Dispatcher(planner, topology, PlacementPolicy(), shardmap, ShardHealth(), 4)
    sent = dispatch.fill(0.0, slots=4, inflight=0)
    assert len(sent) == 8
    for bundle, target, placement in sent:
        host = shardmap.shard_for(bundle.files[0]).url.split("/")[2].split(":")[0]
        assert target.worker == f"w-{host.lower().rstrip('.')}", (bundle.files, target)
        assert placement.tier.name == "HOST"
