"""Benchmark: the facility model (datavine.apps.sim) at the 200 Gbps challenge's size, and its
prediction of the facility in a box from a loopback calibration.

Part 1, the facility (simulated): 2 racks x 50 workers x 25 cores (2,500 cores), 8 XCache
nodes (4 per rack, 25/32/40/50 Gbps), one 80 Gbps link between the racks (both directions
share it; ``--duplex`` gives each direction 80), 60,000 files of ~200k events (log-normal),
480 B/event, 25 kHz per core (240 Gbps if every core keeps up). Every choice is datavine's
own: its planner, placement (delay scheduling), topology, shard map and memory policy run
on simulated time, and the time they really take on this host is charged to the manager.
Runs:

- ``blind``: ``RunConfig(placement=None)``, the shard map weighted by the nodes' Gbps;
- ``datavine``: default placement, the same map;
- ``datavine, equal shares``: default placement, every XCache node an equal share of the
  files (the shard map without weights), to show what the weights are for.

Part 2, the calibration (``--calibrate``): real ``datavine run --json`` runs on loopback
(the AGC-style analysis over ``--box-files`` generated files of ``--box-events`` events,
read through the loopback XCache testbed with cold caches), on ``LocalCluster`` workers and
on a local pool's (:func:`datavine.apps.sim.calibration.calibrate`), reduced to the model's
inputs (core-seconds per event, bytes read per event, the manager's time per bundle, a
library's start) and saved as JSON (``--calibration``, where ``benchmarks/box.py`` reads
it). Without ``--calibrate`` the saved calibration is used.

Part 3, the box (predicted from the calibration and the box's description only,
:func:`datavine.apps.sim.box.predict_box`): ``--racks`` racks of ``--hosts-per-rack`` hosts,
a 1-core worker per host, an XCache shard per rack, the inter-rack link at ``--link-mbit``,
the whole box on this machine's cores; datavine's placement and locality-blind placement.
``benchmarks/box.py`` runs that box and compares (``prediction_ratio_time``,
``prediction_ratio_bytes``).

    .venv/bin/python benchmarks/facility_model.py [--files 60000] [--duplex] [--no-facility]
        [--calibrate [--calibration-runs 3]] [--calibration runs/benchmarks/calibration.json]
        [--racks 2 --hosts-per-rack 2 --link-mbit 200 --box-files 16 --box-events 100000]
        [--png benchmarks/figures/facility_model.png]

Last line: ``gbps_datavine=... gbps_blind=... link_utilisation_blind=... ...
box_time_datavine_s=... box_time_blind_s=... box_interrack_mb_datavine=...
box_interrack_mb_blind=...``.

The HL-LHC target (``--hllhc``, instead of parts 1-3): 10,000 cores (8 racks x 50 workers x
25 cores), 32 XCache nodes of 40 Gbps (4 a rack), 100 Gbps between each pair of racks, the
manager on a 25 Gbps NIC (:meth:`FacilitySpec.hllhc`); files of 250k events at 25 kHz a core
(10 core-second bundles) and 450 B/event, 900 Gbps of demand, ~200 TB in 30 minutes
(:meth:`Workload.hllhc`). The manager's core is a resource that saturates: every bundle
costs it ``--manager-ms-per-bundle`` of CPU (half to send the call, half to take its
result; default the CPU per bundle beyond the loop's housekeeping that
``benchmarks/workers.py`` measured at 256 workers), and every call and result crosses its
NIC. The loop's housekeeping, ``--manager-ms-per-s`` of CPU a second at 256 workers (the
pool looked at once a second, TaskVine's polls), is added to the manager cores needed,
scaled linearly with the facility's workers (it grows less than that: 0.84 ms a second at 8
workers, 1.82 at 256); at that share of a core (~0.003) it is left out of the manager's
saturation. The model simulates a warm-up and ``--window-s`` seconds
of the run and measures the window (a steady state; the whole 30 minutes would be ~1.8M
bundles of datavine's own decisions; the warm-up, unless ``--warmup-s``, is
:func:`datavine.apps.sim.steady.warmup_for`'s: 30 s, or longer when the manager needs longer
for the calls submitted at the start), once at that cost and once at
``--target-ms-per-bundle`` (the issue's target).

    .venv/bin/python benchmarks/facility_model.py --hllhc [--manager-ms-per-bundle 0.41]
        [--manager-ms-per-s 1.82] [--target-ms-per-bundle 0.5] [--window-s 60]
        [--warmup-s SECONDS]

Last line: ``gbps_hllhc=... limited_by=... manager_cores_hllhc=...
manager_housekeeping_cores_hllhc=... manager_nic_share_hllhc=... link_utilisation_hllhc=...``
(at ``--manager-ms-per-bundle``; ``manager_cores_hllhc`` includes the housekeeping).
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path
from typing import Any

import common

from datavine.apps.sim import FacilitySpec, ManagerCost, SimConfig, SimResult, Workload, simulate
from datavine.apps.sim.box import BoxGeometry, predict_box
from datavine.apps.sim.calibration import (
    Calibration,
    calibrate,
    load_calibration,
    save_calibration,
)
from datavine.apps.sim.plot import plot_runs
from datavine.apps.sim.steady import SteadyState, steady_state

# the manager's CPU at 256 workers (benchmarks/README.md's "## workers"), in two parts: per
# bundle beyond the loop's housekeeping (`marginal_cpu_ms_per_bundle_256`), and the loop's own
# per second with nothing to do (`housekeeping_ms_per_s_256`: the pool looked at once a
# second, TaskVine's polls). Until 2026-11-28 the model charged the all-in figure per bundle
# (`cpu_ms_per_bundle_256`, 0.55 ms: the highest of 0.46, 0.55 and 0.48 at 14:24-15:24; 0.82
# on 2026-11-26, 4.47 on 2026-11-25 before patch 0003), which counts the housekeeping of the
# benchmark's ~25 bundles a second once per bundle, ~40 times over at the HL-LHC's ~1,100.
MEASURED_MANAGER_MS = 0.41
MEASURED_HOUSEKEEPING_MS_PER_S = 1.82
MEASURED_WORKERS = 256  # the workers those two were measured at
TARGET_MANAGER_MS = 0.5  # issue 29's target (issue 21's was 1.0)


def facility_runs(files: int, duplex: bool) -> list[tuple[str, SimResult, float]]:
    """(label, result, seconds the simulation took) for blind, datavine, equal shares."""
    cfg = SimConfig(cost=ManagerCost(decision_s=None))  # charge the decisions' real time
    workload = Workload.challenge(n_files=files)
    out = []
    for label, mode, weighted in (("blind", "blind", True), ("datavine", "datavine", True),
                                  ("datavine, equal shares", "datavine", False)):
        facility = FacilitySpec.challenge(weighted=weighted, duplex=duplex)
        started = time.perf_counter()
        result = simulate(facility, workload, mode, cfg)
        out.append((label, result, time.perf_counter() - started))
        print(f"# simulated {label}: {time.perf_counter() - started:.1f} s", file=sys.stderr,
              flush=True)
    return out


def facility_table(runs: list[tuple[str, SimResult, float]]) -> str:
    lines = ["| run | Gbps sustained | Gbps mean / peak | link mean / peak | near bytes | "
             "done at s | last 5% of files | cores busy | manager busy | "
             "decisions per bundle | decision us per bundle | sim s |",
             "|---|---:|---:|---:|---:|---:|---|---:|---:|---:|---:|---:|"]
    for label, r, secs in runs:
        lines.append(
            f"| {label} | {r.gbps_sustained:.0f} | {r.gbps_avg:.0f} / {r.gbps_peak:.0f} | "
            f"{100 * r.link_utilisation:.0f}% / {100 * r.link_utilisation_peak:.0f}% | "
            f"{100 * r.near_fraction:.1f}% | {r.wall_s:.0f} | {r.tail_s:.0f} s at "
            f"{r.tail_gbps:.0f} Gbps | {100 * r.busy_fraction:.0f}% | "
            f"{100 * r.manager_busy_fraction:.0f}% | {r.decisions / max(r.bundles, 1):.1f} | "
            f"{r.decision_us_per_bundle:.0f} | {secs:.0f} |")
    return "\n".join(lines)


# --- calibration and the box ------------------------------------------------------------
def calibration_pairs(cal: Calibration) -> dict[str, Any]:
    return {"cal_core_us_per_event": round(cal.cpu_s_per_event * 1e6, 3),
            "cal_bytes_per_event": round(cal.bytes_per_event, 1),
            "cal_manager_ms_per_bundle": round(cal.manager_s_per_bundle * 1e3, 2),
            "cal_library_start_s": round(cal.library_start_s, 3),
            "cal_library_wait_s": round(cal.library_wait_s, 3),
            "cal_first_call_s": round(cal.first_call_s, 3), "cal_runs": cal.runs}


def box_predictions(geometry: BoxGeometry, cal: Calibration) -> dict[str, Any]:
    """The box predicted for datavine and blind placement; printed, and as key=value pairs."""
    pairs: dict[str, Any] = {}
    preds = {mode: predict_box(geometry, cal, mode) for mode in ("datavine", "blind")}
    print(f"# box: {geometry.racks} racks x {geometry.hosts_per_rack} hosts, 1-core workers, "
          f"inter-rack link {geometry.link_mbit:g} Mbit/s, {geometry.files} files x "
          f"{geometry.events_per_file:,} events ({geometry.compression}), on "
          f"{geometry.host_cores or cal.host_cores} cores; calibration of {cal.measured_at}")
    for mode, p in preds.items():
        print(f"#   predicted {p.line()}; placement {p.placement_tiers}")
        pairs[f"box_time_{mode}_s"] = round(p.run_time_s, 3)
        pairs[f"box_interrack_mb_{mode}"] = round(p.interrack_bytes / 1e6, 1)
        pairs[f"box_near_fraction_{mode}"] = round(p.near_fraction, 3)
    dv, bl = preds["datavine"], preds["blind"]
    pairs["box_throughput_ratio"] = round(bl.run_time_s / dv.run_time_s, 3)
    pairs["box_interrack_bytes_ratio"] = (round(dv.interrack_bytes / bl.interrack_bytes, 3)
                                          if bl.interrack_bytes else "n/a")
    return pairs


# --- the HL-LHC target ---------------------------------------------------------------------
def hllhc_runs(costs_ms: list[float], window_s: float, warmup_s: float | None
               ) -> list[tuple[float, SteadyState, float]]:
    """(manager ms per bundle, steady state, seconds the simulation took) for each cost."""
    facility, workload = FacilitySpec.hllhc(), Workload.hllhc()
    out = []
    for ms in costs_ms:
        started = time.perf_counter()
        steady = steady_state(facility, workload, ManagerCost.per_bundle(ms), window_s,
                              warmup_s)
        secs = time.perf_counter() - started
        out.append((ms, steady, secs))
        w = steady.window
        print(f"# simulated HL-LHC at {ms:g} ms per bundle: {secs:.1f} s (window "
              f"{w.t_from:.0f}-{w.t_to:.0f} s)", file=sys.stderr, flush=True)
    return out


def housekeeping_cores(ms_per_s: float, facility: FacilitySpec) -> float:
    """The manager's cores the loop's housekeeping takes at ``facility``: ``ms_per_s`` (CPU
    milliseconds a second at :data:`MEASURED_WORKERS` workers), scaled by its workers."""
    return ms_per_s / 1e3 * len(facility.workers()) / MEASURED_WORKERS


def hllhc_table(runs: list[tuple[float, SteadyState, float]], housekeeping: float) -> str:
    """``housekeeping``: the cores the loop's housekeeping takes, added to each row's."""
    lines = ["| manager ms per bundle | window s | Gbps | limited by | manager busy | "
             "manager cores for bundles | + housekeeping | manager cores needed | "
             "manager NIC Gbps | NIC / data | inter-rack link | "
             "busiest XCache | cores taken | files/s | 200 TB in | sim s |",
             "|---:|---|---:|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|"]
    for ms, st, secs in runs:
        w = st.window
        span = w.t_to - w.t_from
        files = _completed(st, w.t_from, w.t_to) / span
        lines.append(
            f"| {ms:g} | {w.t_from:.0f}-{w.t_to:.0f} | {st.gbps:.0f} | {st.limited_by} | "
            f"{100 * w.manager_busy:.1f}% | "
            f"{st.manager_cores:.3f} | {housekeeping:.3f} | "
            f"{st.manager_cores + housekeeping:.2f} | "
            f"{st.nic_gbps:.2f} | {100 * st.nic_share:.3f}% | "
            f"{100 * w.link_utilisation:.1f}% | {100 * w.shard_utilisation:.0f}% | "
            f"{100 * w.cores_busy:.0f}% | {files:.0f} | "
            f"{200e12 * 8 / (st.gbps * 1e9) / 60:.0f} min | {secs:.0f} |")
    return "\n".join(lines)


def _completed(st: SteadyState, t_from: float, t_to: float) -> int:
    """Files whose bundles finished between ``t_from`` and ``t_to``."""
    return sum(1 for t in st.result.file_done_s if t_from <= t < t_to)


def hllhc_pairs(st: SteadyState, housekeeping: float, suffix: str = "_hllhc"
                ) -> dict[str, Any]:
    return {f"gbps{suffix}": round(st.gbps, 1), "limited_by": st.limited_by,
            f"manager_cores{suffix}": round(st.manager_cores + housekeeping, 3),
            f"manager_housekeeping_cores{suffix}": round(housekeeping, 4),
            f"manager_nic_share{suffix}": round(st.nic_share, 5),
            f"link_utilisation{suffix}": round(st.link_utilisation, 4)}


def hllhc_main(args: argparse.Namespace) -> int:
    facility, workload = FacilitySpec.hllhc(), Workload.hllhc()
    print(f"# HL-LHC target: {facility.cores:,} cores in {len(facility.racks)} racks, "
          f"{len(facility.shards)} XCache nodes of {facility.shards[0].gbps:g} Gbps, "
          f"{facility.inter_rack_gbps:g} Gbps between each pair of racks, manager NIC "
          f"{facility.manager_nic_gbps:g} Gbps; files of {workload.events_per_file:,.0f} "
          f"events ({workload.core_s_per_file:g} core-s at {workload.khz_per_core:g} kHz), "
          f"{workload.bytes_per_event:g} B/event, result {workload.result_bytes / 1024:g} KiB, "
          f"task {workload.task_bytes / 1024:g} KiB; a window of {args.window_s:g} s", flush=True)
    costs = [args.manager_ms_per_bundle]
    if args.target_ms_per_bundle != args.manager_ms_per_bundle:
        costs.append(args.target_ms_per_bundle)
    runs = hllhc_runs(costs, args.window_s, args.warmup_s)
    housekeeping = housekeeping_cores(args.manager_ms_per_s, facility)
    print(f"# demand {runs[0][1].demand_gbps:.0f} Gbps; the loop's housekeeping "
          f"{args.manager_ms_per_s:g} ms a second at {MEASURED_WORKERS} workers, "
          f"{housekeeping:.4f} cores at {len(facility.workers())}")
    print(hllhc_table(runs, housekeeping))
    for ms, st, _ in runs[1:]:
        print(f"# at {ms:g} ms per bundle: {common.kv_line(hllhc_pairs(st, housekeeping))}")
    print(common.kv_line(hllhc_pairs(runs[0][1], housekeeping)))
    return 0


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--files", type=int, default=60_000)
    parser.add_argument("--duplex", action="store_true",
                        help="the inter-rack link carries 80 Gbps in each direction")
    parser.add_argument("--png", type=Path,
                        default=common.REPO / "benchmarks" / "figures" / "facility_model.png")
    parser.add_argument("--no-facility", action="store_true",
                        help="skip the challenge-size facility (part 1)")
    parser.add_argument("--calibrate", action="store_true",
                        help="measure the calibration on loopback now (else read it)")
    parser.add_argument("--calibration-runs", type=int, default=3)
    parser.add_argument("--calibration", type=Path, default=common.RUNS / "calibration.json")
    parser.add_argument("--racks", type=int, default=2)
    parser.add_argument("--hosts-per-rack", type=int, default=2)
    parser.add_argument("--link-mbit", type=float, default=200.0)
    parser.add_argument("--box-files", type=int, default=16)
    parser.add_argument("--box-events", type=int, default=100_000)
    parser.add_argument("--hllhc", action="store_true",
                        help="the HL-LHC target's steady state instead of parts 1-3")
    parser.add_argument("--manager-ms-per-bundle", type=float, default=MEASURED_MANAGER_MS,
                        help="manager CPU per bundle (ms) for --hllhc, beyond the loop's "
                             "housekeeping (default: measured at 256 workers, "
                             "benchmarks/README.md, workers)")
    parser.add_argument("--manager-ms-per-s", type=float,
                        default=MEASURED_HOUSEKEEPING_MS_PER_S,
                        help="--hllhc: the loop's housekeeping, CPU ms a second at 256 workers "
                             "(scaled to the facility's workers)")
    parser.add_argument("--target-ms-per-bundle", type=float, default=TARGET_MANAGER_MS,
                        help="a second --hllhc run at this cost (the issue's target)")
    parser.add_argument("--window-s", type=float, default=60.0,
                        help="--hllhc: seconds of steady state measured")
    parser.add_argument("--warmup-s", type=float, default=None,
                        help="--hllhc: seconds simulated before the window (default: "
                             "datavine.apps.sim.steady.warmup_for's)")
    args = parser.parse_args(argv)
    common.setup()
    print(f"# {common.machine_info()}", flush=True)
    if args.hllhc:
        return hllhc_main(args)
    pairs: dict[str, object] = {}
    if not args.no_facility:
        runs = facility_runs(args.files, args.duplex)
        print(facility_table(runs))
        by = {label: r for label, r, _ in runs}
        link = 80.0
        plot_runs([(label, r) for label, r, _ in runs], args.png, link_gbps=link,
                  title=f"datavine's own decisions on a simulated facility:\n{by['blind'].cores:,}"
                        f" cores in 2 racks, 8 XCache nodes, {args.files:,} files, "
                        f"{link:.0f} Gbps between racks{' per direction' if args.duplex else ''}")
        print(f"# picture: {args.png}")
        dv, bl, eq = by["datavine"], by["blind"], by["datavine, equal shares"]
        pairs.update(
            gbps_datavine=round(dv.gbps_sustained, 1), gbps_blind=round(bl.gbps_sustained, 1),
            link_utilisation_blind=round(bl.link_utilisation, 3),
            link_utilisation_datavine=round(dv.link_utilisation, 3),
            link_peak_blind=round(bl.link_utilisation_peak, 3),
            link_peak_datavine=round(dv.link_utilisation_peak, 3),
            near_fraction_datavine=round(dv.near_fraction, 3),
            near_fraction_blind=round(bl.near_fraction, 3),
            tail_s_datavine=round(dv.tail_s, 1), tail_s_blind=round(bl.tail_s, 1),
            gbps_datavine_equal_shares=round(eq.gbps_sustained, 1),
            ratio_vs_blind=round(dv.gbps_sustained / bl.gbps_sustained, 3),
            decision_us_per_bundle=round(dv.decision_us_per_bundle),
            files=args.files, duplex=int(args.duplex))
    if args.calibrate:
        cal = calibrate(args.box_files, args.box_events, "zstd",
                        repeats=args.calibration_runs)
        print(f"# calibration saved: {save_calibration(cal, args.calibration)}")
    else:
        cal = load_calibration(args.calibration)
    if cal is None:
        print(f"# no calibration at {args.calibration}: run with --calibrate for the box's "
              "prediction")
    else:
        print(f"# calibration: {cal}")
        pairs.update(calibration_pairs(cal))
        geometry = BoxGeometry(racks=args.racks, hosts_per_rack=args.hosts_per_rack,
                               link_mbit=args.link_mbit, files=args.box_files,
                               events_per_file=args.box_events, compression=cal.compression)
        pairs.update(box_predictions(geometry, cal))
    print(common.kv_line(pairs))
    return 0


if __name__ == "__main__":
    sys.exit(main())
