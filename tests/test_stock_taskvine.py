"""datavine on TaskVine as released (scripts/build_taskvine.sh --stock): the stock lane of
scripts/test.sh runs these with build/cctools-stock first on PYTHONPATH. Runs still work
(dask, a facility's [racks], a local pool), and each degradation ``datavine doctor`` names
is what happens: the run summary's notes name them, workers are known without their names,
a pool's workers start without the options they lack, its status query refuses the sha1
exchange, and a certificate check a pool cannot make is refused. (tests/test_capabilities.py
checks the GIL, the listen address and the password exchange against their probes, on either
build.)"""

from __future__ import annotations

import subprocess
import sys
import time
from pathlib import Path

import dask
import pytest
from dask import delayed

from datavine.config import ConfigError, ManagerConfig
from datavine.deploy.facility import load_facility
from datavine.deploy.pools import FactoryConfig, LocalFactoryPool
from datavine.manager.capabilities import CAPABILITIES
from datavine.manager.cluster import LocalCluster, make_password_file
from datavine.manager.listen import local_host
from datavine.manager.runtime import Runtime
from tests.stock_taskvine import on_stock

pytestmark = [
    pytest.mark.taskvine,
    pytest.mark.stock,
    pytest.mark.skipif(not on_stock(), reason="runs on TaskVine as released: the stock lane "
                       "of scripts/test.sh (build/cctools-stock first on PYTHONPATH)"),
]


def square(x: int) -> int:
    return x * x


def test_a_dask_run_works_and_its_summary_names_every_missing_capability(
        tmp_path: Path) -> None:
    with LocalCluster(workers=2, manager=ManagerConfig(run_dir=tmp_path)) as cluster:
        (total,) = dask.compute(delayed(sum)([delayed(square)(i) for i in range(20)]),
                                scheduler=cluster.get)
        rt = cluster.runtime
        assert rt is not None
        record = rt.taskvine.capabilities
        summary = cluster.last_summary
    assert total == sum(i * i for i in range(20))
    assert [c.key for c in record.missing()] == [c.key for c in CAPABILITIES]
    assert record.broken == {}
    assert summary is not None
    assert [n for n in summary.notes if n.startswith("TaskVine lacks")] == record.lines()


def test_placement_from_a_facility_racks_without_worker_features(tmp_path: Path) -> None:
    """Workers report no features here: their rack comes from the facility's [racks]
    (their host), and they are known by address, not by name."""
    site = tmp_path / "site.toml"
    site.write_text(f'[racks]\nC = ["{local_host()}"]\nD = ["d*.example.org"]\n')
    facility = load_facility(site)
    with LocalCluster(workers=2, racks=(), run=facility.run, warm_up=False,
                      manager=ManagerConfig(run_dir=tmp_path / "run")) as cluster:
        rt = cluster.runtime
        assert rt is not None
        for wid in list(rt.topology.workers):  # what LocalCluster announced: forget it
            rt.topology.forget(wid)
        rt.watch.look_again()
        rt.drop_lost_workers()
        seen = sorted((w.rack, w.host, w.named) for w in rt.topology.workers.values())
        assert seen == [("C", local_host(), False)] * 2
        assert rt.taskvine.capabilities.found["worker-features"] is False
        (total,) = dask.compute(delayed(sum)([1, 2, 3]), scheduler=cluster.get)
    assert total == 6


@pytest.fixture
def manager(tmp_path: Path):  # type: ignore[no-untyped-def]
    rt = Runtime(ManagerConfig(run_dir=tmp_path / "manager",
                               password_file=make_password_file(tmp_path)))
    try:
        yield rt
    finally:
        rt.close()


def test_a_local_pool_starts_its_workers_without_the_options_they_lack(
        manager: Runtime, tmp_path: Path) -> None:
    cfg = FactoryConfig("127.0.0.1", manager.port, batch="local", workers=1, min_workers=1,
                        password_file=manager.manager_config.password_file,
                        transfer_address="127.0.0.1", idle_timeout_s=60, factory_period_s=1)
    with LocalFactoryPool(cfg, name="stock", pool_dir=tmp_path / "pools") as pool:
        deadline = time.monotonic() + 60
        while manager.connected_workers() < 1:
            assert pool.running, pool._log_tail()
            assert time.monotonic() < deadline, "the pool's worker did not connect"
            manager.taskvine.wait_task(1)  # accepts the connecting worker
        assert pool.pid is not None
        command = Path(f"/proc/{pool.pid}/cmdline").read_bytes().split(b"\0")
        # datavine's own status query refuses the reflectable exchange (patch 0012); from
        # another process, while this one serves the manager (whose wait holds the GIL)
        query = subprocess.Popen(
            [sys.executable, "-c", "from datavine.deploy.pools import FactoryPool; print("
             f"FactoryPool.attach('stock', {str(tmp_path / 'pools')!r}).status().detail)"],
            stdout=subprocess.PIPE, text=True)
        while query.poll() is None and time.monotonic() < deadline + 30:
            manager.taskvine.wait_task(1)
        detail, _ = query.communicate(timeout=10)
    assert not any(b"--transfer-address" in part for part in command)
    assert "auth password sha1" in detail and "patch 0012" in detail


def test_a_pool_that_must_check_the_manager_certificate_does_not_start(
        manager: Runtime, tmp_path: Path) -> None:
    cfg = FactoryConfig("127.0.0.1", manager.port, batch="local",
                        password_file=manager.manager_config.password_file,
                        ssl_fingerprint="ab" * 32)
    pool = LocalFactoryPool(cfg, name="stock-tls", pool_dir=tmp_path / "pools")
    with pytest.raises(ConfigError, match=r"takes no --ssl-fingerprint \(TaskVine patch 0014"):
        pool.start()
    assert not pool.running


@pytest.mark.box
@pytest.mark.xcache
def test_the_box_places_bundles_by_the_facility_racks(make_box, box_data,  # type: ignore[no-untyped-def]
                                                      xcache_tools) -> None:
    """On the facility in a box: workers started by hand on the rack hosts report no
    features, yet the facility's [racks] (their host names) puts each in its rack, and every
    chunk is read from its own rack's shard; the summary's notes name what is missing."""
    import json

    from datavine.deploy.box.facility import start_workers
    from tests.fixtures_box import BOX_EVENTS, BOX_FILES

    box = make_box(racks=2, hosts_per_rack=1, data=box_data)
    start_workers(box)
    record = box.dir / "run.json"
    argv = [str(Path(sys.executable).parent / "datavine"), "run", "--facility",
            str(box.dir / "facility.toml"), "--pool-workers", "2", "--data", str(box_data),
            "--files", str(BOX_FILES), "--events", str(BOX_EVENTS), "--no-progress",
            "--json", str(record), "--timeout", "150"]
    done = box.run("mgr", argv, timeout_s=210, check=False)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    summary = json.loads(record.read_text())["summary"]
    assert set(summary["hosts"]) == {"a1.box", "b1.box"}, summary["hosts"]
    reads = summary["reads"]
    assert reads["near_fraction"] == 1.0 and reads["far_bytes"] == 0, reads
    assert sum(n.startswith("TaskVine lacks") for n in summary["notes"]) == len(CAPABILITIES)
