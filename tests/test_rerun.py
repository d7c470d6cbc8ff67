"""A rerun on real workers (issue 30): the second run of an analysis reads its columns from
the workers' memory, its results equal a cold run's; ``cluster.drop_caches()`` makes the next
run cold; coffea's ``Runner`` through ``DatavineExecutor`` keeps its buffers the same way."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import dask
import pytest

from datavine.apps.analysis import agc
from datavine.io.datagen import generate_dataset

pytestmark = pytest.mark.taskvine


def merge(*parts: agc.ChunkResult) -> agc.ChunkResult:
    return sum(parts, agc.ChunkResult.empty())


def run(cluster: Any, chunks: list[agc.Chunk], selection: agc.Selection) -> agc.ChunkResult:
    parts = [dask.delayed(agc.process_item, pure=False)(c, selection) for c in chunks]
    return dask.compute(dask.delayed(merge, pure=False)(*parts), scheduler=cluster.get)[0]


def same(a: agc.ChunkResult, b: agc.ChunkResult) -> bool:
    return bool((a.counts == b.counts).all() and a.events == b.events
                and a.events_selected == b.events_selected)


@pytest.fixture(scope="module")
def chunks(tmp_path_factory: pytest.TempPathFactory) -> list[agc.Chunk]:
    files = generate_dataset(tmp_path_factory.mktemp("rerun"), 2, 20_000, seed=8,
                             basket_events=5_000)
    return agc.make_chunks(files, 5_000)


def test_the_second_run_reads_from_the_workers_memory(cluster: Any,
                                                      chunks: list[agc.Chunk]) -> None:
    other = agc.Selection(jet_pt=30.0)
    cluster.drop_caches()
    first = run(cluster, chunks, agc.AGC)
    cold = cluster.last_summary.cache
    assert cold.hit_bytes == 0 and cold.miss_bytes > 0
    second = run(cluster, chunks, other)
    warm = cluster.last_summary
    assert warm.cache.hit_bytes > 0 and warm.cache.miss_bytes < cold.miss_bytes
    assert warm.placement["cached"] > 0  # placement sent chunks where their columns are
    assert same(first, agc.run_plain_loop(chunks))
    reference = sum((agc.process_chunk(c.path, c.entry_start, c.entry_stop, selection=other)
                     for c in chunks), agc.ChunkResult.empty())
    assert same(second, reference)

    cluster.drop_caches()  # a cold measurement: nothing is served from memory
    again = run(cluster, chunks, other)
    assert cluster.last_summary.cache.hit_bytes == 0
    assert cluster.last_summary.placement["cached"] == 0
    assert same(again, reference)


@pytest.mark.coffea
# coffea's NanoAOD samples lack some cross-reference branches; coffea warns per chunk.
@pytest.mark.filterwarnings("ignore:Missing cross-reference")
@pytest.mark.filterwarnings("ignore:Branch .* already exists")
@pytest.mark.filterwarnings("ignore:Performed attempt")
def test_coffea_runner_twice_keeps_its_buffers_on_the_workers(cluster: Any) -> None:
    pytest.importorskip("coffea")
    from coffea import processor
    from coffea.nanoevents import NanoAODSchema

    from datavine.coffea import DatavineExecutor
    from datavine.io.samples import coffea_sample
    from tests.test_coffea_executor import SAMPLES, MetMuons, assert_same

    files = {name: [str(coffea_sample(name))] for name in SAMPLES}

    def once() -> dict[str, Any]:
        executor = DatavineExecutor(cluster=cluster, status=False, retry_delay_s=0.0)
        runner = processor.Runner(executor=executor, schema=NanoAODSchema, chunksize=100)
        return runner(files, treename="Events", processor_instance=MetMuons())

    reference = processor.Runner(executor=processor.IterativeExecutor(status=False),
                                 schema=NanoAODSchema, chunksize=100)(
        files, treename="Events", processor_instance=MetMuons())
    cluster.drop_caches()
    first = once()
    cold = cluster.last_summary.cache
    second = once()
    warm = cluster.last_summary.cache
    assert cold.hit_bytes == 0 and cold.miss_bytes > 0
    assert warm.hit_bytes > 0
    assert_same(first, reference)
    assert_same(second, reference)


def test_a_cache_smaller_than_a_chunk_keeps_nothing_and_reads_right(
        tmp_path: Path, chunks: list[agc.Chunk]) -> None:
    import datavine

    manager = datavine.ManagerConfig(run_dir=tmp_path)
    with datavine.LocalCluster(workers=1, cores=1, manager=manager,
                               run=datavine.RunConfig(no_worker_timeout_s=30,
                                                      column_cache_mb=0.01)) as small:
        first = run(small, chunks, agc.AGC)
        second = run(small, chunks, agc.AGC)
        assert small.last_summary.cache.hit_bytes == 0
        assert small.last_summary.cache.miss_bytes > 0
    assert same(first, second) and same(first, agc.run_plain_loop(chunks))
