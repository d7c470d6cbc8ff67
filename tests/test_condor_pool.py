"""Workers as real HTCondor jobs: vine_factory submits them to the personal pool, they
connect to a real TaskVine manager, run work, leave when idle, and ``stop`` leaves no job.

Needs root and the installed personal pool (``bash workers/condor/install_pool.sh``); the
session fixture starts it if needed. The manager lives in the test process and is driven
with ``Manager.wait``, as datavine's runtime drives it.
"""

from __future__ import annotations

import json
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from datavine.deploy.pools import CondorPool, FactoryConfig, rack_feature
from datavine.deploy.pools.condor import POOL_ATTR

pytest_plugins = ["tests.fixtures_condor"]
pytestmark = [pytest.mark.condor, pytest.mark.taskvine]


@pytest.fixture
def manager(password_file: Path, tmp_path: Path) -> Iterator[Any]:
    import ndcctools.taskvine as vine

    m = vine.Manager(port=0, run_info_path=str(tmp_path / "vine-run-info"))
    m.set_password_file(str(password_file))
    yield m
    del m


@pytest.fixture
def pool_dir(tmp_path: Path) -> Path:
    """The default pools folder: the only one bound into the chroot (state files are per
    pool name, so the tests use names of their own)."""
    from datavine.deploy.pools.state import default_pool_dir

    return default_pool_dir()


def pump(m: Any, until: Callable[[], bool], timeout_s: float,
         on_task: Callable[[Any], None] | None = None) -> float:
    """Drive the manager until ``until()``; returns the seconds it took."""
    start = time.monotonic()
    while not until():
        if time.monotonic() - start > timeout_s:
            raise AssertionError(f"condition not reached within {timeout_s} s "
                                 f"({m.stats.workers_connected} workers connected)")
        task = m.wait(1)
        if task is not None and on_task is not None:
            on_task(task)
    return time.monotonic() - start


def condor_q(pool: CondorPool, *attrs: str) -> list[list[str]]:
    result = pool.condor("condor_q", "-allusers", "-constraint", pool.constraint, "-af", *attrs)
    assert result.returncode == 0, result.stderr
    return [line.split() for line in result.stdout.splitlines() if line.strip()]


def test_workers_are_condor_jobs_run_work_and_leave_when_idle(
        manager: Any, password_file: Path, pool_dir: Path, condor_diagnostics: None) -> None:
    import ndcctools.taskvine as vine

    cfg = FactoryConfig("127.0.0.1", manager.port, workers=2, cores=1, memory_mb=500,
                        disk_mb=1000, rack="A", password_file=password_file,
                        idle_timeout_s=8, factory_period_s=1)
    pool = CondorPool(cfg, name="t-work", pool_dir=pool_dir)
    t0 = time.monotonic()
    with pool:
        started_s = time.monotonic() - t0
        # min_workers=0: the factory submits workers only once work is waiting.
        assert condor_q(pool, "ClusterId") == []
        want = {}
        for i in range(6):
            task = vine.Task(f"echo $(( {i} * {i} ))")
            task.set_cores(1)
            task.add_feature(rack_feature("A"))  # only workers labelled rack:A may run it
            want[manager.submit(task)] = str(i * i)
        def square(x: int) -> int:  # local: cloudpickle sends it by value
            return x * x

        py = vine.PythonTask(square, 12)
        py.set_cores(1)
        want[manager.submit(py)] = 144

        got: dict[int, Any] = {}
        seen_jobs: list[list[str]] = []

        def collect(task: Any) -> None:
            assert task.successful(), f"task {task.id}: {task.result} {task.output!r}"
            got[task.id] = task.output if isinstance(task, vine.PythonTask) else \
                task.output.strip()
            if not seen_jobs:
                seen_jobs.extend(condor_q(pool, "ClusterId", "JobStatus", POOL_ATTR))

        connect_s = pump(manager, lambda: manager.stats.workers_joined >= 1, 60,
                         on_task=collect)
        pump(manager, lambda: len(got) == len(want), 90, on_task=collect)
        assert got == want
        # The workers were HTCondor jobs of this pool, running (JobStatus 2).
        assert 1 <= len(seen_jobs) <= 2
        assert all(status == "2" and name == "t-work" for _, status, name in seen_jobs)
        assert manager.stats.workers_joined <= 2

        # Idle workers leave through their own timeout; with no work the factory submits
        # no new ones: the pool scales down to no job at all.
        idle_s = pump(manager, lambda: manager.stats.workers_connected == 0, 8 + 30)
        deadline = time.monotonic() + 30
        while condor_q(pool, "ClusterId") and time.monotonic() < deadline:
            time.sleep(0.5)
        assert condor_q(pool, "ClusterId") == [], "idle workers' jobs must finish"
        history = pool.condor("condor_history", "-constraint", pool.constraint,
                              "-af", "JobStatus", "ExitCode")
        # Every job of the pool completed (JobStatus 4) with exit code 0.
        assert set(history.stdout.splitlines()) == {"4 0"}, history.stdout
    assert condor_q(pool, "ClusterId") == []
    assert not pool.running
    print(f"\ncondor pool: start() {started_s:.2f} s, first worker connected "
          f"{connect_s:.2f} s after the work was submitted, idle scale-down {idle_s:.1f} s")


def test_pre_started_pool_stop_leaves_no_jobs(
        manager: Any, password_file: Path, pool_dir: Path, condor_diagnostics: None) -> None:
    cfg = FactoryConfig("127.0.0.1", manager.port, workers=2, min_workers=2,
                        password_file=password_file, idle_timeout_s=300, factory_period_s=1)
    pool = CondorPool(cfg, name="t-stop", pool_dir=pool_dir).start()
    try:
        connect_s = pump(manager, lambda: manager.stats.workers_connected >= 2, 60)
        assert sorted(s for _, s in condor_q(pool, "ClusterId", "JobStatus")) == ["2", "2"]
        state_file = pool_dir / "t-stop.json"
        assert json.loads(state_file.read_text())["pid"] == pool.pid
    finally:
        t0 = time.monotonic()
        pool.stop()
        stop_s = time.monotonic() - t0
    assert condor_q(pool, "ClusterId") == []
    assert not pool.running
    assert not (pool_dir / "t-stop.json").exists()
    pump(manager, lambda: manager.stats.workers_connected == 0, 30)
    print(f"\npre-started pool: 2 workers connected {connect_s:.2f} s after start, "
          f"stop {stop_s:.2f} s")


def test_cli_start_wait_status_stop(manager_process: int, password_file: Path,
                                    pool_dir: Path, condor_diagnostics: None) -> None:
    cli = [sys.executable, "-m", "datavine.deploy.pools.cli", "pool"]
    common = ["--name", "t-cli", "--pool-dir", str(pool_dir)]

    def run(*args: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run([*cli, *args, *common], text=True, capture_output=True,
                              timeout=120, check=False)

    t0 = time.monotonic()
    started = run("start", "--batch", "condor", "--workers", "2", "--manager",
                  f"127.0.0.1:{manager_process}", "--password", str(password_file),
                  "--rack", "B", "--wait", "--timeout", "60")
    wait_s = time.monotonic() - t0
    try:
        assert started.returncode == 0, started.stdout + started.stderr
        status = run("status", "--json")
        assert status.returncode == 0, status.stderr
        doc = json.loads(status.stdout)
        assert doc["running"] and doc["workers_connected"] == 2
        assert doc["jobs"] == {"running": 2}
    finally:
        stopped = run("stop")
    assert stopped.returncode == 0, stopped.stdout + stopped.stderr
    final = run("status")
    assert "no pools" in final.stdout or "t-cli" not in final.stdout
    pool = CondorPool(FactoryConfig("127.0.0.1", manager_process), name="t-cli",
                      pool_dir=pool_dir)
    assert condor_q(pool, "ClusterId") == []
    print(f"\nCLI: pool start --wait for 2 condor workers took {wait_s:.2f} s")


def test_wait_times_out_naming_the_manager(password_file: Path, pool_dir: Path, free_port: int,
                                           condor_diagnostics: None) -> None:
    port = free_port  # no manager there: no worker can connect
    cfg = FactoryConfig("127.0.0.1", port, workers=1, min_workers=1,
                        password_file=password_file, factory_period_s=1)
    from datavine.deploy.pools import PoolTimeoutError

    with CondorPool(cfg, name="t-timeout", pool_dir=pool_dir) as pool, \
            pytest.raises(PoolTimeoutError, match=rf"0 of 1 worker.*127\.0\.0\.1:{port}"):
        pool.wait_for_workers(1, timeout_s=3, poll_s=0.5)
    assert condor_q(pool, "ClusterId") == []


def test_dask_graph_on_condor_workers_through_datavine(
        password_file: Path, pool_dir: Path, tmp_path: Path, free_port: int,
        condor_diagnostics: None) -> None:
    datavine = pytest.importorskip("datavine")
    if not hasattr(datavine, "Cluster"):
        pytest.skip("datavine.Cluster not there yet")
    import dask
    from dask import delayed

    # A pre-started pool points at the manager's port before the manager is up.
    port = free_port
    cfg = FactoryConfig("127.0.0.1", port, workers=2, min_workers=2,
                        password_file=password_file, idle_timeout_s=120, factory_period_s=1)
    manager_cfg = datavine.ManagerConfig(port=port, password_file=password_file,
                                         run_dir=tmp_path / "manager")
    with CondorPool(cfg, name="t-dask", pool_dir=pool_dir), \
            datavine.Cluster(manager_cfg, datavine.RunConfig(no_worker_timeout_s=60),
                             min_workers=2, connect_timeout_s=90) as cluster:
        def square(x: int) -> int:
            return x * x

        parts = [delayed(square)(i) for i in range(40)]
        total = delayed(sum)(parts)
        assert dask.compute(total, scheduler=cluster.get)[0] == sum(i * i for i in range(40))


def test_named_condor_workers_are_warmed_and_get_their_files_back(
        pool_dir: Path, tmp_path: Path, condor_diagnostics: None) -> None:
    """Each HTCondor worker is named after its job (<pool>-<ClusterId>.<ProcId>), warmed and
    announced before the run; a second run sends each file's task to the worker that read
    it (placement 'cached'), as with local workers."""
    import os
    import shutil

    import dask
    from dask import delayed

    from datavine.config import ManagerConfig, RunConfig
    from datavine.deploy.facility import Facility, FacilityCluster, PoolSettings
    from datavine.deploy.pools.identity import condor_name

    data = pool_dir / "t-named-condor-data"  # under the pools folder: bound into the chroot
    data.mkdir(parents=True, exist_ok=True)
    data.chmod(0o755)
    files = []
    for i in range(6):
        path = data / f"data-{i}.root"
        path.write_bytes(b"x" * (100 + i))
        path.chmod(0o644)
        files.append(str(path))
    pool = PoolSettings(name="t-named-condor", batch="condor", workers=2, rack="rack-c",
                        idle_timeout_s=120, factory_period_s=1)
    facility = Facility(path=tmp_path / "f.toml", manager=ManagerConfig(run_dir=tmp_path / "m"),
                        run=RunConfig(memory=None, no_worker_timeout_s=90), pools=(pool,),
                        workers_timeout_s=120)
    graph = delayed(sum)([delayed(os.path.getsize)(f) for f in files])
    try:
        with FacilityCluster(facility, pool_dir=pool_dir) as cluster:
            condor = cluster.pools[0]
            assert isinstance(condor, CondorPool)
            jobs = condor_q(condor, "ClusterId", "ProcId", "JobStatus")
            names = condor.worker_names()
            assert sorted(names) == sorted(condor_name("t-named-condor", c, p)
                                           for c, p, status in jobs if status == "2")
            assert len(names) == 2
            assert cluster.warm_report is not None and cluster.warm_report.warm == set(names)
            known = cluster.runtime.topology.workers
            assert all(known[n].named and known[n].rack == "rack-c" for n in names)
            runs = []
            for _ in range(2):
                (total,) = dask.compute(graph, scheduler=cluster.get)
                assert total == sum(100 + i for i in range(6))
                summary = cluster.last_summary
                runs.append({k: w for _, k, w in summary.completions if "getsize" in str(k)})
            assert set(runs[0].values()) <= set(names)
            assert summary.placement == {"cached": 6}
            assert runs[1] == runs[0]
    finally:
        shutil.rmtree(data, ignore_errors=True)
