"""The facility model (datavine.apps.sim): its pieces, and datavine's decisions running on it.

Small facilities only: every test runs in well under a second of real time. Assertions are
on simulated results (bytes, placement, link use, completion time), never on real timing.
"""

from __future__ import annotations

import json
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest

from datavine.apps.sim import (
    FacilitySpec,
    ManagerCost,
    ShardSpec,
    SimConfig,
    SimRun,
    Workload,
    simulate,
)
from datavine.apps.sim.box import BoxGeometry, predict_box
from datavine.apps.sim.calibration import (
    Calibration,
    CalibrationError,
    calibration_from_record,
    combine,
    load_calibration,
    save_calibration,
)
from datavine.apps.sim.driver import FILE_CATEGORY, workload_graph
from datavine.apps.sim.events import EventQueue
from datavine.apps.sim.network import Network
from datavine.apps.sim.spec import GBPS
from datavine.apps.sim.taskvine import SimTaskVine, SimWorker
from datavine.config import RunConfig
from datavine.io.shards import Shard, ShardMap
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
    from datavine.scheduler.run_messages import Submit

    policy = MemoryPolicy(default_mb=512, floor_mb=256, ceiling_mb=4096, step_mb=64)
    work = Workload(n_files=30, events_per_file=100_000, spread=0.0, bytes_per_event=10.0,
                    khz_per_core=1000.0, peak_mb=700.0)  # every file's task peaks at 700 MB
    sim = SimRun(FacilitySpec.small(workers=2, cores=2), work,
                 SimConfig(run=RunConfig(memory=policy), cost=FREE))
    caps: dict[Any, list[float | None]] = {}  # task -> the cap of each bundle it went out in
    handle = sim.state.handle

    def spy(*events: Any) -> Any:
        out = handle(*events)
        for ins in out:
            if isinstance(ins, Submit):
                for key in ins.keys:
                    caps.setdefault(key, []).append(ins.cap_mb)
        return out

    sim.state.handle = spy  # type: ignore[method-assign]
    r = sim.run()
    assert r.overruns >= 1 and len(r.file_done_s) == 30
    assert sim.state.summary.retries == r.overruns
    retried = {k: c for k, c in caps.items() if len(c) > 1}
    assert retried, "no task went out twice"
    for key, tries in retried.items():  # once: from the default cap to one above the peak
        assert len(tries) == 2 and tries[0] == 512 and tries[1] >= 700, (key, tries)
    files = [k for k in caps if k[0] == FILE_CATEGORY]
    assert len(files) == 30 and all(caps[k][-1] >= 700 for k in files)  # each ran under its peak


def test_bad_mode_is_refused() -> None:
    with pytest.raises(ValueError, match="mode"):
        simulate(FacilitySpec.small(), Workload(n_files=1), "fastest")


# --- the box: calibration and prediction ---------------------------------------------------
def _calibration(**overrides: object) -> Calibration:
    figures: dict[str, object] = dict(
        compression="zstd", events_per_file=100_000, cpu_s_per_event=1.5e-6,
        bytes_per_event=91.0, file_bytes_per_event=108.0, manager_s_per_bundle=0.001,
        library_start_s=0.3, first_call_s=0.4, library_wait_s=0.8, merge_s=1e-4,
        peak_mb=145.0, host_cores=2, workers=2, reading="xcache-testbed")
    figures.update(overrides)
    return Calibration(**figures)  # type: ignore[arg-type]


def _record(chunk_s: float, completions: list[tuple[float, str, str]], workers: int = 2,
            cluster_s: float = 0.3) -> dict[str, object]:
    """A ``datavine run --json`` record as the calibration reads it (4 files of 100k)."""
    return {"events": 400_000, "wall_s": 1.0, "setup_s": {"cluster": cluster_s},
            "data": {"files": 4, "events_per_file": 100_000, "chunk_events": 100_000,
                     "compression": "zstd", "bytes": 4 * 10_800_000},
            "reading": {"mode": "xcache-testbed"},
            "summary": {"workers": workers,
                        "categories": {"agc-chunk": {"tasks": 4, "seconds": 4 * chunk_s,
                                                     "peak_mb": 140.0},
                                       "agc-merge": {"tasks": 1, "seconds": 0.001}},
                        "reads": {"near_bytes": 30_000_000, "far_bytes": 6_400_000},
                        "completions": completions}}


def test_calibration_reads_a_run_record_and_a_pool_runs_library_wait() -> None:
    # two workers, two chunks each: first ends at 0.6 s, the next 0.2 s later
    done = [(0.6, "agc-chunk-0", "w0"), (0.8, "agc-chunk-1", "w0"),
            (0.6, "agc-chunk-2", "w1"), (0.8, "agc-chunk-3", "w1")]
    cal = calibration_from_record(_record(0.19, done), host_cores=2)
    assert cal.cpu_s_per_event == pytest.approx(0.19 / 100_000)
    assert cal.manager_s_per_bundle == pytest.approx(0.01)  # 0.2 s cycle - 0.19 s of work
    assert cal.first_call_s == pytest.approx(0.4)  # 0.6 s to the first end - a 0.2 s cycle
    assert cal.bytes_per_event == pytest.approx(36_400_000 / 400_000)
    assert cal.library_start_s == pytest.approx(0.3) and cal.library_wait_s == 0.0
    # four workers on two cores: each had half a core, so the work was half its time
    slow = [(2 * t, key, w) for t, key, w in done]  # everything took twice as long
    crowded = calibration_from_record(_record(0.38, slow, workers=4), host_cores=2)
    assert crowded.cpu_s_per_event == pytest.approx(0.19 / 100_000)
    # the pool run's first bundles end 1.5 s in: 0.8 s more than library + first call
    pool = [(1.5, "agc-chunk-0", "p0"), (1.7, "agc-chunk-1", "p0")]
    with_pool = calibration_from_record(_record(0.19, done), 2, _record(0.19, pool))
    assert with_pool.library_wait_s == pytest.approx(1.5 - 0.2 - 0.3 - 0.4)


def test_a_calibration_round_trips_through_json(tmp_path: Path) -> None:
    cal = _calibration(runs=3, measured_at="2026-11-25T08:00:00Z")
    path = save_calibration(cal, tmp_path / "calibration.json")
    assert load_calibration(path) == cal
    assert json.loads(path.read_text())["cpu_s_per_event"] == 1.5e-6
    assert load_calibration(tmp_path / "none.json") is None
    (tmp_path / "bad.json").write_text('{"compression": "zstd"}')
    with pytest.raises(CalibrationError, match="lacks"):
        load_calibration(tmp_path / "bad.json")


def test_calibrations_combine_by_the_median_of_each_figure() -> None:
    runs = [_calibration(cpu_s_per_event=x) for x in (1e-6, 3e-6, 2e-6)]
    combined = combine(runs)
    assert combined.cpu_s_per_event == 2e-6 and combined.runs == 3
    with pytest.raises(CalibrationError, match="different kinds"):
        combine([_calibration(), _calibration(compression="lzma")])


def test_shared_cores_slow_every_worker_of_the_box() -> None:
    # CPU-bound (no link in the way): 4 one-core workers on 2 real cores take twice as
    # long for their work as on 4 cores; the libraries' start is charged to the same cores
    cal = _calibration(library_start_s=0.0, first_call_s=0.0, library_wait_s=0.0,
                       manager_s_per_bundle=0.0)
    box = BoxGeometry(link_mbit=1e6, files=16, warm_libraries=True)
    two = predict_box(box, cal, "blind", seeds=2)
    four = predict_box(replace(box, host_cores=4), cal, "blind", seeds=2)
    work = 16 * 100_000 * 1.5e-6  # core-seconds
    assert four.run_time_s == pytest.approx(work / 4, rel=0.05)
    assert two.run_time_s == pytest.approx(work / 2, rel=0.05)


def test_a_workers_first_call_waits_for_its_library_then_shares_the_cores() -> None:
    work = Workload(n_files=1, events_per_file=100_000, spread=0.0, bytes_per_event=100.0,
                    khz_per_core=100.0, startup_s=0.5, startup_wait_s=0.8, merge_fanin=8)
    facility = replace(FacilitySpec.small(workers=1, cores=1), host_cores=1.0)
    r = simulate(facility, work, "datavine", SimConfig(cost=FREE))
    assert r.wall_s == pytest.approx(0.8 + 0.5 + 1.0, rel=0.01)


def test_a_slower_inter_rack_link_slows_blind_placement_and_not_datavine() -> None:
    cal = _calibration()
    times = {}
    for mbit in (800.0, 200.0, 50.0):
        box = BoxGeometry(link_mbit=mbit)
        times[mbit] = (predict_box(box, cal, "blind").run_time_s,
                       predict_box(box, cal, "datavine").run_time_s)
    assert times[800.0][0] < times[200.0][0] < times[50.0][0]
    assert times[50.0][1] == pytest.approx(times[800.0][1], rel=0.02)  # all reads near


def test_datavine_keeps_reads_in_the_rack_when_the_racks_are_known() -> None:
    cal = _calibration()
    box = BoxGeometry()
    near, blind = predict_box(box, cal, "datavine"), predict_box(box, cal, "blind")
    assert near.interrack_bytes < 0.1 * blind.interrack_bytes
    assert near.near_fraction > 0.9 and blind.near_fraction < 0.7
    total = 16 * 100_000 * cal.bytes_per_event
    assert blind.bytes_read == pytest.approx(total, rel=1e-6)
    assert blind.interrack_bytes == pytest.approx((1 - blind.near_fraction) * total, rel=1e-6)
    assert near.placement_tiers.get("anywhere", 0) == 0
    # the shards get the files by datavine's own map of the box's names
    shards = ShardMap(Shard(url=f"root://{r.lower()}1.box:1094", rack=r, name=f"xcache-{r}")
                      for r in "AB")
    racks = {shards.rack_for(f"/nanoaod_{i:04d}.root") for i in range(16)}
    assert racks == {"A", "B"}


def test_a_calibration_of_other_files_is_refused() -> None:
    with pytest.raises(ValueError, match="lzma"):
        predict_box(BoxGeometry(compression="lzma"), _calibration(), "datavine")
    with pytest.raises(ValueError, match="placement"):
        predict_box(BoxGeometry(), _calibration(), "fastest")


def test_calibration_as_validation_and_the_unused_constants_are_gone() -> None:
    assert not hasattr(Workload, "measured_here")
    bench = (Path(__file__).resolve().parents[1] / "benchmarks" / "facility_model.py")
    text = bench.read_text()
    assert "validation_ratio" not in text and "measured_here" not in text
    assert "--calibrate" in text and "predict_box" in text
