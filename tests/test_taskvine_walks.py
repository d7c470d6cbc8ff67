"""TaskVine's wait cycle with fewer walks over every worker (patch 0016): what the walks did is
still done. A task past its end time and a call of a library nobody installed still come back
(expire_waiting_tasks runs on a clock now); calls with nothing cached anywhere still reach a
worker with room, all of them (the first worker that fits). These pass on a TaskVine without
the patch too: they hold the behaviour, not the speed. (A worker that stops answering is still
found by its keep-alive, now looked for on a clock: tests/test_faults.py freezes one.)"""

from __future__ import annotations

import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest

import datavine
from datavine.config import ManagerConfig, RunConfig
from datavine.manager.runtime import Runtime

pytestmark = pytest.mark.taskvine


@contextmanager
def cluster(tmp_path: Path, workers: int) -> Iterator[Runtime]:
    with datavine.LocalCluster(workers=workers, cores=1, run=RunConfig(memory=None),
                               manager=ManagerConfig(run_dir=tmp_path / "run")) as c:
        yield c.runtime


def wait_for(rt: Runtime, ids: set[int], timeout_s: float = 30) -> dict[int, str]:
    """TaskVine's result string of each task of ``ids`` as it comes back."""
    got: dict[int, str] = {}
    deadline = time.monotonic() + timeout_s
    while set(got) != ids and time.monotonic() < deadline:
        done = rt.taskvine.wait_task(1)
        if done is not None and done.id in ids:
            got[done.id] = done.result
    return got


def test_expired_and_libraryless_tasks_still_come_back(tmp_path: Path) -> None:
    with cluster(tmp_path, 1) as rt:
        vine = rt.taskvine.vine
        late = vine.Task("true")
        late.set_time_end(int((time.time() - 60) * 1e6))  # its end time has passed
        late.set_cores(1)
        orphan = vine.Task("true")
        orphan.set_cores(1)
        orphan.set_library_required("no-such-library")
        ids = {int(rt.manager.submit(late)), int(rt.manager.submit(orphan))}
        got = wait_for(rt, ids)
    assert sorted(got.values()) == ["max end time", "missing library"], got


def test_calls_with_nothing_cached_all_reach_a_worker(tmp_path: Path) -> None:
    graph: dict[object, object] = {("abs", i): (abs, -i) for i in range(40)}
    with cluster(tmp_path, 4) as rt:
        assert tuple(rt.get(graph, [("abs", i) for i in range(40)])) == tuple(range(40))
        summary = rt.last_summary
        assert summary is not None and not summary.failures, summary
