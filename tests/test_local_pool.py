"""``LocalFactoryPool``: the same vine_factory pool, with ``-T local`` workers on this host.

Real vine_factory and vine_worker processes against a real TaskVine manager; no HTCondor.
"""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

import pytest

from datavine.deploy.pools import FactoryConfig, FactoryPool, LocalFactoryPool

pytest_plugins = ["tests.fixtures_condor"]  # password_file, manager_process
pytestmark = pytest.mark.taskvine


def test_pre_started_local_pool_connects_reports_and_stops(
        manager_process: int, password_file: Path, tmp_path: Path) -> None:
    cfg = FactoryConfig("127.0.0.1", manager_process, workers=2, min_workers=2,
                        password_file=password_file, idle_timeout_s=120, factory_period_s=1)
    pool = LocalFactoryPool(cfg, name="t-local", pool_dir=tmp_path).start()
    try:
        status = pool.wait_for_workers(2, timeout_s=60)
        assert status.running and status.workers_connected == 2
        assert status.jobs == {"running": 2}
        # Another process finds the pool through its state file.
        attached = FactoryPool.attach("t-local", tmp_path)
        assert isinstance(attached, LocalFactoryPool) and attached.pid == pool.pid
        assert attached.status().jobs == {"running": 2}
        # the workers' workspaces are in the pool's folder, not in the host's /tmp
        assert len(list(pool.workspaces.glob("worker-*"))) == 2
    finally:
        pool.stop(timeout_s=20)
    assert not pool.running
    assert not (tmp_path / "t-local.json").exists()
    assert not pool.workspaces.exists(), "a killed worker's workspace is removed with it"
    deadline = time.monotonic() + 10
    while LocalFactoryPool(cfg, name="t-local", pool_dir=tmp_path).status().workers_connected:
        assert time.monotonic() < deadline, "workers must disconnect once the pool stops"
        time.sleep(0.5)


def test_on_demand_local_pool_runs_tasks_then_scales_down(password_file: Path,
                                                          tmp_path: Path) -> None:
    import ndcctools.taskvine as vine

    m = vine.Manager(port=0, run_info_path=str(tmp_path / "vine-run-info"))
    m.set_password_file(str(password_file))
    cfg = FactoryConfig("127.0.0.1", m.port, workers=2, password_file=password_file,
                        idle_timeout_s=3, factory_period_s=1, features=("site-x",))
    with LocalFactoryPool(cfg, name="t-local-2", pool_dir=tmp_path) as pool:
        ids = {}
        for i in range(4):
            task = vine.Task(f"echo {i + 10}")
            task.add_feature("site-x")
            ids[m.submit(task)] = str(i + 10)
        got: dict[int, Any] = {}
        deadline = time.monotonic() + 60
        while len(got) < len(ids):
            assert time.monotonic() < deadline, f"{m.stats.workers_connected} workers"
            task = m.wait(1)
            if task is not None:
                assert task.successful(), task.result
                got[task.id] = task.output.strip()
        assert got == ids
        while m.stats.workers_connected:  # idle timeout: the pool scales down to nothing
            assert time.monotonic() < deadline + 30
            m.wait(1)
        assert pool.running, "the factory stays, ready for more work"
