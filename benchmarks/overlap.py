"""Benchmark: reads overlapped with compute on the box (issue 29, item 4), prefetch on and off.

The box (:mod:`datavine.deploy.box`): 2 racks x 2 hosts, an XCache shard on a1 and on b1,
the origin on the manager host, one 1-core ``vine_worker`` on a2 and one on b2 (2 workers:
this machine's 2 cores). Each worker host's cable (its link to the shards) is shaped with
``tc tbf``, both ways, so that a chunk's read takes about as long as its compute: the rate is
the chunk's compressed bytes over its compute time, both measured first with the plain loop
on the local files (``--chunk-events`` events of the LZMA files, whose compute is long for
their bytes). The AGC analysis then runs on the manager host (this script again, as
``--drive``: a :class:`datavine.Cluster` from the box's facility file), placement off (every
worker reads at the shaped rate whatever the shard), no column cache (every chunk reads its
baskets), no backup copies:

- ``unshaped``: the links as they are: what the 2 cores do (the CPU ceiling, datavine's own
  costs in it);
- ``off``: shaped, ``RunConfig(prefetch_mb=0)``: reads and compute one after the other;
- ``on``: shaped, ``RunConfig(prefetch_mb=--prefetch-mb)``: the next chunk's baskets read
  while the current one computes.

Each of ``--rounds`` rounds runs ``unshaped``, then ``off`` and ``on`` (alternating which
goes first), after a warm-up run that fills the shards (every run reads warm shards); every
result is checked equal to the plain loop's. A round's ratios are events/s over the lower of
that round's CPU ceiling (its unshaped run: the machine's load drifts) and the links' rate (2
links x the shaped rate / bytes per event); ``on_ratio`` / ``off_ratio`` are the medians
over the rounds. Goal: on >= 0.9 (off ~0.5). Last line key=value.

    .venv/bin/python benchmarks/overlap.py [--files 4 --events 500000 --chunk-events 50000]

Needs root (namespaces, tc) and XRootD (scripts/setup.sh --xcache); generates LZMA files
(slow, once) unless ``build/bench-data/lzma-4x500000`` has them.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import pickle
import shutil
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

WORKER_HOSTS = ("a2", "b2")
ROOT = Path(__file__).resolve().parent.parent
LZMA_DATA = ROOT / "build" / "bench-data" / "lzma-4x500000"


# --- on the manager host ----------------------------------------------------------------------
def drive(plan_path: Path) -> int:
    """The timed analysis on the box's workers; prints one JSON line."""
    import common  # this script's folder is on sys.path when it runs
    import dask

    import datavine
    from datavine.apps.analysis.sources import XCacheShards, analysis_graph

    plan = json.loads(plan_path.read_text())
    facility, shards, chunks = common.box_chunks(plan)
    run = facility.run.replace(shardmap=shards, progress=False, placement=None,
                               column_cache=False, speculation=False,
                               prefetch_mb=plan["prefetch_mb"],
                               bundles_per_slot=plan["bundles_per_slot"])
    with datavine.Cluster(facility.manager, run, min_workers=len(WORKER_HOSTS),
                          connect_timeout_s=90, dashboard=False) as cluster:
        graph = analysis_graph(XCacheShards(shards), chunks)
        t0 = time.monotonic()
        (result,) = dask.compute(graph, scheduler=cluster.get)
        seconds = time.monotonic() - t0
        summary = cluster.last_summary
    reference = pickle.loads(Path(plan["reference"]).read_bytes())
    reads = summary.reads if summary is not None else None
    if summary is not None:
        print("\n".join(summary.lines()), file=sys.stderr)
    print(json.dumps({
        "seconds": seconds, "events": result.result.events,
        "correct": result.result == reference,
        "bytes": (reads.near_bytes + reads.far_bytes) if reads is not None else None,
        "prefetched_bytes": getattr(reads, "prefetched_bytes", None),
        "prefetched_opens": getattr(reads, "prefetched_opens", None),
        "opens": reads.opens if reads is not None else None,
    }))
    return 0


# --- on this machine --------------------------------------------------------------------------
def dataset(args: argparse.Namespace, data: Path) -> list[Path]:
    """The LZMA files, in a folder the box's xrootd user can read (copied from
    ``build/bench-data`` when they are there, else generated)."""
    import common

    from datavine.io.datagen import generate_dataset

    data.mkdir(parents=True, exist_ok=True)
    kept = sorted(LZMA_DATA.glob("part-*/*.root"))
    files: list[Path] = []
    if args.events == 500_000 and len(kept) >= args.files:
        for i, src in enumerate(kept[:args.files]):
            dst = data / f"lzma_{i:04d}.root"
            if not dst.exists():
                shutil.copy(src, dst)
            files.append(dst)
    else:
        files = generate_dataset(data, args.files, args.events, "lzma")
    return common.make_readable(data, files)


def calibrate(files: list[Path], chunk_events: int) -> tuple[float, float, Any]:
    """The plain loop on the local files, one process: (compute seconds per chunk, median;
    compressed bytes per event) and the loop's result (the reference)."""
    from datavine.apps.analysis.agc import ChunkResult, make_chunks, process_chunk

    chunks = make_chunks([str(f) for f in files], chunk_events)
    times, total = [], ChunkResult.empty()
    for c in chunks:
        t0 = time.perf_counter()
        part = process_chunk(c.path, c.entry_start, c.entry_stop)
        times.append(time.perf_counter() - t0)
        total = total + part
    per_event = total.bytes_read / max(1, total.events)
    return statistics.median(times), per_event, total


def run_once(box: Any, plan: dict[str, Any], mode: str, mbit: float | None,
             timeout: float) -> dict[str, Any]:
    from datavine.deploy.box.facility import start_workers, stop_workers
    from datavine.deploy.box.slowdown import slow_host_link

    stop_workers(box)
    start_workers(box, hosts=list(WORKER_HOSTS))
    path = box.dir / f"plan-{mode}.json"
    path.write_text(json.dumps(plan))
    load = os.getloadavg()[0]
    with contextlib.ExitStack() as stack:
        if mbit is not None:
            for host in WORKER_HOSTS:
                stack.enter_context(slow_host_link(box, host, mbit))
        done = box.run("mgr", [sys.executable, str(Path(__file__).resolve()), "--drive",
                               str(path)], timeout_s=timeout, check=False)
    if done.returncode != 0:
        tail = (done.stderr or done.stdout).strip().splitlines()[-5:]
        return {"mode": mode, "error": f"exit {done.returncode}: {' | '.join(tail)}",
                "load": load}
    record = json.loads(done.stdout.strip().splitlines()[-1])
    record.update(mode=mode, load=load, summary=[line for line in done.stderr.splitlines()
                                                 if "prefetch" in line or "reads:" in line])
    return record


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--drive", type=Path, help=argparse.SUPPRESS)  # on the manager host
    parser.add_argument("--files", type=int, default=4)
    parser.add_argument("--events", type=int, default=500_000)
    parser.add_argument("--chunk-events", type=int, default=50_000)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--prefetch-mb", type=float, default=64.0)
    parser.add_argument("--bundles-per-slot", type=int, default=2,
                        help="calls held per worker core: 3 starts a chunk's read ahead a "
                             "whole call earlier (the link never waits for the manager)")
    parser.add_argument("--link-factor", type=float, default=1.0,
                        help="shaped rate = this x (chunk bytes / chunk compute time)")
    parser.add_argument("--timeout", type=float, default=300.0)
    parser.add_argument("--workdir", type=Path, default=None)
    args = parser.parse_args()
    if args.drive is not None:
        return drive(args.drive)

    from datavine.deploy.box.facility import bring_up, take_down
    from datavine.deploy.box.net import box_missing
    from datavine.deploy.box.plan import BoxSpec

    missing = box_missing()
    if missing:
        print(f"overlap: the box cannot run here: {missing}")
        return 2
    workdir = args.workdir or Path(tempfile.mkdtemp(prefix="datavine-overlap-"))
    workdir.mkdir(parents=True, exist_ok=True)
    workdir.chmod(0o755)  # the box's xrootd servers run as their own user and enter it
    data = ROOT / "build" / "bench-data" / f"overlap-lzma-{args.files}x{args.events}"
    files = dataset(args, data)
    t_chunk, bytes_per_event, reference = calibrate(files, args.chunk_events)
    chunk_bytes = bytes_per_event * args.chunk_events
    mbit = args.link_factor * chunk_bytes * 8 / t_chunk / 1e6
    ref_path = workdir / "reference.pkl"
    ref_path.write_bytes(pickle.dumps(reference))
    events = reference.events
    print(f"calibration: {t_chunk * 1e3:.0f} ms compute and {chunk_bytes / 1e6:.2f} MB per "
          f"{args.chunk_events:,}-event chunk (plain loop, one process); links shaped to "
          f"{mbit:.1f} Mbit/s; load {os.getloadavg()[0]:.2f}")
    links_eps = len(WORKER_HOSTS) * (mbit * 1e6 / 8) / bytes_per_event  # events/s
    box = bring_up(BoxSpec(name="ovl", racks=2, hosts_per_rack=2, link_mbit=2000.0),
                   workdir / "box", data=data)
    runs: list[dict[str, Any]] = []
    try:
        plan = {"facility": str(box.dir / "facility.toml"), "files": [str(f) for f in files],
                "chunk_events": args.chunk_events, "reference": str(ref_path),
                "prefetch_mb": 0.0, "bundles_per_slot": args.bundles_per_slot}
        warm = run_once(box, plan, "warm-up", None, args.timeout)  # fills the shards
        print(f"warm-up: {warm.get('seconds', 0):.2f} s {warm.get('error', '')}")
        order = ("off", "on")
        for r in range(args.rounds):  # each round measures its own ceiling: load drifts
            for mode in ("unshaped", *(order if r % 2 == 0 else order[::-1])):
                plan["prefetch_mb"] = args.prefetch_mb if mode == "on" else 0.0
                runs.append(run_once(box, plan, mode, None if mode == "unshaped" else mbit,
                                     args.timeout))
                last = runs[-1]
                last["round"] = r
                print(f"{mode:>8}: {last.get('seconds', float('nan')):.2f} s, "
                      f"{events / last['seconds'] if last.get('seconds') else 0:,.0f} ev/s, "
                      f"correct {last.get('correct')}, prefetched "
                      f"{(last.get('prefetched_bytes') or 0) / 1e6:.1f} MB in "
                      f"{last.get('prefetched_opens')} of {last.get('opens')} opens, load "
                      f"{last['load']:.2f} {last.get('error', '')}", flush=True)
    finally:
        take_down(box)

    def eps(mode: str, r: int) -> float | None:
        secs = [x["seconds"] for x in runs if x["mode"] == mode and x.get("round") == r
                and x.get("seconds") and x.get("correct")]
        return events / min(secs) if secs else None

    rounds: list[tuple[float, float]] = []  # (on, off) over that round's ceiling
    for r in range(args.rounds):
        unshaped, off, on = eps("unshaped", r), eps("off", r), eps("on", r)
        if unshaped and off and on:
            ceiling = min(unshaped, links_eps)
            rounds.append((on / ceiling, off / ceiling))
            print(f"round {r}: unshaped (CPU ceiling) {unshaped:,.0f} ev/s, links' rate "
                  f"{links_eps:,.0f} ev/s; shaped off {off:,.0f} ({off / ceiling:.3f}), on "
                  f"{on:,.0f} ({on / ceiling:.3f}) ev/s")
    correct = all(x.get("correct") for x in runs if x["mode"] != "warm-up")
    if not rounds:
        print(f"on_ratio=n/a off_ratio=n/a correct={correct}")
        return 1
    on_r = statistics.median(x[0] for x in rounds)
    off_r = statistics.median(x[1] for x in rounds)
    print(f"on_ratio={on_r:.3f} off_ratio={off_r:.3f} on_over_off={on_r / off_r:.3f} "
          f"on_ratio_best={max(x[0] for x in rounds):.3f} links_eps={links_eps:.0f} "
          f"mbit={mbit:.1f} rounds={len(rounds)} bundles_per_slot={args.bundles_per_slot} "
          f"correct={correct}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
