"""Shared fixtures: a real LocalCluster (manager + vine_worker processes on 127.0.0.1)."""

from __future__ import annotations

import contextlib
import importlib.util
import os
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import cloudpickle
import pytest

import tests

pytest_plugins = ["tests.fixtures_xcache", "tests.fixtures_box"]
# Test modules are not installed on the workers: their functions travel by value.
cloudpickle.register_pickle_by_value(tests)

HAVE_TASKVINE = importlib.util.find_spec("ndcctools") is not None
# The suite's clusters start no live view (a Bokeh process each) unless a test asks for one
# (LocalCluster(dashboard=True): tests/test_dashboard_browser.py).
os.environ.setdefault("DATAVINE_DASHBOARD", "0")
# XCache testbeds on a tmpfs: their shards fsync each file's statistics when they detach it,
# which a disk busy with the suite's other writes delays by tens of seconds
if os.path.isdir("/dev/shm") and os.access("/dev/shm", os.W_OK):
    os.environ.setdefault("DATAVINE_XCACHE_WORKDIR", "/dev/shm")


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    if HAVE_TASKVINE:
        return
    skip = pytest.mark.skip(reason="ndcctools.taskvine missing: run scripts/build_taskvine.sh")
    for item in items:
        if "taskvine" in item.keywords:
            item.add_marker(skip)


@pytest.fixture(scope="session")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[object]:
    """Two 1-core local workers, shared by the tests that only need a working cluster."""
    import datavine

    run_dir = Path(tmp_path_factory.mktemp("cluster"))
    manager = datavine.ManagerConfig(run_dir=run_dir)
    with datavine.LocalCluster(workers=2, cores=1, manager=manager,
                               run=datavine.RunConfig(no_worker_timeout_s=30)) as c:
        yield c


@contextlib.contextmanager
def started_library(tmp_path: Path, workers: int) -> Iterator[Any]:
    """A cluster of ``workers`` one-core workers, their library started, memory caps on: its
    runtime (tests that drive calls by hand)."""
    import datavine

    with datavine.LocalCluster(workers=workers, cores=1,
                               manager=datavine.ManagerConfig(run_dir=tmp_path / "run"),
                               run=datavine.RunConfig()) as c:
        rt = c.runtime
        assert rt is not None
        rt.ensure_library()
        yield rt


@pytest.fixture
def one_core(tmp_path: Path) -> Iterator[object]:
    """One one-core worker's runtime (:func:`started_library`; test_library_queue,
    test_cancel_after_end)."""
    with started_library(tmp_path, 1) as rt:
        yield rt
