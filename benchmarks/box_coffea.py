"""coffea's ``processor.Runner`` with ``DatavineExecutor`` on a facility's workers and shards.

Run on the manager host of a facility (the box: ``datavine box exec mgr -- ...``, as
benchmarks/box.py does): a :class:`datavine.Cluster` from the facility file's manager,
waiting for ``--workers`` workers of pools started elsewhere, the fileset's files read
through the facility's XCache shards (their ``root://`` URLs at the origin). Prints one
JSON line: events, seconds, events/s, near and far bytes, placement tiers; the result is
checked against coffea's ``IterativeExecutor`` reading the same files from local disk.

    datavine box exec mgr -- .venv/bin/python benchmarks/box_coffea.py \
        --facility build/box/box/facility.toml --data DIR --files 8 --workers 4
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import sys
import time
import warnings
from pathlib import Path

# python puts this script's folder first on sys.path, where benchmarks/coffea.py would
# shadow the coffea package: take it out, and load that file's processor by its path.
HERE = Path(__file__).resolve().parent
sys.path[:] = [p for p in sys.path if Path(p or ".").resolve() != HERE]

from coffea import processor  # noqa: E402
from coffea.nanoevents import NanoAODSchema  # noqa: E402

_spec = importlib.util.spec_from_file_location("bench_coffea", HERE / "coffea.py")
assert _spec is not None and _spec.loader is not None
bench_coffea = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(bench_coffea)
Selection, same = bench_coffea.Selection, bench_coffea.same

import datavine  # noqa: E402
from datavine.apps.analysis.sources import origin_url  # noqa: E402
from datavine.coffea import DatavineExecutor  # noqa: E402
from datavine.deploy.facility import load_facility  # noqa: E402


def run(executor: object, fileset: dict[str, list[str]], chunksize: int) -> object:
    runner = processor.Runner(executor=executor, schema=NanoAODSchema, chunksize=chunksize,
                              metadata_cache={})
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return runner(fileset, treename="Events", processor_instance=Selection())


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--facility", type=Path, required=True)
    parser.add_argument("--data", type=Path, required=True)
    parser.add_argument("--files", type=int, default=8)
    parser.add_argument("--workers", type=int, required=True)
    parser.add_argument("--chunksize", type=int, default=100_000)
    args = parser.parse_args()
    facility = load_facility(args.facility)
    shards = facility.shards
    assert shards is not None and shards.origin is not None and facility.export_root
    local = sorted(args.data.glob("*.root"))[:args.files]
    half = len(local) // 2 or 1
    names = {"ttbar": local[:half], "wjets": local[half:]}
    fileset = {d: [origin_url(p, facility.export_root, shards.origin.url) for p in ps]
               for d, ps in names.items()}
    reference = run(processor.IterativeExecutor(), {d: [str(p) for p in ps]
                                                    for d, ps in names.items()},
                    args.chunksize)
    run_config = facility.run.replace(shardmap=shards, progress=False)
    with datavine.Cluster(facility.manager, run_config, min_workers=args.workers,
                          connect_timeout_s=60) as cluster:
        executor = DatavineExecutor(cluster=cluster)
        t0 = time.monotonic()
        out = run(executor, fileset, args.chunksize)
        seconds = time.monotonic() - t0
        summary = cluster.last_summary
    events = sum(out[d]["events"] for d in out)
    reads = summary.reads if summary is not None else None
    print(json.dumps({
        "events": events, "seconds": round(seconds, 3), "events_per_s": events / seconds,
        "correct": bool(same(out, reference)),
        "near_bytes": reads.near_bytes if reads else None,
        "far_bytes": reads.far_bytes if reads else None,
        "near_fraction": reads.near_fraction if reads else None,
        "placement": dict(summary.placement) if summary is not None else {},
    }))
    return 0


if __name__ == "__main__":
    sys.exit(main())
