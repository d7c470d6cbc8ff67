"""The facility model (datavine.apps.sim): its pieces, and datavine's decisions running on it.

Small facilities only: every test runs in well under a second of real time. Assertions are
on simulated results (bytes, placement, link use, completion time), never on real timing.
"""

from __future__ import annotations

import pytest

from datavine.apps.sim import FacilitySpec, ManagerCost, ShardSpec, SimConfig, Workload, simulate
from datavine.apps.sim.driver import workload_graph
from datavine.apps.sim.events import EventQueue
from datavine.apps.sim.network import Network
from datavine.apps.sim.spec import GBPS
from datavine.apps.sim.taskvine import SimTaskVine, SimWorker
from datavine.config import RunConfig
from datavine.scheduler.memory import MemoryPolicy

FREE = ManagerCost(dispatch_s=0.0, result_s=0.0, latency_s=0.0, start_s=0.0, decision_s=0.0)


def test_events_run_in_time_order_then_insertion_order() -> None:
    q = EventQueue()
    seen: list[str] = []
    q.at(2.0, seen.append, "c")
    q.at(1.0, seen.append, "a")
    q.at(1.0, seen.append, "b")
    q.run(lambda: False, max_time=10.0)
    assert seen == ["a", "b", "c"] and q.now == 2.0


def test_max_min_fair_share_with_demands() -> None:
    net = Network({"l": 10.0})
    small = net.flow_class("small", [("l", 1.0)], demand=2.0)
    big = net.flow_class("big", [("l", 1.0)], demand=100.0)
    net.add(small, 4.0)
    net.add(big, 100.0)
    net.add(big, 100.0)
    net.share()
    assert small.rate == 2.0  # below the fair share: gets its demand
    assert big.rate == pytest.approx(4.0)  # the rest, split between its two flows
    assert net.link_rate("l") == pytest.approx(10.0)
    assert net.next_completion() == pytest.approx(2.0)  # small: 4 bytes at 2 bytes/s
    net.advance(2.0)
    assert [cls.key for cls, _ in net.finished()] == ["small"]
    net.share()
    assert big.rate == pytest.approx(5.0)


def test_weighted_link_use_counts_block_overhead() -> None:
    net = Network({"wan": 11.6, "nic": 100.0})
    miss = net.flow_class("miss", [("nic", 1.0), ("wan", 1.16)], demand=50.0)
    net.add(miss, 10.0)
    net.share()
    assert miss.rate == pytest.approx(10.0)  # 10 B/s x 1.16 fills 11.6 B/s of WAN


def test_taskvine_honours_features_and_serves_the_oldest_call_first() -> None:
    q = EventQueue()
    started: list[tuple[int, str]] = []
    workers = [SimWorker("a0", "A", 1), SimWorker("b0", "B", 1)]
    tv = SimTaskVine(q, workers, FREE, lambda c, t: started.append((c.payload, c.ran_on.id)),
                     lambda c, t: None)
    first = tv.submit(1, worker="b0")
    tv.submit(2, rack="B")          # b0 is busy: waits for rack B
    tv.submit(3)                    # anywhere: a0 is free
    tv.submit(4, rack="A")          # waits for a0
    q.run(lambda: False, 1.0)
    assert started == [(1, "b0"), (3, "a0")]
    tv.finish(first)
    q.run(lambda: False, 2.0)
    assert started[-1] == (2, "b0")  # the rack-B call, not the one for rack A


def test_workload_graph_is_files_then_a_merge_tree() -> None:
    graph, lfns = workload_graph(20, 8)
    assert len(lfns) == 20 and len(graph.outputs) == 1
    assert sum(1 for k in graph.nodes if k[0] == "merge") == 3 + 1  # 20 -> 3 -> 1
    assert all(graph.dependencies[("process-file", i)] == frozenset() for i in range(20))


def _two_racks(link_gbps: float, **kw: object) -> FacilitySpec:
    shards = (ShardSpec("x0", "rack-a", 100.0), ShardSpec("x1", "rack-b", 100.0))
    return FacilitySpec(racks=("rack-a", "rack-b"), workers_per_rack=4, cores_per_worker=4,
                        shards=shards, inter_rack_gbps=link_gbps, **kw)  # type: ignore[arg-type]


def _load(files: int = 400) -> Workload:
    # 32 cores x 1 Gbps of demand each: 32 Gbps, half of it across racks when blind
    return Workload(n_files=files, events_per_file=100_000, spread=0.3,
                    bytes_per_event=GBPS / 1e3 / 10 / 100, khz_per_core=10.0 * 100, seed=3)


def test_blind_placement_saturates_a_thin_inter_rack_link_and_datavine_stays_near() -> None:
    facility, work = _two_racks(link_gbps=8.0), _load()
    blind = simulate(facility, work, "blind", SimConfig(cost=FREE))
    near = simulate(facility, work, "datavine", SimConfig(cost=FREE))
    for r in (blind, near):
        assert len(r.file_done_s) == work.n_files
        assert r.bytes_total == pytest.approx(sum(_sizes(work)), rel=1e-6)
    assert blind.link_utilisation_peak > 0.99 and blind.link_utilisation > 0.9
    assert 0.35 < blind.near_fraction < 0.65
    assert near.near_fraction == 1.0 and near.link_utilisation < 0.05
    assert near.gbps_sustained > 1.3 * blind.gbps_sustained
    assert near.placement.get("rack", 0) == work.n_files
    assert blind.placement == {"anywhere": work.n_files}


def _sizes(work: Workload) -> list[float]:
    from datavine.apps.sim.driver import SimRun

    run = SimRun(FacilitySpec.small(), work)
    return [e * work.bytes_per_event for e in run.events]


def test_completion_time_of_a_cpu_bound_run_is_the_work_plus_per_bundle_costs() -> None:
    cost = ManagerCost(dispatch_s=0.001, result_s=0.001, latency_s=0.003, start_s=0.001,
                       decision_s=0.0)
    work = Workload(n_files=10, events_per_file=100_000, spread=0.0, bytes_per_event=100.0,
                    khz_per_core=100.0, merge_s=0.01)
    r = simulate(FacilitySpec.small(workers=1, cores=1), work, "datavine", SimConfig(cost=cost))
    per_file = 1.0 + 0.001 + 0.003 + 0.001 + 0.001  # work, dispatch, latency, start, result
    # 10 files one after another; the 2 merges travel in the bundles of the last files
    assert r.wall_s == pytest.approx(10 * per_file + 2 * 0.01, rel=0.01)
    assert r.busy_fraction > 0.9 and r.near_fraction == 1.0


def test_equal_shares_make_the_slowest_xcache_node_the_bottleneck() -> None:
    shards = (ShardSpec("x0", "rack-a", 2.0), ShardSpec("x1", "rack-a", 30.0))
    base = FacilitySpec(racks=("rack-a",), workers_per_rack=4, cores_per_worker=4,
                        shards=shards)
    work = _load(300)
    equal = simulate(base, work, "datavine", SimConfig(cost=FREE))
    weighted = simulate(FacilitySpec(racks=base.racks, workers_per_rack=4, cores_per_worker=4,
                                     shards=shards, weighted=True), work, "datavine",
                        SimConfig(cost=FREE))
    assert weighted.wall_s < 0.7 * equal.wall_s


def test_memory_overruns_are_retried_under_a_larger_cap_by_datavines_policy() -> None:
    policy = MemoryPolicy(default_mb=512, floor_mb=256, ceiling_mb=4096, step_mb=64)
    work = Workload(n_files=30, events_per_file=100_000, spread=0.0, bytes_per_event=10.0,
                    khz_per_core=1000.0, peak_mb=700.0)
    r = simulate(FacilitySpec.small(workers=2, cores=2), work, "datavine",
                 SimConfig(run=RunConfig(memory=policy), cost=FREE))
    assert r.overruns >= 1 and len(r.file_done_s) == 30


def test_bad_mode_is_refused() -> None:
    with pytest.raises(ValueError, match="mode"):
        simulate(FacilitySpec.small(), Workload(n_files=1), "fastest")
