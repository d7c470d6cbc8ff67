"""coffea's reads through the XCache shards, in both coffea paths, on the loopback testbed.

coffea's NanoAOD samples are served by a real origin ``xrootd`` and two XCache shards on
racks A and B; the workers are split over the two racks and the cluster's ``RunConfig``
carries the shard map. The fileset names the origin's URLs, as a user's would name a
redirector: datavine reads each file on its shard (``DatavineSource``), fails over when
that shard is stopped, and reports near and far bytes. ``Runner`` work items run in either
virtual environment; the dask path (``NanoEventsFactory.from_root(..., mode="dask")``) needs
dask-awkward, so it runs in ``.venv-legacy`` and skips elsewhere.
"""

from __future__ import annotations

import shutil
import tempfile
import warnings
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

pytest.importorskip("coffea")

from datavine.coffea import DatavineSource
from datavine.io.samples import coffea_sample
from datavine.io.shards import logical_name
from tests.test_coffea_executor import SAMPLES, MetMuons, assert_same, iterative, on, runner

pytestmark = [
    pytest.mark.coffea, pytest.mark.taskvine, pytest.mark.xcache,
    pytest.mark.filterwarnings("ignore:Missing cross-reference"),
    pytest.mark.filterwarnings("ignore:Branch .* already exists"),
    pytest.mark.filterwarnings("ignore:Performed attempt"),
]


@pytest.fixture(scope="module")
def samples_testbed(xcache_tools: None) -> Iterator[Any]:
    """Origin + 2 shards (racks A, B) serving coffea's samples under /store/coffea/."""
    from datavine.io.xcache.testbed import XCacheTestbed

    served = Path(tempfile.mkdtemp(prefix="datavine-coffea-shards-"))
    try:
        store = served / "store" / "coffea"
        store.mkdir(parents=True)
        for name in SAMPLES:
            shutil.copy(coffea_sample(name), store / f"{name}.root")
        for p in [served, *served.rglob("*")]:
            p.chmod(0o755 if p.is_dir() else 0o644)
        with XCacheTestbed(served, n_shards=2, racks=["A", "B"]) as testbed:
            yield testbed
    finally:
        shutil.rmtree(served, ignore_errors=True)


@pytest.fixture(scope="module")
def shard_cluster(samples_testbed: Any, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Any]:
    """Two workers, one per rack, reading through the testbed's shards."""
    import datavine
    import datavine.io.source.xrootd  # fast XRootD failover settings, inherited by the workers

    manager = datavine.ManagerConfig(run_dir=tmp_path_factory.mktemp("shard-cluster"))
    # no slow shard read around: the tests check which shard served each file (a shard
    # judged slow on a loaded host would send its files to the next in line)
    run = datavine.RunConfig(shardmap=samples_testbed.shard_map(), no_worker_timeout_s=30,
                             read_around_slow_shards=False)
    with datavine.LocalCluster(workers=2, cores=1, racks=("A", "B"), manager=manager,
                               run=run) as cluster:
        yield cluster


def remote_fileset(testbed: Any) -> dict[str, list[str]]:
    return {name: [f"{testbed.origin_url}//store/coffea/{name}.root"] for name in SAMPLES}


def local_fileset() -> dict[str, list[str]]:
    return {name: [str(coffea_sample(name))] for name in SAMPLES}


def test_runner_reads_through_the_shards(samples_testbed: Any, shard_cluster: Any) -> None:
    ref = runner(iterative())(local_fileset(), treename="Events", processor_instance=MetMuons())
    executor = on(shard_cluster)
    out = runner(executor)(remote_fileset(samples_testbed), treename="Events",
                           processor_instance=MetMuons())
    assert_same(out, ref)
    shards = {s.name for s in samples_testbed.shard_map().shards}
    for call in executor.report.calls:
        reads = call.summary.reads
        assert reads.opens >= call.items
        assert set(reads.by_server) <= shards  # every byte from a shard, none from the origin
        assert reads.near_bytes + reads.far_bytes > 0
    assert "MB near" in "\n".join(executor.report.lines())


def test_runner_fails_over_when_a_shard_is_stopped(samples_testbed: Any,
                                                   shard_cluster: Any) -> None:
    shardmap = samples_testbed.shard_map()
    files = remote_fileset(samples_testbed)
    dy = logical_name(files["nano_dy"][0])
    home = shardmap.shard_for(dy)
    other = next(s for s in shardmap.shards if s.name != home.name)
    index = [s.name for s in shardmap.shards].index(home.name)
    ref = runner(iterative())(local_fileset(), treename="Events", processor_instance=MetMuons())
    samples_testbed.stop_shard(index)
    try:
        executor = on(shard_cluster, retries=0)
        out = runner(executor)(files, treename="Events", processor_instance=MetMuons())
    finally:
        samples_testbed.start_shard(index)
    assert_same(out, ref)
    reads = executor.report.last.summary.reads
    assert home.name not in reads.by_server and reads.by_server[other.name] > 0
    assert reads.failovers >= 1  # the first open on the stopped shard failed over
    assert any(home.name in e for e in reads.failover_errors)
    assert not executor.report.last.failed and not executor.report.last.skipped


def test_dask_path_reads_through_the_shards(samples_testbed: Any, shard_cluster: Any) -> None:
    """coffea's dask path: ``from_map`` tasks name their files; with ``DatavineSource`` as
    uproot's handler they read on the file's shard, fail over, and are accounted."""
    pytest.importorskip("dask_awkward", reason="dask-awkward needs dask < 2025.4: .venv-legacy")
    hda = pytest.importorskip("hist.dask")
    from coffea.nanoevents import NanoAODSchema, NanoEventsFactory

    def met(path: str, **options: Any) -> Any:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", RuntimeWarning)
            events = NanoEventsFactory.from_root(
                {path: "Events"}, schemaclass=NanoAODSchema, steps_per_file=4, mode="dask",
                **options).events()
        return hda.Hist.new.Reg(50, 0.0, 200.0, name="met").Double().fill(events.MET.pt)

    url = remote_fileset(samples_testbed)["nano_dy"][0]
    reference = met(str(coffea_sample("nano_dy"))).compute(scheduler="sync")
    shardmap = samples_testbed.shard_map()
    home = shardmap.shard_for(logical_name(url))
    index = [s.name for s in shardmap.shards].index(home.name)
    for stopped in (False, True):
        if stopped:
            samples_testbed.stop_shard(index)
        try:
            hist = met(url, uproot_options={"handler": DatavineSource}).compute(
                scheduler=shard_cluster.get)
        finally:
            samples_testbed.start_shard(index)
        assert hist == reference and hist.sum() == 40
        reads = shard_cluster.last_summary.reads
        served = set(reads.by_server)
        assert reads.opens >= 4 and served <= {s.name for s in shardmap.shards}
        assert (home.name not in served) if stopped else (served == {home.name})
