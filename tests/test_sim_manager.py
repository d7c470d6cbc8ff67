"""The facility model's manager as a resource that saturates (datavine.apps.sim.manager), and
the steady state of a run (datavine.apps.sim.steady): which resource stops it.

Small facilities, simulated time only: assertions are on simulated figures, never on how
long the simulation takes here.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import replace

import pytest

from datavine.apps.sim import FacilitySpec, ManagerCost, ShardSpec, SimConfig, SimRun, Workload
from datavine.apps.sim.events import EventQueue
from datavine.apps.sim.manager import ManagerHost, Server
from datavine.apps.sim.results import Window
from datavine.apps.sim.spec import GBPS
from datavine.apps.sim.steady import (
    demand_gbps,
    manager_s_per_bundle,
    steady_state,
    warmup_for,
    window_files,
)
from datavine.config import RunConfig


def _log(q: EventQueue, done: list[tuple[str, float]], name: str) -> Callable[[], None]:
    return lambda: done.append((name, q.now))


def test_a_server_takes_its_queues_in_turn_and_counts_the_work_done() -> None:
    q = EventQueue()
    cpu = Server(q, ("result", "send"))
    done: list[tuple[str, float]] = []
    for i in range(3):
        cpu.submit(1.0, _log(q, done, f"r{i}"), "result")
    cpu.submit(1.0, _log(q, done, "s0"), "send")  # waits for one result, not all three
    q.run(lambda: False, max_time=2.5)
    assert cpu.done_by(2.5) == pytest.approx(2.5) and cpu.charged_s == 4.0
    q.run(lambda: False, max_time=100.0)
    assert done == [("r0", 1.0), ("s0", 2.0), ("r1", 3.0), ("r2", 4.0)]
    q.at(10.0, cpu.submit, 1.0)  # idle from 4 to 10
    q.run(lambda: False, max_time=10.5)
    assert cpu.done_by(10.5) == pytest.approx(4.5)


def test_the_managers_nic_carries_results_in_before_its_core_and_calls_out_after() -> None:
    q = EventQueue()
    host = ManagerHost(q, nic_bytes_per_s=100.0)
    done: list[tuple[str, float]] = []
    host.take(cpu_s=1.0, nbytes=200.0, then=_log(q, done, "taken"))  # 2 s in, then 1 s
    host.send(cpu_s=1.0, nbytes=100.0, then=_log(q, done, "sent"))  # 1 s, then 1 s out
    q.run(lambda: False, max_time=100.0)
    assert done == [("sent", 2.0), ("taken", 3.0)]  # the core was free for the call at 0
    assert host.nic_bytes == 300.0 and host.result_bytes == 200.0 and host.sent_bytes == 100.0
    assert host.nic_in.done_by(q.now) == 2.0 and host.nic_out.done_by(q.now) == 1.0
    free = ManagerHost(q)  # NIC not modelled: bytes counted, no time
    free.take(cpu_s=0.5, nbytes=1e9, then=_log(q, done, "free"))
    q.run(lambda: False, max_time=1000.0)
    assert done[-1] == ("free", pytest.approx(q.now)) and free.nic_in.charged_s == 0.0
    assert free.nic_bytes == 1e9
    with pytest.raises(ValueError, match="NIC"):
        ManagerHost(q, -1.0)


def _facility(**kw: object) -> FacilitySpec:
    shards = (ShardSpec("x0", "rack-a", 100.0), ShardSpec("x1", "rack-b", 100.0))
    return FacilitySpec(racks=("rack-a", "rack-b"), workers_per_rack=4, cores_per_worker=4,
                        shards=shards, inter_rack_gbps=100.0, **kw)  # type: ignore[arg-type]


# 32 cores, 1 s a file, 1 Gbps a core: 32 Gbps of demand, ~36 bundles/s with the merges
WORK = Workload(events_per_file=1000, spread=0.0, bytes_per_event=GBPS / 1000,
                khz_per_core=1.0)


def test_a_manager_that_costs_too_much_per_bundle_is_the_limit_and_costs_gbps() -> None:
    facility = _facility()
    assert demand_gbps(facility, WORK) == pytest.approx(32.0)
    free = steady_state(facility, WORK, ManagerCost.per_bundle(0.0), window_s=20, warmup_s=5)
    slow = steady_state(facility, WORK, ManagerCost.per_bundle(100.0), window_s=20,
                        warmup_s=5)
    assert free.limited_by == "none"
    assert free.gbps == pytest.approx(32.0, rel=0.03)
    assert free.window.manager_busy == 0.0 and free.manager_cores == 0.0
    assert slow.limited_by == "manager_cpu"
    assert slow.window.manager_busy > 0.95
    # 32 files/s, a bundle each, 0.1 s each: 3.2 cores; with 1/8 + 1/64 + ... = 1/7 merge
    # per file each in a bundle of its own, 3.7 (cheap merges ride in a file's bundle)
    assert 32 * 0.1 * 0.95 <= slow.manager_cores <= 32 * 8 / 7 * 0.1 * 1.05
    assert slow.gbps < 0.35 * free.gbps  # one core delivers about a quarter of the demand


def test_a_manager_within_one_core_is_busy_in_proportion_and_not_the_limit() -> None:
    st = steady_state(_facility(), WORK, ManagerCost.per_bundle(10.0), window_s=20,
                      warmup_s=5)
    assert st.limited_by == "none"
    assert 0.3 < st.window.manager_busy < 0.45  # ~36 bundles/s x 10 ms
    assert st.manager_cores == pytest.approx(st.window.manager_busy, rel=0.05)


def test_a_thin_manager_nic_is_the_limit_when_results_are_large() -> None:
    facility = _facility(manager_nic_gbps=0.08)  # 10 MB/s
    heavy = replace(WORK, result_bytes=1e6)  # 1 MB back per bundle: ~36 MB/s wanted
    st = steady_state(facility, heavy, ManagerCost.per_bundle(0.0), window_s=20, warmup_s=5)
    assert st.limited_by == "nic"
    assert st.window.nic_busy > 0.95 and st.gbps < 0.5 * st.demand_gbps
    assert st.nic_share == pytest.approx(st.window.nic_bytes / st.window.data_bytes)


def test_the_nic_counts_each_calls_spec_and_tasks_and_each_result() -> None:
    work = replace(WORK, n_files=40, result_bytes=5000.0, task_bytes=700.0)
    run = SimRun(_facility(), work, SimConfig(run=RunConfig(memory=None),
                                              cost=ManagerCost.per_bundle(1.0)))
    result = run.run()
    host = run.tv.manager
    tasks = len(run.graph.nodes)
    assert len(result.file_done_s) == 40
    assert host.result_bytes == 5000.0 * result.bundles
    assert host.sent_bytes > 700.0 * tasks + 200.0 * result.bundles  # + each spec's own
    assert result.manager_nic_bytes == host.nic_bytes


def test_a_window_names_the_most_used_saturated_resource() -> None:
    def window(**use: float) -> Window:
        base = {"manager_busy": 0.5, "link_utilisation": 0.2, "shard_utilisation": 0.3,
                "nic_busy": 0.01} | use
        return Window(t_from=0.0, t_to=10.0, gbps=100.0, cores_busy=1.0, link="inter:a|b",
                      shard="xcache:x0", nic_bytes=1.0, data_bytes=1000.0, **base)

    assert window().limited_by() == "none"
    assert window(shard_utilisation=0.97).limited_by() == "shards"
    assert window(shard_utilisation=0.97, manager_busy=0.99).limited_by() == "manager_cpu"
    assert window(link_utilisation=1.0).limited_by() == "interrack_link"
    assert window().manager_cores(200.0) == pytest.approx(1.0)
    assert window().nic_share == pytest.approx(0.001)


def test_the_hllhc_target_is_900_gbps_of_10_second_bundles() -> None:
    facility, work = FacilitySpec.hllhc(), Workload.hllhc()
    assert facility.cores == 10_000 and len(facility.racks) == 8
    assert len(facility.shards) == 32
    assert demand_gbps(facility, work) == pytest.approx(900.0)
    assert work.core_s_per_file == pytest.approx(10.0)
    # a file is 112.5 MB: ~200 TB is ~1.78M files, 30 minutes of 10,000 cores
    file_bytes = work.events_per_file * work.bytes_per_event
    assert file_bytes == pytest.approx(112.5e6)
    assert facility.cores * 1800 / work.core_s_per_file == pytest.approx(200e12 / file_bytes,
                                                                         rel=0.02)
    # the window's files outlast it at full rate, with the calls submitted ahead
    assert window_files(facility, work, 90.0, 2) > facility.cores * 9 + 2 * facility.cores
    assert manager_s_per_bundle(ManagerCost.per_bundle(4.47)) == pytest.approx(0.00447)
    # the warm-up: 3 bundles, or until the 20,000 calls submitted at the start went out
    assert warmup_for(facility, work, ManagerCost.per_bundle(1.0), 2) == pytest.approx(30.0)
    assert warmup_for(facility, work, ManagerCost.per_bundle(4.47), 2) == pytest.approx(
        1.2 * 20_000 * 0.00447)


def test_a_steady_state_refuses_an_empty_window() -> None:
    with pytest.raises(ValueError, match="window"):
        steady_state(_facility(), WORK, ManagerCost(), window_s=0.0)


def test_the_hllhc_model_adds_the_loops_housekeeping_once_not_per_bundle() -> None:
    """``benchmarks/facility_model.py --hllhc``: the manager's per-second housekeeping, scaled
    to the facility's workers, is added to the cores its bundles take, in the table and the
    last line; a per-bundle cost charges bundles only."""
    import sys
    from pathlib import Path

    sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "benchmarks"))
    import facility_model as model  # the benchmark's own, with its folder's ``common``

    hllhc = FacilitySpec.hllhc()
    assert len(hllhc.workers()) == 400
    # 1.82 ms a second at 256 workers: 2.84 ms a second at 400
    assert model.housekeeping_cores(1.82, hllhc) == pytest.approx(1.82e-3 * 400 / 256)
    assert model.housekeeping_cores(0.0, hllhc) == 0.0
    st = steady_state(_facility(), WORK, ManagerCost.per_bundle(10.0), window_s=20,
                      warmup_s=5)
    pairs = model.hllhc_pairs(st, 0.25)
    assert pairs["manager_cores_hllhc"] == pytest.approx(st.manager_cores + 0.25, abs=1e-3)
    assert pairs["manager_housekeeping_cores_hllhc"] == 0.25
    row = model.hllhc_table([(10.0, st, 1.0)], 0.25).splitlines()[-1].split(" | ")
    assert row[5:8] == [f"{st.manager_cores:.3f}", "0.250", f"{st.manager_cores + 0.25:.2f}"]
