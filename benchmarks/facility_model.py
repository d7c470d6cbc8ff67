"""Benchmark: the facility model (datavine.apps.sim) at the 200 Gbps challenge's size, and the
model checked against a real run on this host.

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

Part 2, validation (``--validate``, on by default): the same small configuration simulated
and run for real. The real run is the AGC-style analysis (one chunk per file, merges of 8)
on ``datavine.LocalCluster(workers=2, cores=1)`` over 24 generated ZSTD files of 250k
events; the model gets the per-core event rate measured by a plain loop in this process
just before, and the per-bundle costs it is calibrated with. Figure: simulated / real
completion time (goal: within 20%).

    .venv/bin/python benchmarks/facility_model.py [--files 60000] [--duplex]
        [--no-validate | --validate-only] [--png benchmarks/figures/facility_model.png]

Last line: ``gbps_datavine=... gbps_blind=... link_utilisation_blind=...
link_utilisation_datavine=... ... validation_ratio=...``.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path

import common

from datavine.apps.sim import FacilitySpec, ManagerCost, SimConfig, SimResult, Workload, simulate
from datavine.apps.sim.plot import plot_runs

VALIDATE_DIR = common.REPO / "build" / "sim-validate" / "zstd-24x250k"


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


# --- validation --------------------------------------------------------------------------
def validate(repeat: int) -> dict[str, float]:
    """Real run vs the model on this host: 24 files x 250k ZSTD events, 2 workers x 1 core."""
    import dask

    import datavine
    from datavine.apps.analysis import agc
    from datavine.apps.analysis.sources import LocalFiles, analysis_graph
    from datavine.io.datagen import generate_dataset

    files = [p.resolve() for p in generate_dataset(VALIDATE_DIR, 24, 250_000, "zstd", seed=7)]
    size = sum(p.stat().st_size for p in files)
    for p in files:  # page cache, as the model assumes warm reads
        p.read_bytes()
    chunks = agc.make_chunks(files, 250_000)
    agc.run_plain_loop(chunks[:1])  # imports and first calls, outside the clock
    graph = analysis_graph(LocalFiles(), chunks, fan_in=8)
    real, sims, rates, sims_in, rates_in = [], [], [], [], []
    with datavine.LocalCluster(workers=2, cores=1) as cluster:
        dask.compute(graph, scheduler=cluster.get)  # imports the analysis into the library
        for _ in range(repeat):
            # the rate of one core now (the machine is shared: it moves from run to run)
            started = time.perf_counter()
            agc.run_plain_loop(chunks[1:5])
            khz = 4 * 250_000 / (time.perf_counter() - started) / 1e3
            started = time.perf_counter()
            (result,) = dask.compute(graph, scheduler=cluster.get)
            real.append(time.perf_counter() - started)
            assert result.result.events == 24 * 250_000, "the real run lost events"
            cats = cluster.last_summary.categories
            chunk_s = cats["agc-chunk"].seconds / max(cats["agc-chunk"].tasks, 1)
            merge_s = cats["agc-merge"].seconds / max(cats["agc-merge"].tasks, 1)
            for rate, out in ((khz, sims), (250.0 / chunk_s, sims_in)):
                workload = Workload(n_files=24, events_per_file=250_000, spread=0.0,
                                    bytes_per_event=size / (24 * 250_000), khz_per_core=rate,
                                    merge_s=merge_s, seed=7)
                out.append(simulate(FacilitySpec.small(workers=2, cores=1), workload,
                                    "datavine", SimConfig(cost=ManagerCost(decision_s=None))
                                    ).wall_s)
            rates.append(khz)
            rates_in.append(250.0 / chunk_s)
        bundles = cluster.last_summary.bundles
    ratios = [s / r for s, r in zip(sims, real, strict=True)]
    ratios_in = [s / r for s, r in zip(sims_in, real, strict=True)]

    def shown(values: list[float], fmt: str = ".2f") -> str:
        return ", ".join(f"{v:{fmt}}" for v in values)

    print(f"# validation, per run ({bundles} bundles each): real s {shown(real)}\n"
          f"#   plain loop here just before: {shown(rates, '.0f')} kHz per core -> model s "
          f"{shown(sims)}, model / real {shown(ratios)}\n"
          f"#   chunk time in the workers (run summary): {shown(rates_in, '.0f')} kHz -> "
          f"model s {shown(sims_in)}, model / real {shown(ratios_in)}",
          file=sys.stderr, flush=True)
    return {"validation_real_s": round(statistics.median(real), 3),
            "validation_sim_s": round(statistics.median(sims_in), 3),
            "validation_ratio": round(statistics.median(ratios_in), 3),
            "validation_ratio_worst": round(max(ratios_in, key=lambda x: abs(x - 1)), 3),
            "validation_ratio_plain_loop_rate": round(statistics.median(ratios), 3),
            "validation_khz_per_core_workers": round(statistics.median(rates_in), 1),
            "validation_khz_per_core_plain_loop": round(statistics.median(rates), 1)}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--files", type=int, default=60_000)
    parser.add_argument("--duplex", action="store_true",
                        help="the inter-rack link carries 80 Gbps in each direction")
    parser.add_argument("--png", type=Path,
                        default=common.REPO / "benchmarks" / "figures" / "facility_model.png")
    parser.add_argument("--repeat", type=int, default=5, help="real validation runs")
    group = parser.add_mutually_exclusive_group()
    group.add_argument("--no-validate", action="store_true")
    group.add_argument("--validate-only", action="store_true")
    args = parser.parse_args(argv)
    common.setup()
    print(f"# {common.machine_info()}", flush=True)
    pairs: dict[str, object] = {}
    if not args.validate_only:
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
    if not args.no_validate:
        pairs.update(validate(args.repeat))
    print(common.kv_line(pairs))
    return 0


if __name__ == "__main__":
    sys.exit(main())
