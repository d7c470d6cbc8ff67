"""Many real vine_workers on one manager: every worker gets work, none is lost, every task
runs once. CI runs 16 workers; ``DATAVINE_SCALE_WORKERS=256`` runs the issue's largest count
(``benchmarks/workers.py`` measures the same set-up's costs)."""

from __future__ import annotations

import os
import time

import pytest

pytestmark = [pytest.mark.taskvine, pytest.mark.scale]

WORKERS = int(os.environ.get("DATAVINE_SCALE_WORKERS", "16"))


def nap(path: str, seconds: float) -> int:
    """A task that names a file (so it is a bundle of its own, placed) and sleeps."""
    time.sleep(seconds)
    return os.getpid()


def test_every_worker_gets_work_and_none_is_lost() -> None:
    import dask
    from dask import delayed

    import datavine
    from datavine.config import RunConfig

    tasks = 2 * WORKERS
    graph = delayed(list)([delayed(nap, pure=True)(f"/scale/file-{i}.root", 1.0,
                                                   dask_key_name=f"nap-{i}")
                           for i in range(tasks)])
    with datavine.LocalCluster(workers=WORKERS, cores=1, connect_timeout_s=600,
                               run=RunConfig(memory=None, no_worker_timeout_s=300)) as cluster:
        assert len({w for w, _ in cluster.warm_libraries}) == WORKERS
        (pids,) = dask.compute(graph, scheduler=cluster.get)
        summary = cluster.last_summary
        assert len(pids) == tasks
        assert summary.bundles == tasks + 1 and summary.retries == 0
        assert not summary.lost_workers
        assert cluster.runtime.connected_workers() == WORKERS
        ran_on = {w for _, k, w in summary.completions if str(k).startswith("nap-")}
        assert len(ran_on) == WORKERS  # every worker ran some of the work
        assert len(set(pids)) == WORKERS  # one library process per worker
