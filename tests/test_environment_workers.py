"""A LocalCluster whose workers run datavine's library inside the shipped environment.

The workers get ``PATH=/usr/bin:/bin``: no ``python`` of this project (nor any ``python``)
is on their PATH, so the library can only start from the unpacked tree in a worker's cache.
The tarball is the slim one of ``test_environment`` (same spec, same cache directory).
"""

from __future__ import annotations

import operator
import subprocess
import sys
from collections.abc import Iterator
from dataclasses import replace
from pathlib import Path
from typing import Any

import dask
import dask.array as da
import pytest
from dask import delayed

import datavine
from datavine.manager.environment import EnvSpec, PackedEnv, pack_environment

pytestmark = pytest.mark.taskvine

REPO = Path(__file__).resolve().parents[1]
CACHE = REPO / "build" / "test-envs"  # git-ignored; shared with test_environment
SLIM = EnvSpec(include=("datavine",), compression="zstd")  # datavine, numpy, dask, ...
BARE_PATH = "/usr/bin:/bin"


def where(i: int) -> dict[str, Any]:
    """Runs on a worker: i squared, and which Python (and numpy) computed it."""
    import os
    import sys

    import numpy

    return {"value": int(numpy.square(i)), "executable": sys.executable, "prefix": sys.prefix,
            "numpy": numpy.__file__, "worker": os.environ.get("DATAVINE_WORKER_ID"),
            "path": os.environ.get("PATH", "")}


@pytest.fixture(scope="module")
def packed() -> PackedEnv:
    return pack_environment(SLIM, CACHE)


@pytest.fixture(scope="module")
def env_cluster(packed: PackedEnv, tmp_path_factory: pytest.TempPathFactory
                ) -> Iterator[datavine.LocalCluster]:
    run_dir = Path(tmp_path_factory.mktemp("env-cluster")).resolve()
    cluster = datavine.LocalCluster(
        workers=2, cores=1, manager=datavine.ManagerConfig(run_dir=run_dir),
        run=datavine.RunConfig(no_worker_timeout_s=60, timeout_s=180, max_bundle_tasks=1),
        environment=packed)
    cluster.workers_config = replace(cluster.workers_config, extra_env={"PATH": BARE_PATH})
    with cluster:
        yield cluster


def test_the_bare_path_has_no_python_able_to_run_the_library() -> None:
    """What the workers would find on their PATH cannot host datavine's library."""
    found = subprocess.run(["sh", "-c", "command -v python || true"], capture_output=True,
                           text=True, env={"PATH": BARE_PATH}).stdout.strip()
    assert found == "", f"a python on {BARE_PATH}: {found}"
    system = subprocess.run(["sh", "-c", "python3 -c 'import cloudpickle, dask, datavine'"],
                            capture_output=True, env={"PATH": BARE_PATH})
    assert system.returncode != 0  # the system python3 lacks the project's packages


def test_a_dask_graph_runs_inside_the_shipped_environment(
        env_cluster: datavine.LocalCluster) -> None:
    x = da.arange(10_000, chunks=1_000)
    probes = [delayed(where)(i) for i in range(8)]
    total = delayed(sum)([delayed(operator.getitem)(p, "value") for p in probes])
    got_sum, got_total, got_probes = dask.compute((x * x).sum(), total, probes,
                                                  scheduler=env_cluster.get)
    assert got_sum == sum(i * i for i in range(10_000))
    assert got_total == sum(i * i for i in range(8))
    assert [p["value"] for p in got_probes] == [i * i for i in range(8)]

    workers_dir = Path(env_cluster.manager_config.run_dir) / "workers"
    venv = Path(sys.prefix).resolve()
    for probe in got_probes:
        index = probe["worker"].removeprefix("local-")
        workspace = str(workers_dir / f"worker-{index}")
        prefix = probe["prefix"]
        assert prefix.startswith(workspace) and "/cache/" in prefix, probe  # its own cache
        assert probe["executable"].startswith(prefix) and probe["numpy"].startswith(prefix)
        assert not prefix.startswith((str(venv), str(Path(sys.base_prefix).resolve())))
        assert probe["path"].split(":")[0] == f"{prefix}/bin"
        assert str(venv) not in probe["path"]
    assert env_cluster.last_summary.tasks == len(env_cluster.last_summary.completions)


def test_each_worker_unpacks_its_own_tree(env_cluster: datavine.LocalCluster,
                                          packed: PackedEnv) -> None:
    """Both workers hold the tarball and their own unpacked tree (the untar mini-task's
    output is never shared between peers). Manager egress is measured by
    ``benchmarks/environment.py``: which worker fetches from which is a race there, and a
    2-worker test would flake on it."""
    dask.compute([delayed(where)(i) for i in range(4)], scheduler=env_cluster.get)
    workers_dir = Path(env_cluster.manager_config.run_dir) / "workers"
    trees = sorted(workers_dir.glob("worker-*/cache/*/bin/run_in_env"))
    assert len({t.relative_to(workers_dir).parts[0] for t in trees}) == 2, trees
    tarballs = [p for p in workers_dir.glob("worker-*/cache/file-md5-*")
                if p.stat().st_size == packed.size]
    assert len(tarballs) == 2, tarballs


def test_repacking_an_unchanged_environment_reuses_the_tarball(packed: PackedEnv) -> None:
    again = pack_environment(SLIM, CACHE)
    assert again.reused
    assert (again.path, again.key, again.sha256, again.size) == (
        packed.path, packed.key, packed.sha256, packed.size)
    assert PackedEnv.from_tarball(again.path).sha256 == packed.sha256
