"""Benchmark: the AGC-style ttbar selection over generated NanoAOD-like files, per executor.

The data (``--events`` in all, ``--files`` files, per compression) is generated once into
``--data-dir`` (default ``build/bench-data``, outside git) and reused; every file is read
once before any clock starts so that all peers find it in the page cache. The graph is one
:func:`datavine.apps.analysis.agc.process_item` task per chunk of ~``--chunk-events`` events and
a tree of merges (fan-in 8). Peers, each with its workers started before its clock:

- plain loop: :func:`~datavine.apps.analysis.agc.run_plain_loop` in this process (one core);
  it is the reference result and the single-core rate;
- plain loops, static split: ``workers * cores`` pre-started processes each run the plain
  loop over an equal share of the chunks: what the machine's cores really give together
  (the parallel ceiling), a reference and not a peer;
- dask threads / dask processes (a pre-started spawn pool) of ``workers * cores``;
- distributed: ``LocalCluster(workers, cores threads)``;
- DaskVine function-calls (and with ``--daskvine-tasks``, DaskVine tasks on a few chunks);
- datavine: ``datavine.LocalCluster(workers, cores)``, as configured by default; and
  "datavine, memory caps off" (``RunConfig(memory=None)``: bundles run in the library
  process, not in a forked child per bundle), to show what the caps cost. Only the first
  is the headline; neither counts as a peer.

Every peer's merged histogram, event and selection counts must equal the plain loop's.
Peers are started first; then ``--repeat`` rounds run each peer once in turn (load from
elsewhere falls on all alike; distributed runs alone, see :func:`run_rounds`) and each
peer's best run counts; all times are in the table. The last
line is ``events_per_s=... ratio_vs_limit=... ratio_vs_best_peer=...``, where the limit is
``workers * cores`` times the plain loop's events/s.

    .venv/bin/python benchmarks/analysis.py [--compression both|zstd|lzma]
        [--workers 2 --cores 1] [--events 4000000 --files 8 --chunk-events 100000]
        [--repeat 3] [--peers datavine plain_loop ...] [--daskvine-tasks]
"""

from __future__ import annotations

import argparse
import concurrent.futures
import contextlib
import multiprocessing
import os
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import common
import dask
import dask.multiprocessing
import dask.threaded

from datavine.apps.analysis import agc
from datavine.io.datagen import generate_dataset

PEERS = ("plain_loop", "split_loops", "threads", "processes", "distributed", "daskvine_fc",
         "datavine", "datavine_nocap")
ISOLATED = ("distributed",)  # run alone: a thread in this process (see run_rounds)
REFERENCES = ("plain_loop", "split_loops", "datavine", "datavine_nocap")  # not peers
NAMES = {"split_loops": "plain loops, static split", "datavine": "datavine",
         "datavine_nocap": "datavine, memory caps off",
         "daskvine_fc": "DaskVine function-calls",
         "daskvine_tasks": "DaskVine tasks", "threads": "dask threads",
         "processes": "dask processes", "distributed": "distributed",
         "plain_loop": "plain loop"}
FAN_IN = 8


# Merges live in this script (__main__), so every peer ships them by value.
def merge(*parts: agc.ChunkResult) -> agc.ChunkResult:
    return sum(parts, agc.ChunkResult.empty())


# --- data --------------------------------------------------------------------------------
def dataset(data_dir: Path, compression: str, events: int, files: int,
            parallel: int) -> list[Path]:
    """``files`` files of ``events / files`` events each, generated once, in parallel.

    File ``i`` is its own one-file dataset (seed ``i``) in ``part-i``: each has its own
    manifest, so parallel generation needs no lock, and a second call only checks them.
    """
    per_file = -(-events // files)
    root = data_dir / f"{compression}-{files}x{per_file}"
    jobs = [(root / f"part-{i:03d}", compression, per_file, i) for i in range(files)]
    started = time.perf_counter()
    with concurrent.futures.ProcessPoolExecutor(
            max(1, min(parallel, files)), mp_context=multiprocessing.get_context("spawn")) as pool:
        paths = [p for part in pool.map(_generate_part, jobs) for p in part]
    seconds = time.perf_counter() - started
    if seconds > 5:
        print(f"# generated {files} {compression} files in {seconds:.0f} s under {root}",
              file=sys.stderr, flush=True)
    return paths


def _generate_part(job: tuple[Path, str, int, int]) -> list[Path]:
    directory, compression, per_file, seed = job
    return generate_dataset(directory, 1, per_file, compression, seed=seed)


def warm_page_cache(paths: list[Path]) -> int:
    """Read every file once (outside the clocks); returns the bytes read."""
    total = 0
    for path in paths:
        with open(path, "rb") as f:
            while block := f.read(1 << 24):
                total += len(block)
    return total


# --- graph -------------------------------------------------------------------------------
def build_graph(chunks: list[agc.Chunk]) -> Any:
    """One task per chunk, then merges of ``FAN_IN`` until one result is left."""
    level = [dask.delayed(agc.process_item, pure=False)(chunk) for chunk in chunks]
    while len(level) > 1:
        level = [dask.delayed(merge, pure=False)(*level[i:i + FAN_IN])
                 for i in range(0, len(level), FAN_IN)]
    return level[0]


def same_result(a: Any, b: agc.ChunkResult) -> bool:
    """Equal histogram, events and selected events (the analysis' result)."""
    while isinstance(a, (list, tuple)) and len(a) == 1:
        a = a[0]
    return isinstance(a, agc.ChunkResult) and a.same_selection(b)


# --- peers -------------------------------------------------------------------------------
Compute = Callable[[list[agc.Chunk]], Any]


def open_peer(peer: str, args: argparse.Namespace, stack: contextlib.ExitStack
              ) -> tuple[Compute, str]:
    """Start ``peer``'s workers (closed with ``stack``); its compute function and a note."""
    slots, shape = args.workers * args.cores, f"{args.workers}x{args.cores}"

    def via(get: Callable[..., Any]) -> Compute:
        return lambda chunks: dask.compute(build_graph(chunks), scheduler=get)[0]

    def pool() -> concurrent.futures.ProcessPoolExecutor:
        started = stack.enter_context(concurrent.futures.ProcessPoolExecutor(
            slots, mp_context=multiprocessing.get_context("spawn")))
        list(started.map(_hold, range(slots)))  # every process up, its imports done
        return started

    if peer == "plain_loop":
        return agc.run_plain_loop, "one process, one core"
    if peer == "split_loops":
        split = pool()
        return (lambda chunks: sum(split.map(agc.run_plain_loop,
                                             [chunks[i::slots] for i in range(slots)]),
                                   agc.ChunkResult.empty()),
                f"{slots} processes, an equal share of the chunks each: the parallel ceiling")
    if peer == "threads":
        return via(lambda d, k, **kw: dask.threaded.get(d, k, num_workers=slots, **kw)), \
            f"{slots} threads"
    if peer == "processes":
        procs = pool()
        return via(lambda d, k, **kw: dask.multiprocessing.get(
            d, k, pool=procs, num_workers=slots, **kw)), f"{slots} processes (spawn)"
    if peer == "distributed":
        return via(stack.enter_context(common.distributed_client(args.workers, args.cores)).get
                   ), shape
    if peer in ("daskvine_fc", "daskvine_tasks"):
        mode = "function-calls" if peer == "daskvine_fc" else "tasks"
        get = common.daskvine_get(stack.enter_context(common.daskvine(args.workers,
                                                                      args.cores)),
                                  mode, args.cores)

        def compute(chunks: list[agc.Chunk]) -> Any:
            total = build_graph(chunks)
            return get(dict(total.__dask_graph__()), total.__dask_keys__())

        return compute, f"{shape}, " + ("a library per run, exec fork"
                                        if mode == "function-calls" else "a Python per task")
    if peer in ("datavine", "datavine_nocap"):
        import datavine

        options = {"memory": None} if peer == "datavine_nocap" else {}
        cluster = stack.enter_context(datavine.LocalCluster(
            workers=args.workers, cores=args.cores,
            manager=datavine.ManagerConfig(run_dir=common.run_dir("datavine")), **options))
        run = via(cluster.get)

        def cold(chunks: list[agc.Chunk]) -> Any:
            cluster.drop_caches()  # decoded from the files each time, as every peer's run
            return run(chunks)

        return cold, shape + ("; RunConfig(memory=None)" if options else "")
    raise ValueError(f"unknown peer {peer!r}: choose from {', '.join(PEERS)}")


def _hold(_: int) -> int:
    time.sleep(0.2)  # busy long enough that each of the pool's processes gets one call
    return os.getpid()


def run_rounds(chunks: list[agc.Chunk], args: argparse.Namespace
               ) -> dict[str, list[common.PeerResult]]:
    """Each peer's ``--repeat`` runs, checked against the plain loop's result.

    All peers but distributed are started at once, then run in rounds of one run each, the
    plain loop first (its first result is the reference), so that load from elsewhere on
    the machine falls on every peer alike. distributed runs alone, after them: its
    scheduler's event loop is a thread of this process, and an idle one slowed datavine
    here by ~25% (TaskVine's ``Manager.wait`` holds the GIL; hand-offs cost).
    """
    events = sum(c.entry_stop - c.entry_start for c in chunks)
    runs: dict[str, list[common.PeerResult]] = {p: [] for p in args.peers}
    reference: agc.ChunkResult | None = None
    together = sorted((p for p in args.peers if p not in ISOLATED), key=lambda p: p != "plain_loop")
    alone = [p for p in args.peers if p in ISOLATED]
    for group in [together] + [[p] for p in alone]:
        with contextlib.ExitStack() as stack:
            peers = {p: open_peer(p, args, stack) for p in group}
            for _ in range(args.repeat):
                for peer, (compute, note) in peers.items():
                    result, value = timed_run(peer, lambda c=compute: c(chunks), events,
                                              reference, note)
                    runs[peer].append(result)
                    if peer == "plain_loop" and reference is None and result.ok:
                        reference = value
    return runs


def timed_run(peer: str, compute: Callable[[], Any], events: int,
              reference: agc.ChunkResult | None, note: str) -> tuple[common.PeerResult, Any]:
    """One timed run, checked against ``reference`` (or for its event count without one)."""
    value: list[Any] = []

    def run() -> Any:
        value.append(compute())
        return value[0]

    def check(result: Any) -> bool:
        if reference is None:
            return isinstance(result, agc.ChunkResult) and result.events == events
        return same_result(result, reference)

    return common.measure(NAMES[peer], events, run, check, note), (value or [None])[0]


def run_daskvine_tasks(chunks: list[agc.Chunk], args: argparse.Namespace
                       ) -> common.PeerResult:
    """DaskVine's tasks mode (a new Python per task), once, on the first few chunks."""
    subset = chunks[:args.daskvine_tasks_chunks]
    reference = agc.run_plain_loop(subset)
    with contextlib.ExitStack() as stack:
        compute, note = open_peer("daskvine_tasks", args, stack)
        return common.measure(NAMES["daskvine_tasks"], reference.events,
                              lambda: compute(subset), lambda v: same_result(v, reference),
                              f"{note}; first {len(subset)} chunks")


def best_noted(peer: str, runs: list[common.PeerResult]) -> common.PeerResult:
    """The best run, with every run's time in its note."""
    best = common.best_of(runs)
    times = ", ".join(f"{r.seconds:.2f}" for r in runs if r.seconds is not None)
    first = ("; run 1 includes the analysis imports in the library"
             if peer.startswith("datavine") else "")
    best.note = f"{best.note}{first}; runs {times} s"
    return best


# --- one compression ---------------------------------------------------------------------
def run_compression(compression: str, args: argparse.Namespace) -> dict[str, Any]:
    files = dataset(args.data_dir, compression, args.events, args.files,
                    parallel=len(os.sched_getaffinity(0)))
    chunks = agc.make_chunks(files, args.chunk_events)
    size = warm_page_cache(files)
    events = sum(c.entry_stop - c.entry_start for c in chunks)
    print(f"## {compression}: {len(files)} files, {size / 1e6:.0f} MB, {events:,} events, "
          f"{len(chunks)} chunks; {common.machine_info()}", flush=True)
    all_runs = run_rounds(chunks, args)
    results = {peer: best_noted(peer, runs) for peer, runs in all_runs.items()}
    if args.daskvine_tasks:
        results["daskvine_tasks"] = run_daskvine_tasks(chunks, args)
    print(f"# after the runs: {common.machine_info()}", flush=True)
    print(common.table(list(results.values()), "events"), flush=True)
    out = summarise(compression, results, args.workers * args.cores)
    if "datavine" in all_runs:
        first = all_runs["datavine"][0].rate
        out["datavine_first_run_events_per_s"] = f"{first:.0f}" if first else "nan"
    print(f"# {compression}: " + common.kv_line(out), flush=True)
    return out


def summarise(compression: str, results: dict[str, common.PeerResult],
              slots: int) -> dict[str, Any]:
    mine = results["datavine"].rate if "datavine" in results else None
    plain = results["plain_loop"].rate if "plain_loop" in results else None
    limit = plain * slots if plain else None
    others = [r for p, r in results.items() if p not in REFERENCES]
    best_peer = common.best_of(others) if others else None
    out: dict[str, Any] = {
        "events_per_s": f"{mine:.0f}" if mine else "nan",
        "ratio_vs_limit": common.ratio(mine, limit),
        "ratio_vs_best_peer": common.ratio(mine, best_peer.rate if best_peer else None),
        "best_peer": common.slug(best_peer.name) if best_peer else "none",
        "limit_events_per_s": f"{limit:.0f}" if limit else "nan",
    }
    if "split_loops" in results:
        ceiling = results["split_loops"].rate
        out["ceiling_vs_limit"] = common.ratio(ceiling, limit)
        out["ratio_vs_ceiling"] = common.ratio(mine, ceiling)
    if "datavine_nocap" in results:
        nocap = results["datavine_nocap"].rate
        out["nocap_ratio_vs_limit"] = common.ratio(nocap, limit)
        out["nocap_ratio_vs_best_peer"] = common.ratio(nocap,
                                                       best_peer.rate if best_peer else None)
    for peer, result in results.items():
        out[f"{peer}_events_per_s"] = f"{result.rate:.0f}" if result.rate else "nan"
    out["all_correct"] = int(all(r.ok for r in results.values()))
    return out


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--compression", choices=("both", "zstd", "lzma"), default="both")
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument("--cores", type=int, default=1, help="cores per worker")
    parser.add_argument("--events", type=int, default=4_000_000, help="events per compression")
    parser.add_argument("--files", type=int, default=8)
    parser.add_argument("--chunk-events", type=int, default=100_000)
    parser.add_argument("--repeat", type=int, default=3, help="timed runs per peer, best kept")
    parser.add_argument("--peers", nargs="+", default=list(PEERS), choices=PEERS)
    parser.add_argument("--daskvine-tasks", action="store_true",
                        help="also run DaskVine's tasks mode (a Python per task) on a few chunks")
    parser.add_argument("--daskvine-tasks-chunks", type=int, default=8)
    parser.add_argument("--data-dir", type=Path, default=common.REPO / "build" / "bench-data")
    args = parser.parse_args(argv)
    if args.events < args.files or args.files < 1 or args.chunk_events < 1:
        parser.error("need --files >= 1, --events >= --files and --chunk-events >= 1")
    common.setup()

    kinds = ("zstd", "lzma") if args.compression == "both" else (args.compression,)
    outcome = {kind: run_compression(kind, args) for kind in kinds}
    first = outcome[kinds[0]]
    pairs = {k: first[k] for k in ("events_per_s", "ratio_vs_limit", "ratio_vs_best_peer")}
    pairs["compression"] = kinds[0]
    for kind in kinds[1:]:
        pairs.update({f"{kind}_{k}": outcome[kind][k]
                      for k in ("events_per_s", "ratio_vs_limit", "ratio_vs_best_peer")})
    pairs["workers"], pairs["cores"] = args.workers, args.cores
    pairs["all_correct"] = int(all(o["all_correct"] for o in outcome.values()))
    print(common.kv_line(pairs), flush=True)
    return 0 if pairs["all_correct"] else 1


if __name__ == "__main__":
    sys.exit(main())
