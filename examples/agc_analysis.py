"""The AGC-style ttbar analysis on datavine, as a user would write it.

Generates a few NanoAOD-like files (once), runs the selection of
``datavine.apps.analysis.agc`` on every chunk of 100k events as a ``dask.delayed`` task on
local TaskVine workers, merges the chunk results and prints the trijet-mass histogram::

    .venv/bin/python examples/agc_analysis.py [DATA_DIR]

``datavine run`` is the same job with more options (XCache, facility files, a JSON record).
"""

from __future__ import annotations

import os
import sys

import dask

import datavine
from datavine.apps.analysis import agc
from datavine.io.datagen import generate_dataset


def main(data_dir: str = "runs/data") -> None:
    files = generate_dataset(data_dir, n_files=4, events_per_file=100_000)
    chunks = agc.make_chunks(files, chunk_events=100_000)

    # One task per chunk; the results merge with +.
    results = [dask.delayed(agc.process_item)(chunk) for chunk in chunks]
    total = dask.delayed(sum)(results)

    with datavine.LocalCluster(workers=len(os.sched_getaffinity(0)), cores=1) as cluster:
        (result,) = dask.compute(total, scheduler=cluster.get)
        summary = cluster.last_summary

    print(f"{result.events:,} events, {result.events_selected:,} selected")
    print("trijet mass [GeV]   events")
    for lo, hi, n in zip(result.edges[:-1], result.edges[1:], result.counts, strict=True):
        print(f"{lo:5.0f} - {hi:5.0f}  {n:7d}  {'#' * int(60 * n / max(result.counts.max(), 1))}")
    print(f"{summary.tasks} tasks on {summary.workers} workers in {summary.wall_s:.2f} s")


if __name__ == "__main__":
    main(*sys.argv[1:2])
