"""Named pool workers: vine_factory's workers carry a unique name (``worker:<name>``) the
manager can target, are warmed up and announced before the run, and placement sends a
file's bundle back to the pool worker that read it, as with local workers.

The pure parts (command line, names, the wrapper script under ``sh``) run everywhere; the
pool tests start a real ``vine_factory -T local`` with real ``vine_worker``s against a real
datavine manager. The same on HTCondor is in ``tests/test_condor_pool.py``.
"""

from __future__ import annotations

import argparse
import os
import subprocess
from pathlib import Path

import pytest

from datavine.config import ManagerConfig, RunConfig
from datavine.deploy.pools import FactoryConfig, factory_command
from datavine.deploy.pools.identity import WRAPPER_NAME, condor_name, local_name, write_wrapper
from datavine.errors import NoWorkersError

pytest_plugins = ["tests.fixtures_condor"]


def test_named_pools_ship_the_naming_wrapper_and_anonymous_ones_do_not(tmp_path: Path) -> None:
    wrapper = write_wrapper(tmp_path / "identity")
    cmd = factory_command(FactoryConfig("m.example", 9123), wrapper=wrapper)
    i = cmd.index("--wrapper")
    assert cmd[i:i + 4] == ["--wrapper", f"./{WRAPPER_NAME}", "--wrapper-input", str(wrapper)]
    assert cmd[-2:] == ["m.example", "9123"]
    anonymous = factory_command(FactoryConfig("m.example", 9123, named=False), wrapper=wrapper)
    assert "--wrapper" not in anonymous


def _wrapped(tmp_path: Path, env: dict[str, str]) -> list[str]:
    """Run the real wrapper around a command that prints its arguments and name."""
    wrapper = write_wrapper(tmp_path / "identity")
    out = subprocess.run(
        ["sh", str(wrapper), "sh", "-c", 'echo "$$ $DATAVINE_WORKER_ID $*"', "worker",
         "--cores", "1"], env={"PATH": os.environ["PATH"], **env}, capture_output=True,
        text=True, check=True, timeout=10).stdout.split()
    return out


def test_the_wrapper_names_htcondor_jobs_by_their_job_id(tmp_path: Path) -> None:
    ad = tmp_path / "job.ad"
    ad.write_text('MyType = "Job"\nClusterId = 417\nProcId = 2\n')
    _, name, *args = _wrapped(tmp_path, {"_CONDOR_JOB_AD": str(ad),
                                         "DATAVINE_POOL_NAME": "cms"})
    assert name == condor_name("cms", 417, 2) == "cms-417.2"
    assert args == ["--cores", "1", "--feature", f"worker:{name}"]


def test_the_wrapper_names_other_workers_by_host_and_pid(tmp_path: Path) -> None:
    pid, name, *args = _wrapped(tmp_path, {"DATAVINE_POOL_NAME": "p1"})
    assert name == local_name("p1", int(pid))  # the pid of the exec'd worker
    assert args[-2:] == ["--feature", f"worker:{name}"]


def test_pool_start_takes_its_rack_from_the_facility_file(tmp_path: Path) -> None:
    from datavine.config import ConfigError
    from datavine.deploy.pools.cli import _facility_rack

    facility = tmp_path / "site.toml"
    facility.write_text('[[pools]]\nname = "east"\nbatch = "local"\nrack = "A"\n'
                        '[[pools]]\nname = "west"\nbatch = "local"\n')
    ns = argparse.Namespace(facility=facility, name="east")
    assert _facility_rack(ns) == "A"
    assert _facility_rack(argparse.Namespace(facility=facility, name="west")) is None
    assert _facility_rack(argparse.Namespace(facility=None, name="east")) is None
    with pytest.raises(ConfigError, match="no \\[\\[pools\\]\\] entry named 'north'"):
        _facility_rack(argparse.Namespace(facility=facility, name="north"))


@pytest.mark.taskvine
def test_local_pool_workers_are_named_warmed_and_get_their_files_back(tmp_path: Path) -> None:
    import dask
    from dask import delayed

    from datavine.deploy.facility import Facility, FacilityCluster, PoolSettings

    files = []
    for i in range(8):
        path = tmp_path / f"data-{i}.root"
        path.write_bytes(b"x" * (1000 + i))
        files.append(str(path))
    pool = PoolSettings(name="t-named", batch="local", workers=2, rack="rack-x",
                        idle_timeout_s=120, factory_period_s=1)
    facility = Facility(path=tmp_path / "f.toml", manager=ManagerConfig(run_dir=tmp_path / "m"),
                        run=RunConfig(memory=None, no_worker_timeout_s=60), pools=(pool,),
                        workers_timeout_s=90)
    graph = delayed(sum)([delayed(os.path.getsize)(f) for f in files])
    with FacilityCluster(facility, pool_dir=tmp_path / "pools") as cluster:
        names = cluster.pools[0].worker_names()
        assert len(names) == 2 and all(n.startswith("t-named-") for n in names)
        assert cluster.warm_report is not None and cluster.warm_report.warm == set(names)
        known = cluster.runtime.topology.workers
        assert {n: (known[n].named, known[n].rack) for n in names} == {
            n: (True, "rack-x") for n in names}
        runs = []
        for _ in range(2):
            (total,) = dask.compute(graph, scheduler=cluster.get)
            assert total == sum(1000 + i for i in range(8))
            summary = cluster.last_summary
            runs.append({k: w for _, k, w in summary.completions if "getsize" in str(k)})
        assert set(runs[0].values()) <= set(names)
        # the second run sends each file's task to the pool worker that read it
        assert summary.placement == {"cached": 8}
        assert runs[1] == runs[0]


@pytest.mark.taskvine
def test_a_worker_that_joins_the_pool_is_warmed_before_the_next_run(tmp_path: Path) -> None:
    import json

    import dask
    from dask import delayed

    from datavine.deploy.facility import Facility, FacilityCluster, PoolSettings

    pool = PoolSettings(name="t-join", batch="local", workers=2, min_workers=1, rack="r",
                        idle_timeout_s=120, factory_period_s=1)
    facility = Facility(path=tmp_path / "f.toml", manager=ManagerConfig(run_dir=tmp_path / "m"),
                        run=RunConfig(memory=None, no_worker_timeout_s=60), pools=(pool,),
                        workers_timeout_s=90)
    with FacilityCluster(facility, pool_dir=tmp_path / "pools") as cluster:
        assert cluster.warm_report is not None and len(cluster.warm_report.warm) == 1
        # the factory re-reads its config each period: a pool scaled up by editing it
        config = cluster.pools[0].scratch_dir / "factory.json"
        doc = json.loads(config.read_text())
        config.write_text(json.dumps({**doc, "min-workers": 2}))
        try:
            cluster.runtime.wait_for_workers(2, 90)
        except NoWorkersError as exc:  # once in a full run (2026-11-28): say what the factory did
            debug = cluster.pools[0].scratch_dir / "factory.debug"
            lines = debug.read_text(errors="replace").splitlines() if debug.exists() else []
            raise AssertionError(f"{exc}; the end of {debug}:\n" + "\n".join(lines[-60:])) from exc
        assert dask.compute(delayed(sum)([1, 2]), scheduler=cluster.get)[0] == 3
        names = set(cluster.pools[0].worker_names())
        assert len(names) == 2 and cluster.warm_report.warm == names
        assert all(cluster.runtime.topology.workers[n].named for n in names)
