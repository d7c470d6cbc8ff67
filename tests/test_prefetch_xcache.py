"""Reads overlapped with compute on real workers and a real XCache shard (issue 29, item 4).

A one-core worker holds two calls (patch 0015): while one chunk of the AGC analysis
computes, the next waits in the library, which learns of it as it arrives (patch 0018) and
has its capped child read its baskets ahead from the shard (``RunConfig.prefetch_mb``). The
results are the plain loop's, the summary counts the bytes read ahead, and when the worker
leaves, its library and the child that read ahead leave with it. Nothing here is timed.
"""

from __future__ import annotations

import os
import shutil
import tempfile
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import dask
import pytest

import datavine
from datavine.apps.analysis import agc
from datavine.apps.analysis.sources import XCacheShards, analysis_graph, to_origin

pytestmark = [pytest.mark.taskvine, pytest.mark.xcache]

N_FILES = 2
N_EVENTS = 60_000
CHUNK_EVENTS = 20_000
RUN_TIMEOUT_S = 120.0


@dataclass(frozen=True)
class Dataset:
    root: Path
    chunks: list[agc.Chunk]  # local paths
    reference: agc.ChunkResult


@pytest.fixture(scope="module")
def dataset(xcache_tools: None) -> Iterator[Dataset]:
    from datavine.io.datagen import generate_dataset

    root = Path(tempfile.mkdtemp(prefix="datavine-prefetch-"))
    try:
        paths = generate_dataset(root / "store", N_FILES, N_EVENTS, compression="zstd")
        for p in [root, *root.rglob("*")]:
            p.chmod(0o755 if p.is_dir() else 0o644)
        chunks = agc.make_chunks(paths, CHUNK_EVENTS)
        yield Dataset(root, chunks, agc.run_plain_loop(chunks))
    finally:
        shutil.rmtree(root, ignore_errors=True)


@pytest.fixture(scope="module")
def testbed(dataset: Dataset) -> Iterator[Any]:
    from datavine.io.xcache.testbed import XCacheTestbed

    with XCacheTestbed(dataset.root, n_shards=1, racks=("A",)) as tb:
        yield tb


def children_of(pid: int) -> set[int]:
    """The processes whose parent is ``pid``."""
    found = set()
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                with open(f"/proc/{entry}/stat") as f:
                    if int(f.read().rsplit(")", 1)[1].split()[1]) == pid:
                        found.add(int(entry))
            except (OSError, ValueError, IndexError):
                continue
    return found


def descendants_of_workers_in(folder: Path) -> set[int]:
    """The ``vine_worker`` processes whose command line names ``folder`` (this test's run
    folder), and all their descendants (the library, its capped child)."""
    todo = set()
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                with open(f"/proc/{entry}/cmdline", "rb") as f:
                    cmdline = f.read().decode(errors="replace")
            except OSError:
                continue
            if "vine_worker" in cmdline and str(folder) in cmdline:
                todo.add(int(entry))
    found: set[int] = set()
    while todo:
        pid = todo.pop()
        if pid not in found:
            found.add(pid)
            todo |= children_of(pid)
    return found


def alive(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] != "Z"
    except OSError:
        return False


def test_a_queued_chunk_is_read_ahead_and_the_results_are_the_loops(
        dataset: Dataset, testbed: Any, tmp_path: Path) -> None:
    chunks = to_origin(dataset.chunks, dataset.root, testbed.origin_url)
    shardmap = testbed.shard_map()
    # no column cache: every chunk reads its baskets through the shard; no backup copies
    run = datavine.RunConfig(shardmap=shardmap, prefetch_mb=64, column_cache=False,
                             speculation=False, timeout_s=RUN_TIMEOUT_S,
                             no_worker_timeout_s=30)
    manager = datavine.ManagerConfig(run_dir=tmp_path / "run")
    with datavine.LocalCluster(workers=1, cores=1, manager=manager, run=run) as cluster:
        graph = analysis_graph(XCacheShards(shardmap), chunks)
        (result,) = dask.compute(graph, scheduler=cluster.get)
        summary = cluster.last_summary
        assert summary is not None
        processes = descendants_of_workers_in(tmp_path)
    print(*summary.lines(), sep="\n")  # pytest -s: the prefetch line
    assert result.result == dataset.reference
    reads = summary.reads
    assert reads.opens == len(chunks)
    assert reads.prefetched_bytes > 0 and reads.prefetched_opens >= 1, summary.lines()
    assert reads.prefetched_bytes <= reads.near_bytes + reads.far_bytes
    # the baskets, not only the files' metadata: all but the first chunks' bytes, mostly
    assert reads.prefetched_bytes > 0.3 * (reads.near_bytes + reads.far_bytes), summary.lines()
    assert any("read ahead" in line for line in summary.lines())
    # the worker left with the cluster: its library and the child that read ahead are gone
    assert len(processes) >= 3, "a worker, its library and the library's capped child"
    deadline = time.monotonic() + 20
    while any(alive(p) for p in processes) and time.monotonic() < deadline:
        time.sleep(0.2)
    assert not [p for p in processes if alive(p)]
