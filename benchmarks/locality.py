"""Benchmark: reads near the data with XCache shards in two racks, datavine vs locality-blind.

Setup (issue 3): two racks of 2 local TaskVine workers each (``rack-a``: local-0,1,
``rack-b``: local-2,3), 4 real XCache shards on loopback (``xcache-0,1`` in rack-a,
``xcache-2,3`` in rack-b) in front of one origin xrootd, ``--files`` generated NanoAOD-like
ZSTD files, and the AGC-style analysis: one task per chunk calling :func:`read_chunk`
(:func:`datavine.open_input` opens the file on its shard; the runtime accounts the bytes),
merged in a tree. Two modes, each with its own testbed (fresh, empty caches) and cluster:

- ``blind``: ``RunConfig(placement=None)``: TaskVine puts tasks anywhere;
- ``datavine``: ``RunConfig(placement=PlacementPolicy())``: delay scheduling towards a
  worker that read the file before, else a worker in the rack of the file's shard.

Both clusters and testbeds are up before any clock starts. Each mode runs once on cold caches
(the first run also starts the workers' libraries), then ``--warm-runs`` times on warm
caches; the runs alternate between the modes so that load from elsewhere falls on both
alike. Every result must equal the plain loop's. Per run: seconds, events/s, the near-byte
fraction (bytes read from a shard in the worker's own rack), bytes the origin sent (its
summary monitoring), per shard the bytes hit and missed in its cache (the ``.cinfo``
records), chunks per worker, and the share of worker time idle (TaskVine's transactions
log; 4 workers on 2 cores hide idle gaps from events/s, see :func:`idle_share`). The last
line is ``near_fraction=`` (the datavine warm runs' lowest), ``throughput_ratio=`` (best
datavine warm events/s / best blind warm events/s), ``throughput_ratio_median=`` (the same
with the medians) and more.

    .venv/bin/python benchmarks/locality.py [--files 64 --events-per-file 50000]
        [--chunk-events 50000] [--warm-runs 3] [--data-dir DIR]
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import statistics
import sys
import time
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import common  # this script's folder is on sys.path when it runs
import dask

import datavine
from datavine.apps.analysis import agc
from datavine.apps.analysis.sources import to_origin
from datavine.io.datagen import generate_dataset

SHARD_RACKS = ("rack-a", "rack-a", "rack-b", "rack-b")
WORKER_RACKS = ("rack-a", "rack-b")
WORKERS = 4
MODES = ("blind", "datavine")
FAN_IN = 8
MB = 1e6


# --- what the tasks run (this script is __main__: the functions travel by value) -----------
def read_chunk(url: str, start: int, stop: int) -> agc.ChunkResult:
    with datavine.open_input(url) as f:
        return agc.process_chunk(f, start, stop)


def merge(*parts: agc.ChunkResult) -> agc.ChunkResult:
    return sum(parts, agc.ChunkResult.empty())


def build_graph(chunks: list[agc.Chunk]) -> Any:
    level = [dask.delayed(read_chunk, pure=False)(c.path, c.entry_start, c.entry_stop)
             for c in chunks]
    while len(level) > 1:
        level = [dask.delayed(merge, pure=False)(*level[i:i + FAN_IN])
                 for i in range(0, len(level), FAN_IN)]
    return level[0]


# --- one run -------------------------------------------------------------------------------
@dataclass
class RunRecord:
    mode: str
    label: str  # cold, warm-1, ...
    events: int
    seconds: float
    correct: bool
    near_fraction: float
    near_mb: float
    far_mb: float
    origin_mb: float
    origin_opens: int
    shard_hit_mb: dict[str, float] = field(default_factory=dict)
    shard_miss_mb: dict[str, float] = field(default_factory=dict)
    placement: Counter[str] = field(default_factory=Counter)
    failovers: int = 0
    per_worker: dict[str, int] = field(default_factory=dict)  # chunk tasks each worker ran
    idle: float = float("nan")  # share of worker time with no call executing (see idle_share)
    note: str = ""

    @property
    def events_per_s(self) -> float:
        return self.events / self.seconds if self.seconds > 0 else 0.0


@dataclass
class Mode:
    """One mode's testbed, cluster and chunks (URLs at its own origin)."""

    name: str
    testbed: Any
    cluster: Any
    chunks: list[agc.Chunk]
    lfns: list[str]


def shard_bytes(stats: Any, names: dict[int, str]) -> tuple[Counter[str], Counter[str]]:
    """Bytes hit and missed so far in each shard's cache, summed over its files."""
    hit: Counter[str] = Counter()
    miss: Counter[str] = Counter()
    for index, files in stats.shards.items():
        hit[names[index]] += sum(f.bytes_hit for f in files.values())
        miss[names[index]] += sum(f.bytes_miss for f in files.values())
    return hit, miss


def accesses(stats: Any, lfn: str) -> int:
    return sum(files[lfn].accesses for files in stats.shards.values() if lfn in files)


def settled_stats(testbed: Any, lfns: list[str], seen: dict[str, int],
                  timeout_s: float = 60.0) -> tuple[Any, str]:
    """Statistics once every file has a new access record (a shard writes one when it
    detaches the closed file, shortly after the run); a note if some never came."""
    deadline = time.monotonic() + timeout_s
    while True:
        stats = testbed.cache_stats(fresh=False)
        late = [f for f in lfns if accesses(stats, f) <= seen.get(f, 0)]
        if not late or time.monotonic() > deadline:
            break
        time.sleep(0.2)
    note = f"{len(late)} files without a new cache record after {timeout_s:.0f} s" if late else ""
    return testbed.cache_stats(), note


def chunks_per_worker(summary: Any) -> dict[str, int]:
    """How many chunk tasks each worker ran (from the run's completion records)."""
    counts = Counter({f"local-{i}": 0 for i in range(WORKERS)})
    counts.update(w for _, key, w in summary.completions
                  if str(key).startswith(read_chunk.__name__))
    return dict(sorted(counts.items()))


def idle_share(transactions: Path, start: float, end: float, workers: int) -> float:
    """Share of the workers' time in ``[start, end]`` (epoch seconds) with no function call
    executing, from TaskVine's transactions log (each call's worker and its
    ``time_worker_start``/``end``). Unlike events/s, it shows the scheduler's gaps even where
    4 workers share 2 cores (an idle worker lends its core to the others)."""
    where: dict[str, str] = {}
    busy: dict[str, list[tuple[float, float]]] = {}
    for line in transactions.read_text(errors="replace").splitlines():
        parts = line.split(maxsplit=6)
        if len(parts) < 6 or parts[2] != "TASK":
            continue
        if parts[4] == "RUNNING":
            where[parts[3]] = parts[5]
        elif parts[4] == "RETRIEVED" and parts[5] == "SUCCESS" and parts[3] in where:
            times = json.loads(line[line.rindex(" {") + 1:])
            t0, t1 = times["time_worker_start"][0], times["time_worker_end"][0]
            if t1 > start and t0 < end:
                busy.setdefault(where[parts[3]], []).append((max(t0, start), min(t1, end)))
    covered = 0.0
    for spans in busy.values():
        last = start
        for t0, t1 in sorted(spans):
            covered += max(0.0, t1 - max(t0, last))
            last = max(last, t1)
    return 1.0 - covered / (workers * (end - start)) if end > start else float("nan")


def timed_run(mode: Mode, label: str, reference: agc.ChunkResult) -> RunRecord:
    tb = mode.testbed
    names = {s.index: s.name for s in tb.shards}
    before = tb.cache_stats()
    seen = {f: accesses(before, f) for f in mode.lfns}
    graph = build_graph(mode.chunks)
    # the run before left the shards' cache files to be written out and its servers
    # settling: not on this run's clock (a cold run right after the other mode's took ~1.3x
    # as long, whichever mode went second)
    os.sync()
    common.quiesce()
    print(f"# {mode.name} {label} ...", file=sys.stderr, flush=True)
    started, wall_start = time.perf_counter(), time.time()
    (result,) = dask.compute(graph, scheduler=mode.cluster.get)
    seconds, wall_end = time.perf_counter() - started, time.time()
    after, note = settled_stats(tb, mode.lfns, seen)
    summary = mode.cluster.last_summary
    hit0, miss0 = shard_bytes(before, names)
    hit1, miss1 = shard_bytes(after, names)
    reads = summary.reads
    record = RunRecord(
        mode.name, label, reference.events, seconds, result.same_selection(reference),
        reads.near_fraction,
        reads.near_bytes / MB, reads.far_bytes / MB,
        (after.origin.bytes_out - before.origin.bytes_out) / MB,
        after.origin.opens - before.origin.opens,
        {n: (hit1[n] - hit0[n]) / MB for n in names.values()},
        {n: (miss1[n] - miss0[n]) / MB for n in names.values()},
        Counter(summary.placement), reads.failovers, chunks_per_worker(summary),
        idle_share(mode.cluster.runtime.info_dir / "vine-logs" / "transactions", wall_start,
                   wall_end, WORKERS), note)
    print(f"#   {seconds:.2f} s, {record.events_per_s:,.0f} events/s, "
          f"{record.near_fraction:.1%} near, workers idle {record.idle:.0%}, "
          f"correct={record.correct}", file=sys.stderr,
          flush=True)
    return record


# --- set-up --------------------------------------------------------------------------------
def dataset(args: argparse.Namespace) -> tuple[Path, list[Path]]:
    """The files, generated once into a folder the xrootd user can read."""
    root = args.data_dir / f"zstd-{args.files}x{args.events_per_file}"
    started = time.perf_counter()
    paths = generate_dataset(root, args.files, args.events_per_file, compression="zstd")
    if time.perf_counter() - started > 5:
        print(f"# generated {args.files} files in {time.perf_counter() - started:.0f} s "
              f"under {root}", file=sys.stderr, flush=True)
    for p in [*reversed(root.parents), root, *root.rglob("*")]:
        if p.is_relative_to(args.data_dir):
            p.chmod(0o755 if p.is_dir() else 0o644)
    return root, paths


def open_mode(name: str, root: Path, chunks: list[agc.Chunk], stack: contextlib.ExitStack,
              ) -> Mode:
    from datavine.io.xcache.testbed import XCacheTestbed

    tb = stack.enter_context(XCacheTestbed(root, n_shards=len(SHARD_RACKS), racks=SHARD_RACKS))
    placement = datavine.PlacementPolicy() if name == "datavine" else None
    run = datavine.RunConfig(placement=placement, shardmap=tb.shard_map(), timeout_s=600)
    manager = datavine.ManagerConfig(run_dir=common.run_dir(f"locality-{name}"))
    cluster = stack.enter_context(datavine.LocalCluster(
        workers=WORKERS, cores=1, racks=WORKER_RACKS, manager=manager, run=run))
    urls = to_origin(chunks, root, tb.origin_url)
    lfns = sorted({"/" + Path(c.path).relative_to(root).as_posix() for c in chunks})
    return Mode(name, tb, cluster, urls, lfns)


def layout(root: Path, paths: list[Path], smap: Any) -> str:
    """Files per shard and per rack (the shard map is the same in every testbed)."""
    lfns = ["/" + p.relative_to(root).as_posix() for p in paths]
    shards = Counter(smap.shard_for(f).name for f in lfns)
    racks = Counter(smap.rack_for(f) for f in lfns)
    return (", ".join(f"{s.name} ({s.rack}) {shards[s.name]}" for s in smap.shards)
            + "; per rack " + ", ".join(f"{r} {n}" for r, n in sorted(racks.items())))


# --- report --------------------------------------------------------------------------------
def table(records: list[RunRecord]) -> str:
    lines = ["| mode | run | s | events/s | near | near MB | far MB | origin MB | origin opens "
             "| shard hit/miss MB | placement | chunks per worker | workers idle | correct |",
             "|---|---|---:|---:|---:|---:|---:|---:|---:|---|---|---|---:|---|"]
    for r in records:
        shards = ", ".join(f"{n[-1]}: {r.shard_hit_mb[n]:.0f}/{r.shard_miss_mb[n]:.0f}"
                           for n in sorted(r.shard_hit_mb))
        placed = ", ".join(f"{k} {v}" for k, v in sorted(r.placement.items()))
        workers = "/".join(str(n) for n in r.per_worker.values())
        note = f" {r.note}" if r.note else ""
        lines.append(
            f"| {r.mode} | {r.label} | {r.seconds:.2f} | {r.events_per_s:,.0f} | "
            f"{r.near_fraction:.1%} | {r.near_mb:.0f} | {r.far_mb:.0f} | {r.origin_mb:.0f} | "
            f"{r.origin_opens} | {shards} | {placed} | {workers} | {r.idle:.0%} | "
            f"{'yes' if r.correct else 'NO'}{note} |")
    return "\n".join(lines)


def summarise(records: list[RunRecord]) -> dict[str, Any]:
    def runs(mode: str, warm: bool) -> list[RunRecord]:
        return [r for r in records if r.mode == mode and r.label.startswith("warm") == warm]

    def best(mode: str, warm: bool) -> float | None:
        rates = [r.events_per_s for r in runs(mode, warm) if r.correct]
        return max(rates) if rates else None

    def median(mode: str) -> float | None:
        rates = [r.events_per_s for r in runs(mode, True) if r.correct]
        return statistics.median(rates) if rates else None

    def fmt(x: float | None, digits: int = 0) -> str:
        return "nan" if x is None else f"{x:.{digits}f}"

    dv_warm, blind_warm = runs("datavine", True), runs("blind", True)
    dv_cold, blind_cold = runs("datavine", False), runs("blind", False)
    return {
        "near_fraction": fmt(min((r.near_fraction for r in dv_warm), default=None), 3),
        "throughput_ratio": common.ratio(best("datavine", True), best("blind", True)),
        "throughput_ratio_median": common.ratio(median("datavine"), median("blind")),
        "blind_near_fraction": fmt(max((r.near_fraction for r in blind_warm), default=None),
                                   3),
        "datavine_events_per_s": fmt(best("datavine", True)),
        "blind_events_per_s": fmt(best("blind", True)),
        "datavine_idle": fmt(statistics.median(r.idle for r in dv_warm) if dv_warm else None,
                             3),
        "blind_idle": fmt(statistics.median(r.idle for r in blind_warm) if blind_warm
                          else None, 3),
        "cold_near_fraction": fmt(dv_cold[0].near_fraction if dv_cold else None, 3),
        "cold_throughput_ratio": common.ratio(best("datavine", False), best("blind", False)),
        "cold_origin_mb": fmt(dv_cold[0].origin_mb if dv_cold else None, 1),
        "blind_cold_origin_mb": fmt(blind_cold[0].origin_mb if blind_cold else None, 1),
        "warm_origin_mb": fmt(sum(r.origin_mb for r in dv_warm + blind_warm), 1),
        "all_correct": int(all(r.correct for r in records)),
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--files", type=int, default=64)
    parser.add_argument("--events-per-file", type=int, default=50_000)
    parser.add_argument("--chunk-events", type=int, default=50_000)
    parser.add_argument("--warm-runs", type=int, default=3,
                        help="warm runs per mode after the cold one (best kept)")
    parser.add_argument("--data-dir", type=Path, default=Path("/tmp/datavine-bench-locality"),
                        help="where the files are generated; the xrootd user must reach it")
    args = parser.parse_args(argv)
    if args.files < 1 or args.events_per_file < 1 or args.chunk_events < 1 or \
            args.warm_runs < 1:
        parser.error("need --files, --events-per-file, --chunk-events, --warm-runs >= 1")
    args.data_dir = args.data_dir.resolve()
    common.setup()

    root, paths = dataset(args)
    chunks = agc.make_chunks(paths, args.chunk_events)
    reference = agc.run_plain_loop(chunks)
    size = sum(p.stat().st_size for p in paths)
    print(f"# locality: {len(paths)} ZSTD files, {size / MB:.0f} MB, {reference.events:,} "
          f"events, {len(chunks)} chunks; {WORKERS} workers x 1 core in racks "
          f"{'/'.join(WORKER_RACKS)}, 4 shards; {common.machine_info()}", flush=True)
    records: list[RunRecord] = []
    with contextlib.ExitStack() as stack:
        modes = [open_mode(name, root, chunks, stack) for name in MODES]
        print(f"# files per shard: {layout(root, paths, modes[0].testbed.shard_map())}",
              flush=True)
        for label in ["cold", *(f"warm-{i + 1}" for i in range(args.warm_runs))]:
            for mode in modes:
                records.append(timed_run(mode, label, reference))
    print(f"# after the runs: {common.machine_info()}", flush=True)
    print(table(records), flush=True)
    print(common.kv_line(summarise(records)), flush=True)
    return 0 if all(r.correct for r in records) else 1


if __name__ == "__main__":
    sys.exit(main())
