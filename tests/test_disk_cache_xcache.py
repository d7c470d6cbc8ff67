"""A rerun served from the workers' disks (issue 30, item 3): real workers, real XCache shards.

An XCache testbed of this module's own (an origin and 4 shards on racks A, A, B, B serving
the session's 12 small files, ``tests/fixtures_xcache.py``: the session's testbed expects
them cold in its shards) and a :class:`datavine.LocalCluster` of 2 workers, one
per rack, with the column cache off and the input-bytes cache on
(``RunConfig(input_cache_mb=...)``). Each task reads one whole file with
:func:`datavine.open_input`, on its shard. The first run fetches every byte from the shards
and keeps them on the workers' disks; the second, the same graph, reads each file's header
from its shard (403 bytes: which version of the file it is) and everything else from the
disk of the worker that read it before (placement sends the task back there), and says so
in its summary.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import dask
import pytest

import datavine
from tests.fixtures_xcache import RACKS, xcache_lfns

pytestmark = [pytest.mark.taskvine, pytest.mark.xcache]

HEADER = 403  # uproot's first read of a file: always from the server
RUN_TIMEOUT_S = 120.0


def read_file(url: str) -> tuple[int, float]:
    """One whole file through its shard (module-level: the tests package travels by value)."""
    with datavine.open_input(url) as f:
        arrays = f["Events"].arrays(["Jet_pt", "nJet"], library="np")
    return len(arrays["nJet"]), float(arrays["Jet_pt"].sum())


@pytest.fixture(scope="module")
def xcache_testbed(xcache_tools: None, xcache_data: Path) -> Iterator[Any]:
    """This module's shards: its reads warm them, and other modules expect the session's
    testbed cold."""
    from datavine.io.xcache.testbed import XCacheTestbed

    with XCacheTestbed(xcache_data, n_shards=len(RACKS), racks=RACKS) as tb:
        yield tb


@pytest.fixture(scope="module")
def disk_cluster(xcache_testbed: Any, tmp_path_factory: pytest.TempPathFactory,
                 ) -> Iterator[datavine.LocalCluster]:
    """2 workers (racks A and B), the column cache off, 64 MB of disk cache each; placement
    waits for the worker that read a file (no backup copies: a copy would read elsewhere)."""
    run = datavine.RunConfig(shardmap=xcache_testbed.shard_map(), column_cache=False,
                             input_cache_mb=64, speculation=False, timeout_s=RUN_TIMEOUT_S,
                             no_worker_timeout_s=30, read_around_slow_shards=False,
                             placement=datavine.PlacementPolicy(max_wait_s=30.0,
                                                                cache_wait_s=30.0))
    manager = datavine.ManagerConfig(run_dir=tmp_path_factory.mktemp("disk-cache"))
    with datavine.LocalCluster(workers=2, cores=1, racks=("A", "B"), manager=manager,
                               run=run) as cluster:
        yield cluster


def test_a_rerun_reads_nothing_but_headers_from_the_shards(
        xcache_testbed: Any, disk_cluster: datavine.LocalCluster) -> None:
    urls = [xcache_testbed.origin_url + "/" + lfn for lfn in xcache_lfns()]
    tasks = [dask.delayed(read_file, pure=False)(url) for url in urls]

    first = dask.compute(tasks, scheduler=disk_cluster.get)[0]
    cold = disk_cluster.last_summary
    assert cold is not None
    fetched = cold.reads.near_bytes + cold.reads.far_bytes
    assert cold.reads.opens == len(urls) and cold.reads.disk_bytes == 0
    assert fetched > 10 * HEADER * len(urls)

    second = dask.compute(tasks, scheduler=disk_cluster.get)[0]
    warm = disk_cluster.last_summary
    assert warm is not None
    assert second == first
    assert warm.reads.opens == len(urls)
    # from the shards: each file's header, nothing else; the rest from the workers' disks
    assert warm.reads.near_bytes + warm.reads.far_bytes == HEADER * len(urls), warm.lines()
    assert warm.reads.disk_bytes == fetched - HEADER * len(urls)
    served = warm.served()
    assert served["disk"] == warm.reads.disk_bytes and served["memory"] == 0
    line = next(x for x in warm.lines() if x.startswith("  bytes:"))
    assert f"{warm.reads.disk_bytes / 2**20:,.1f} MB from their disk" in line, line


def test_an_uproot_handler_reads_through_the_disk_too(
        xcache_testbed: Any, tmp_path: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    """coffea's and dask-awkward's way in (``handler=DatavineSource``: the read layer's
    ``open_source``), in this process with a bundle's read context: the second open of a
    file is served from the disk but for its header."""
    import uproot

    from datavine.coffea import DatavineSource
    from datavine.io import disk_cache
    from datavine.io.reading import reading

    monkeypatch.setenv("WORKER_TMPDIR", str(tmp_path / "worker" / "temp"))
    monkeypatch.setattr(disk_cache, "_cache", None)
    url = xcache_testbed.origin_url + "/" + xcache_lfns()[0]
    seen = []
    for _ in range(2):
        with reading(xcache_testbed.shard_map(), input_cache_mb=16) as ctx:
            with uproot.open(url, handler=DatavineSource) as f:
                seen.append(f["Events"].arrays(["Jet_pt"], library="np")["Jet_pt"])
            (record,) = [r for r in ctx.records() if r.server != "memory"]
        assert record.bytes + record.disk > 10 * HEADER
        assert record.read_s > 0  # the server's time is clocked (the header at least)
        if len(seen) == 2:
            assert record.bytes == HEADER and record.disk > 0
    assert (seen[0] == seen[1]).all()
