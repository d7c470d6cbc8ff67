"""Benchmark (issue 30): the second run of an analysis, with its columns kept on the workers.

The AGC-style selection (:mod:`datavine.apps.analysis.agc`) runs over generated NanoAOD-like
files (``--files`` x ``--events-per-file`` per compression, made once into ``--data-dir``,
as :mod:`analysis` does) on a ``datavine.LocalCluster`` of ``--workers`` 1-core workers. One
round, per compression:

1. ``cluster.drop_caches()``, then a *cold* run with one selection (the workers decode
   every basket; their column caches fill);
2. a *warm* run with the other selection (same branches, other cuts: ``jet_pt`` 25 or 30
   GeV): it should find its columns in the workers' memory.

The selections swap from round to round, so each warm result is checked against a cold run
of the same selection (histogram, events and selected events equal). The speedup is each
round's cold time over its warm time (median over ``--rounds``); the hit fraction is the
warm runs' decoded bytes served from the caches (``last_summary.cache``); the memory figure
is the chunks' largest peak over their cap (``peak_over_cap``, < 1: never over; overruns
are counted too).

Then the degradation check (on ``--degrade`` compression): a cluster whose caches hold a
fraction of the working set (``RunConfig(column_cache_mb=--small-cache-mb)``) against one
with the cache off, each running the analysis twice, rounds alternating: the small cache's
second run should be as fast as the cache-off one's (``degrade_ratio`` = its time over the
cache-off time, <= 1.05).

The last line is ``key=value``: ``rerun_speedup_lzma= rerun_speedup_zstd= hit_fraction=
peak_over_cap= overruns= degrade_ratio= results_equal=``.

``--box`` measures the input-bytes cache instead (issue 30, item 3), on the facility in a box
(:mod:`datavine.deploy.box`, as ``benchmarks/box.py`` uses it: a manager host with the
origin, ``--box-racks`` racks of ``--box-hosts-per-rack`` hosts, an XCache shard and a
one-core ``vine_worker`` per rack host): ``datavine run --facility`` twice on the manager
host, the facility file saying ``[run] input_cache_mb = --box-cache-mb``. Each run is a new
manager, so the workers' libraries (and their column caches) start again: the second run
finds its columns nowhere in memory, only its bytes on the workers' disks. The network's
bytes are the kernel's: what every host of the box received (each host's ``eth0`` and
``lo``: a worker on its shard's host reads it over loopback), before and after each run.
Last line: ``box_rerun_bytes_ratio=`` (the second run's bytes over the first's; goal <=
0.05), the two runs' MB, the second run's MB from the workers' disks and from the servers
(datavine's count), ``box_results_equal=``.

    .venv/bin/python benchmarks/rerun.py [--compression both|lzma|zstd] [--files 4
        --events-per-file 500000 --chunk-events 100000] [--workers 2] [--rounds 3]
    .venv/bin/python benchmarks/rerun.py --box [--box-files 16 --box-events 100000
        --box-racks 2 --box-hosts-per-rack 2 --box-cache-mb 1024]   # root, XRootD
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import sys
import time
import warnings
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import analysis
import common
import dask

import datavine
from datavine.apps.analysis import agc
from datavine.scheduler.memory import MemoryPolicy

SELECTIONS = (agc.AGC, agc.Selection(jet_pt=30.0))


def merge(*parts: agc.ChunkResult) -> agc.ChunkResult:
    return sum(parts, agc.ChunkResult.empty())


def graph(chunks: list[agc.Chunk], selection: agc.Selection) -> Any:
    """One task per chunk (its Chunk an argument: placement sees the file and the entries)
    and a tree of merges."""
    level = [dask.delayed(agc.process_item, pure=False)(chunk, selection) for chunk in chunks]
    while len(level) > 1:
        level = [dask.delayed(merge, pure=False)(*level[i:i + analysis.FAN_IN])
                 for i in range(0, len(level), analysis.FAN_IN)]
    return level[0]


@dataclass
class Timed:
    seconds: float
    result: agc.ChunkResult
    hit_fraction: float
    peak_over_cap: float
    overruns: int
    load: float
    note: str = ""


def timed_run(cluster: datavine.LocalCluster, chunks: list[agc.Chunk],
              selection: agc.Selection) -> Timed:
    started = time.perf_counter()
    result = dask.compute(graph(chunks, selection), scheduler=cluster.get)[0]
    seconds = time.perf_counter() - started
    summary = cluster.last_summary
    assert summary is not None
    stats = summary.categories.get("process_item")
    ratio = (stats.peak_mb / stats.cap_mb) if stats is not None and stats.cap_mb else 0.0
    overruns = sum(c.overruns for c in summary.categories.values())
    note = (f"placement {dict(summary.placement)}, {summary.backups.started} backup copies "
            f"({summary.backups.won} won)")
    return Timed(seconds, result, summary.cache.hit_fraction, ratio, overruns,
                 os.getloadavg()[0], note)


@dataclass
class Rerun:
    compression: str
    cold: list[Timed] = field(default_factory=list)
    warm: list[Timed] = field(default_factory=list)
    equal: bool = True

    @property
    def speedup(self) -> float:
        return statistics.median(c.seconds / w.seconds for c, w in zip(self.cold, self.warm,
                                                                        strict=True))


def cluster_for(args: argparse.Namespace, name: str, **run: Any) -> datavine.LocalCluster:
    """Workers whose memory caps start at ``--floor-mb`` at least: a cap learned from the
    first chunks' peaks (before the cache filled) leaves the cache the floor's share."""
    memory = MemoryPolicy(floor_mb=args.floor_mb)
    return datavine.LocalCluster(
        workers=args.workers, cores=1,
        manager=datavine.ManagerConfig(run_dir=common.run_dir(name)),
        run=datavine.RunConfig(memory=memory, speculation=args.speculation == "on", **run))


def rerun(compression: str, chunks: list[agc.Chunk], args: argparse.Namespace) -> Rerun:
    out = Rerun(compression)
    cold_of: dict[agc.Selection, agc.ChunkResult] = {}
    with cluster_for(args, f"rerun-{compression}") as cluster:
        for i in range(args.rounds):
            first, second = SELECTIONS[i % 2], SELECTIONS[(i + 1) % 2]
            cluster.drop_caches()
            cold = timed_run(cluster, chunks, first)
            warm = timed_run(cluster, chunks, second)
            out.cold.append(cold)
            out.warm.append(warm)
            cold_of.setdefault(first, cold.result)
            print(f"# {compression} round {i + 1}: cold {cold.seconds:.2f} s (load "
                  f"{cold.load:.1f}), warm {warm.seconds:.2f} s (load {warm.load:.1f}), hits "
                  f"{warm.hit_fraction:.3f}; cold {cold.note}; warm {warm.note}", file=sys.stderr,
                  flush=True)
        for i, warm in enumerate(out.warm):  # each warm result against a cold one
            selection = SELECTIONS[(i + 1) % 2]
            if selection in cold_of:
                out.equal &= warm.result.same_selection(cold_of[selection])
            else:  # one round: run that selection cold too
                cluster.drop_caches()
                out.equal &= warm.result.same_selection(
                    timed_run(cluster, chunks, selection).result)
    return out


def degrade(chunks: list[agc.Chunk], args: argparse.Namespace) -> tuple[list[float], list[float]]:
    """Second-run times with a cache smaller than the working set, and with the cache off."""
    small: list[float] = []
    off: list[float] = []
    with cluster_for(args, "rerun-small", column_cache_mb=args.small_cache_mb) as tight, \
            cluster_for(args, "rerun-off", column_cache=False) as none:
        for i in range(args.rounds):
            order = [(tight, small), (none, off)]
            for cluster, times in order if i % 2 == 0 else order[::-1]:
                timed_run(cluster, chunks, SELECTIONS[0])
                times.append(timed_run(cluster, chunks, SELECTIONS[1]).seconds)
            print(f"# degrade round {i + 1}: small cache {small[-1]:.2f} s, cache off "
                  f"{off[-1]:.2f} s", file=sys.stderr, flush=True)
    return small, off


@dataclass
class BoxRun:
    """One ``datavine run`` on the box: the kernel's bytes and datavine's record."""

    received: int
    record: dict[str, Any]

    @property
    def reads(self) -> dict[str, Any]:
        return dict((self.record.get("summary") or {}).get("reads") or {})


def box_received(box: Any) -> int:
    """Bytes every host of the box has received so far (``eth0`` and ``lo``), kernel's."""
    return sum(box.counters(h.namespace, dev)[0] for h in box.plan.hosts
               for dev in ("eth0", "lo"))


def box_rerun(args: argparse.Namespace) -> int:
    """The input-bytes cache on the box: two ``datavine run``s, network bytes of each."""
    from datavine.deploy.box.facility import bring_up, start_workers, take_down
    from datavine.deploy.box.net import box_missing
    from datavine.deploy.box.plan import BoxSpec

    why = box_missing()
    if why:
        print(f"box: cannot run here: {why}", file=sys.stderr)
        return 2
    print(f"# {common.machine_info()}", file=sys.stderr, flush=True)
    data = args.box_data_dir
    files = common.readable_dataset(data, args.box_files, args.box_events)
    size = sum(f.stat().st_size for f in files)
    workdir = common.run_dir("rerun-box")
    workdir.chmod(0o755)
    spec = BoxSpec(name="rerun", racks=args.box_racks, hosts_per_rack=args.box_hosts_per_rack)
    box = bring_up(spec, workdir / "box", data=data)
    runs: list[BoxRun] = []
    try:
        facility = box.dir / "facility-rerun.toml"
        facility.write_text((box.dir / "facility.toml").read_text()
                            + f"\n[run]\ninput_cache_mb = {args.box_cache_mb:g}\n")
        start_workers(box)
        n_workers = args.box_racks * args.box_hosts_per_rack
        for i in (1, 2):
            record = box.dir / f"run-{i}.json"
            argv = [str(Path(sys.executable).parent / "datavine"), "run", "--facility",
                    str(facility), "--data", str(data), "--files", str(args.box_files),
                    "--events", str(args.box_events), "--no-progress", "--json", str(record),
                    "--timeout", str(args.box_timeout), "--pool-workers", str(n_workers),
                    "--pool-timeout", "60"]
            before = box_received(box)
            done = box.run("mgr", argv, timeout_s=args.box_timeout + 120, check=False)
            received = box_received(box) - before
            if done.returncode != 0:
                print(done.stdout[-3000:] + done.stderr[-3000:], file=sys.stderr)
                print(f"box run {i} failed (exit {done.returncode})", file=sys.stderr)
                return 1
            runs.append(BoxRun(received, json.loads(record.read_text())))
            lines = [x for x in done.stdout.splitlines() if x.startswith(("  bytes:",
                                                                          "  reads:",
                                                                          "throughput:"))]
            print(f"# box run {i}: {received / 1e6:.1f} MB received by the box's hosts (load "
                  f"{os.getloadavg()[0]:.1f}); " + "; ".join(x.strip() for x in lines),
                  file=sys.stderr, flush=True)
    finally:
        take_down(box)
        shutil.rmtree(workdir, ignore_errors=True)
    first, second = runs
    ratio = second.received / first.received if first.received else float("nan")
    equal = (first.record.get("histogram") == second.record.get("histogram")
             and first.record.get("events") == second.record.get("events"))
    network = int(second.reads.get("near_bytes", 0)) + int(second.reads.get("far_bytes", 0))
    print(f"\n{common.machine_info()}")
    print(f"box: {args.box_racks} racks x {args.box_hosts_per_rack} hosts, one 1-core worker "
          f"per rack host; {args.box_files} files x {args.box_events:,} events (zstd, "
          f"{size / 1e6:.0f} MB); input_cache_mb = {args.box_cache_mb:g}\n")
    print("| run | MB received by the box's hosts (kernel) | MB read from servers (datavine) "
          "| MB from workers' disks | wall s |")
    print("|---|---|---|---|---|")
    for i, r in enumerate(runs, start=1):
        served = int(r.reads.get("near_bytes", 0)) + int(r.reads.get("far_bytes", 0))
        print(f"| {i} | {r.received / 1e6:.1f} | {served / 1e6:.2f} | "
              f"{int(r.reads.get('disk_bytes', 0)) / 1e6:.1f} | {r.record.get('wall_s')} |")
    print(common.kv_line({
        "box_rerun_bytes_ratio": f"{ratio:.4f}",
        "box_first_mb": f"{first.received / 1e6:.1f}",
        "box_second_mb": f"{second.received / 1e6:.1f}",
        "box_second_disk_mb": f"{int(second.reads.get('disk_bytes', 0)) / 1e6:.1f}",
        "box_second_server_mb": f"{network / 1e6:.2f}",
        "box_results_equal": equal}))
    return 0


# --- the column cache's cost to a cold run -------------------------------------------------
def cold_cost(chunks: list[agc.Chunk], args: argparse.Namespace) -> tuple[list[float], list[float]]:
    """Cold-run times with the column cache on and off: two clusters, ``drop_caches()``
    before every run (each decodes every basket, the cache-on one also keeping them), one
    run each first (imports), then ``--rounds`` x 2 runs each, the clusters alternating."""
    on: list[float] = []
    off: list[float] = []
    with cluster_for(args, "rerun-cold-on") as cached, \
            cluster_for(args, "rerun-cold-off", column_cache=False) as plain:
        order = [(cached, on), (plain, off)]
        for cluster, _ in order:
            timed_run(cluster, chunks, SELECTIONS[0])
        for i in range(2 * args.rounds):
            for cluster, times in order if i % 2 == 0 else order[::-1]:
                cluster.drop_caches()
                times.append(timed_run(cluster, chunks, SELECTIONS[0]).seconds)
            print(f"# cold cost round {i + 1}: cache on {on[-1]:.3f} s, off {off[-1]:.3f} s "
                  f"(load {os.getloadavg()[0]:.1f})", file=sys.stderr, flush=True)
    return on, off


# --- coffea: a Runner called twice through one DatavineExecutor ---------------------------
@dataclass
class CoffeaRerun:
    compression: str
    cold: list[float] = field(default_factory=list)
    warm: list[float] = field(default_factory=list)
    hits: list[float] = field(default_factory=list)  # the warm calls' hit fractions
    equal: bool = True

    @property
    def speedup(self) -> float:
        return statistics.median(c / w for c, w in zip(self.cold, self.warm, strict=True))


def coffea_processor(jet_pt: float) -> Any:
    """The AGC-style selection as a coffea processor: the same branches through NanoEvents
    (jets, muons, electrons), :func:`agc.select_and_fill` on them with ``jet_pt`` as the
    jet cut; its histogram, events and selected events. Made here, with the benchmarks'
    folder moved to the end of ``sys.path``: its ``coffea.py`` would otherwise stand for the
    coffea package."""
    here = Path(__file__).resolve().parent
    sys.path[:] = [p for p in sys.path if Path(p or ".").resolve() != here] + [str(here)]
    import hist
    from coffea import processor

    class AgcSelection(processor.ProcessorABC):  # pickled by value: defined in a function
        def __init__(self, cut: float) -> None:
            self.cut = cut

        def process(self, events: Any) -> dict[str, Any]:
            arrays = {f"{name}_{field}": events[name][field] for name, fields in (
                ("Jet", ("pt", "eta", "phi", "mass", "btagDeepFlavB")),
                ("Muon", ("pt", "eta", "tightId")),
                ("Electron", ("pt", "eta", "cutBased"))) for field in fields}
            counts, selected = agc.select_and_fill(arrays, agc.Selection(jet_pt=self.cut))
            mass = hist.Hist(hist.axis.Variable(agc.EDGES, name="mass"), storage="int64")
            mass.view(flow=False)[:] = counts
            return {"events": len(events), "selected": selected, "mass": mass}

        def postprocess(self, accumulator: Any) -> Any:
            return accumulator

    return AgcSelection(jet_pt)


def coffea_same(a: dict[str, Any], b: dict[str, Any]) -> bool:
    return (a["events"] == b["events"] and a["selected"] == b["selected"]
            and bool((a["mass"].values(flow=True) == b["mass"].values(flow=True)).all()))


def coffea_rerun(compression: str, args: argparse.Namespace) -> CoffeaRerun:
    """Per round: ``drop_caches()``, then one ``processor.Runner`` called twice through one
    ``DatavineExecutor`` on the cluster, the cuts swapping (jet pT 25 or 30 GeV); each call
    timed whole (the first preprocesses the files, the second finds their metadata in the
    Runner's cache); each warm result checked against a cold call of the same cut."""
    cuts = (25.0, 30.0)
    coffea_processor(cuts[0])  # sys.path as coffea needs it, before coffea is imported
    from coffea import processor
    from coffea.nanoevents import NanoAODSchema

    from datavine.coffea import DatavineExecutor

    paths = analysis.dataset(args.data_dir, compression, args.files * args.events_per_file,
                             args.files, 2)
    fileset = {"ttbar": [str(p) for p in paths]}
    out = CoffeaRerun(compression)
    cold_of: dict[float, dict[str, Any]] = {}
    warm_of: list[tuple[float, dict[str, Any]]] = []
    with cluster_for(args, f"rerun-coffea-{compression}") as cluster:
        executor = DatavineExecutor(cluster=cluster, status=False)

        def call(runner: Any, cut: float) -> tuple[float, dict[str, Any]]:
            started = time.perf_counter()
            with warnings.catch_warnings():
                warnings.simplefilter("ignore")  # generated files lack cross-references
                result = runner(fileset, treename="Events",
                                processor_instance=coffea_processor(cut))
            return time.perf_counter() - started, result

        for i in range(args.rounds):
            first, second = cuts[i % 2], cuts[(i + 1) % 2]
            cluster.drop_caches()
            runner = processor.Runner(executor=executor, schema=NanoAODSchema,
                                      chunksize=args.chunk_events)
            cold_s, cold = call(runner, first)
            warm_s, warm = call(runner, second)
            hits = cluster.last_summary.cache.hit_fraction if cluster.last_summary else 0.0
            out.cold.append(cold_s)
            out.warm.append(warm_s)
            out.hits.append(hits)
            cold_of.setdefault(first, cold)
            warm_of.append((second, warm))
            print(f"# coffea {compression} round {i + 1}: cold {cold_s:.2f} s, warm "
                  f"{warm_s:.2f} s, hits {hits:.3f} (load {os.getloadavg()[0]:.1f})",
                  file=sys.stderr, flush=True)
        for cut, warm in warm_of:
            if cut not in cold_of:  # one round: that cut cold too
                cluster.drop_caches()
                runner = processor.Runner(executor=executor, schema=NanoAODSchema,
                                          chunksize=args.chunk_events)
                cold_of[cut] = call(runner, cut)[1]
            out.equal &= coffea_same(warm, cold_of[cut])
    return out


def print_coffea(results: list[CoffeaRerun], pairs: dict[str, object]) -> None:
    """The coffea part's table, and its figures into ``pairs``."""
    print("\ncoffea: a Runner called twice through one DatavineExecutor\n")
    print("| compression | cold s (each round) | warm s | speedup (median) | warm hit fraction "
          "(lowest) | warm = cold |")
    print("|---|---|---|---|---|---|")
    for r in results:
        print(f"| {r.compression} | {' '.join(f'{t:.2f}' for t in r.cold)} | "
              f"{' '.join(f'{t:.2f}' for t in r.warm)} | {r.speedup:.2f}x | "
              f"{min(r.hits):.3f} | {r.equal} |")
        pairs[f"coffea_rerun_speedup_{r.compression}"] = f"{r.speedup:.2f}"
    pairs["coffea_hit_fraction"] = f"{min(h for r in results for h in r.hits):.3f}"
    pairs["coffea_results_equal"] = all(r.equal for r in results)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--compression", choices=("both", "lzma", "zstd"), default="both")
    parser.add_argument("--files", type=int, default=4)
    parser.add_argument("--events-per-file", type=int, default=500_000)
    parser.add_argument("--chunk-events", type=int, default=100_000)
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--degrade", choices=("zstd", "lzma", "none"), default="zstd")
    parser.add_argument("--small-cache-mb", type=float, default=32.0)
    parser.add_argument("--floor-mb", type=float, default=MemoryPolicy().floor_mb)
    parser.add_argument("--speculation", choices=("on", "off"), default="on",
                        help="backup copies (RunConfig.speculation): a copy that wins "
                             "stops its original, and a capped child stopped mid-call "
                             "takes its worker's cache with it")
    parser.add_argument("--data-dir", type=Path, default=common.REPO / "build" / "bench-data")
    parser.add_argument("--coffea", choices=("both", "lzma", "zstd", "none"), default="none",
                        help="also a coffea Runner called twice through one "
                             "DatavineExecutor (coffea_rerun_speedup_*=)")
    parser.add_argument("--cold-cost", choices=("zstd", "lzma", "none"), default="none",
                        help="also cold runs with the column cache on against off "
                             "(cold_cost_ratio=: best on / best off)")
    parser.add_argument("--box", action="store_true",
                        help="measure the input-bytes cache on the box instead (root)")
    parser.add_argument("--box-files", type=int, default=16)
    parser.add_argument("--box-events", type=int, default=100_000)
    parser.add_argument("--box-racks", type=int, default=2)
    parser.add_argument("--box-hosts-per-rack", type=int, default=2)
    parser.add_argument("--box-cache-mb", type=float, default=1024.0)
    parser.add_argument("--box-timeout", type=float, default=300.0)
    parser.add_argument("--box-data-dir", type=Path, default=common.RUNS.parent / "box-data")
    args = parser.parse_args()
    common.setup()
    if args.box:
        return box_rerun(args)
    print(f"# {common.machine_info()}", file=sys.stderr, flush=True)
    kinds = ("lzma", "zstd") if args.compression == "both" else (args.compression,)
    chunks_of = {}
    extra = [k for k in (args.degrade, args.cold_cost) if k != "none"]
    for kind in (*kinds, *extra):
        if kind in chunks_of:
            continue
        paths = analysis.dataset(args.data_dir, kind, args.files * args.events_per_file,
                                 args.files, 2)
        analysis.warm_page_cache(paths)
        chunks_of[kind] = agc.make_chunks(paths, args.chunk_events)
    results = [rerun(kind, chunks_of[kind], args) for kind in kinds]
    small, off = (degrade(chunks_of[args.degrade], args) if args.degrade != "none"
                  else ([], []))
    coffea_kinds = {"both": ("lzma", "zstd"), "none": ()}.get(args.coffea, (args.coffea,))
    coffea_results = [coffea_rerun(kind, args) for kind in coffea_kinds]
    cold_on, cold_off = (cold_cost(chunks_of[args.cold_cost], args)
                         if args.cold_cost != "none" else ([], []))

    print(f"\n{common.machine_info()}")
    print(f"{args.workers} workers x 1 core, {args.files} files x {args.events_per_file} events, "
          f"{args.chunk_events}-event chunks, {args.rounds} rounds, memory caps >= "
          f"{args.floor_mb:g} MB, backup copies {args.speculation}\n")
    print("| compression | cold s (each round) | warm s | speedup (median) | warm hit fraction "
          "| peak/cap | overruns | warm = cold |")
    print("|---|---|---|---|---|---|---|---|")
    for r in results:
        print(f"| {r.compression} | {' '.join(f'{t.seconds:.2f}' for t in r.cold)} | "
              f"{' '.join(f'{t.seconds:.2f}' for t in r.warm)} | {r.speedup:.2f}x | "
              f"{min(t.hit_fraction for t in r.warm):.3f} | "
              f"{max(t.peak_over_cap for t in (*r.cold, *r.warm)):.2f} | "
              f"{sum(t.overruns for t in (*r.cold, *r.warm))} | {r.equal} |")
    ratio = statistics.median(small) / statistics.median(off) if small else float("nan")
    if small:
        print(f"\nworking set over the cache ({args.degrade}, {args.small_cache_mb:g} MB per "
              f"worker): second run {' '.join(f'{s:.2f}' for s in small)} s against cache "
              f"off {' '.join(f'{s:.2f}' for s in off)} s: {ratio:.3f}x the cache-off time")
    by = {r.compression: r for r in results}
    pairs: dict[str, object] = {}
    for kind in ("lzma", "zstd"):
        if kind in by:
            pairs[f"rerun_speedup_{kind}"] = f"{by[kind].speedup:.2f}"
    pairs["hit_fraction"] = f"{min(t.hit_fraction for r in results for t in r.warm):.3f}"
    pairs["peak_over_cap"] = (
        f"{max(t.peak_over_cap for r in results for t in (*r.cold, *r.warm)):.2f}")
    pairs["overruns"] = sum(t.overruns for r in results for t in (*r.cold, *r.warm))
    pairs["degrade_ratio"] = f"{ratio:.3f}"
    pairs["results_equal"] = all(r.equal for r in results)
    if coffea_results:
        print_coffea(coffea_results, pairs)
    if cold_on:
        print(f"\ncold runs ({args.cold_cost}): cache on {' '.join(f'{s:.3f}' for s in cold_on)}"
              f" s, off {' '.join(f'{s:.3f}' for s in cold_off)} s")
        pairs["cold_cost_ratio"] = f"{min(cold_on) / min(cold_off):.3f}"
        pairs["cold_cost_median_ratio"] = (
            f"{statistics.median(cold_on) / statistics.median(cold_off):.3f}")
    print(common.kv_line(pairs))
    return 0


if __name__ == "__main__":
    sys.exit(main())
