"""Backup copies on real workers: a straggler is outrun by its copy, the result counts once,
and the straggler's call is stopped where it ran (TaskVine patch 0015 and the capped child).

The straggler is a task whose first run sleeps far longer than the run is allowed
(``RunConfig.timeout_s``): only a copy can finish the run in time."""

from __future__ import annotations

import os
import sys
import time
from pathlib import Path

import cloudpickle

import datavine
from datavine.config import ManagerConfig, RunConfig

STRAGGLE_S = 120.0


def chunk(i: int, marks: str) -> int:
    """Task ``i``; task 0's first run is a straggler (it leaves a mark to say it started)."""
    first = Path(marks) / "straggler-started"
    if i == 0 and not first.exists():
        first.write_text(str(os.getpid()))
        time.sleep(STRAGGLE_S)
        Path(marks, "straggler-finished").write_text("")
    time.sleep(0.05)
    return i * i


def total(*parts: int) -> int:
    return sum(parts)


def test_a_straggler_is_outrun_by_its_copy_and_counted_once(tmp_path: Path) -> None:
    cloudpickle.register_pickle_by_value(sys.modules[__name__])
    marks = tmp_path / "marks"
    marks.mkdir()
    graph: dict[object, object] = {("chunk", i): (chunk, i, str(marks)) for i in range(12)}
    graph["total"] = (total, *[("chunk", i) for i in range(12)])
    run = RunConfig(timeout_s=60.0)  # the straggler alone would take 120 s
    with datavine.LocalCluster(workers=2, cores=1, run=run,
                               manager=ManagerConfig(run_dir=tmp_path / "run")) as cluster:
        assert cluster.get(graph, "total") == sum(i * i for i in range(12))
        summary = cluster.last_summary
        assert summary is not None
        assert summary.backups.won >= 1, summary.lines()
        assert summary.tasks == 13  # each task once, though task 0 ran twice
        # its first copy was stopped on its worker, not left to run out its 120 s
        assert not (marks / "straggler-finished").exists()
        assert cluster.get({"again": (total, 1, 2)}, "again") == 3  # the slots came back
