"""Dask graphs on real vine_worker processes give the same results as dask's sync scheduler."""

from __future__ import annotations

import operator
import os
import threading
import time
from pathlib import Path

import dask
import dask.array as da
import dask.bag as db
import numpy as np
import pytest
from dask import delayed

import datavine

pytestmark = pytest.mark.taskvine


def test_delayed_fan_out_fan_in(cluster) -> None:
    base = delayed(np.arange)(1000)
    parts = [delayed(operator.getitem)(base, slice(i * 100, (i + 1) * 100)) for i in range(10)]
    squares = [delayed(np.square)(p) for p in parts]
    sums = [delayed(np.sum)(s) for s in squares]
    total = delayed(sum)(sums)
    both = delayed(lambda t, s: (t, s[3]))(total, sums)
    got = dask.compute(both, total, scheduler=cluster.get)
    want = dask.compute(both, total, scheduler="sync")
    assert got[1] == want[1] == int(np.square(np.arange(1000)).sum())
    assert got[0] == want[0]


def test_array_reductions(cluster) -> None:
    x = da.random.default_rng(42).normal(size=(400, 300), chunks=(50, 60))
    exprs = [x.sum(), x.mean(axis=0), x.std(), (x @ x.T).trace(), x[::7, 3].max()]
    got = dask.compute(*exprs, scheduler=cluster.get)
    want = dask.compute(*exprs, scheduler="sync")
    for g, w in zip(got, want, strict=True):
        np.testing.assert_allclose(g, w)


def test_bag_pipeline(cluster) -> None:
    b = db.from_sequence(range(2000), npartitions=16)
    pipeline = (b.map(lambda v: (v % 7, v * v)).filter(lambda kv: kv[1] % 3 == 0)
                .foldby(operator.itemgetter(0), lambda acc, kv: acc + kv[1], 0, operator.add, 0))
    assert sorted(pipeline.compute(scheduler=cluster.get)) == sorted(
        pipeline.compute(scheduler="sync"))


def test_large_trivial_graph_runs_in_bundles(cluster) -> None:
    level = [delayed(operator.add)(i, 1) for i in range(3000)]
    while len(level) > 1:
        level = [delayed(operator.add)(level[i], level[i + 1]) if i + 1 < len(level)
                 else level[i] for i in range(0, len(level), 2)]
    assert level[0].compute(scheduler=cluster.get) == sum(range(1, 3001))
    summary = cluster.last_summary
    assert summary.tasks >= 5999
    assert summary.bundles < summary.tasks / 20, "trivial tasks must travel in bundles"


def raise_value_error(key: str) -> None:
    raise ValueError(f"bad value in {key}")


def test_failing_task_raises_its_exception_naming_the_key(cluster) -> None:
    ok = delayed(operator.add)(1, 2)
    bad = delayed(raise_value_error)("x", dask_key_name="broken-task")
    with pytest.raises(ValueError, match="bad value in x") as info:
        dask.compute(ok, delayed(operator.add)(bad, ok), scheduler=cluster.get)
    note = "\n".join(info.value.__notes__)
    assert "broken-task" in note
    assert "raise_value_error" in note and "Traceback" in note


def make_generator(n: int):
    return (i for i in range(n))


def test_unserialisable_result_is_named(cluster) -> None:
    with pytest.raises(TypeError, match=r"gen-key.*cannot be serialised"):
        delayed(make_generator)(3, dask_key_name="gen-key").compute(scheduler=cluster.get)
    # the cluster still works afterwards
    assert delayed(operator.mul)(6, 7).compute(scheduler=cluster.get) == 42


def slow_square(v: int) -> int:
    time.sleep(0.4)
    return v * v


def test_task_a_worker_cannot_load_is_named_not_retried(cluster, tmp_path: Path,
                                                        monkeypatch: pytest.MonkeyPatch) -> None:
    (tmp_path / "client_only_mod.py").write_text("def triple(v):\n    return 3 * v\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    import client_only_mod  # importable here, not on the workers

    start = time.monotonic()
    with pytest.raises(datavine.TaskLoadError, match=r"triple.*No module named 'client_only_mod'"):
        delayed(client_only_mod.triple)(2).compute(scheduler=cluster.get)
    assert time.monotonic() - start < 20
    # the library survived: the cluster still works
    assert delayed(operator.mul)(6, 7).compute(scheduler=cluster.get) == 42


def test_lost_worker_tasks_are_rerun(tmp_path: Path) -> None:
    cfg = datavine.ManagerConfig(run_dir=tmp_path)
    with datavine.LocalCluster(workers=2, cores=1, manager=cfg) as c:
        work = delayed(sum)([delayed(slow_square)(i) for i in range(12)])

        def kill_and_replace() -> None:
            time.sleep(1.0)
            c.workers.kill(0)
            c.workers.start(1)

        killer = threading.Thread(target=kill_and_replace)
        killer.start()
        assert work.compute(scheduler=c.get) == sum(i * i for i in range(12))
        killer.join()
        assert c.runtime.manager.stats.workers_lost + c.runtime.manager.stats.workers_removed >= 1


def test_no_workers_is_an_error_not_a_hang(tmp_path: Path) -> None:
    cfg = datavine.ManagerConfig(run_dir=tmp_path)
    run = datavine.RunConfig(no_worker_timeout_s=2)
    with datavine.Cluster(cfg, run) as c:
        start = time.monotonic()
        with pytest.raises(datavine.NoWorkersError, match=f"port {c.port}"):
            delayed(operator.add)(1, 1).compute(scheduler=c.get)
        assert time.monotonic() - start < 10


def test_run_timeout_is_reported(tmp_path: Path) -> None:
    cfg = datavine.ManagerConfig(run_dir=tmp_path)
    with datavine.LocalCluster(workers=1, cores=1, manager=cfg, timeout_s=2) as c:
        start = time.monotonic()
        with pytest.raises(datavine.RunTimeoutError, match=r"RunConfig\.timeout_s"):
            delayed(time.sleep)(30).compute(scheduler=c.get)
        assert time.monotonic() - start < 10


def library_process() -> tuple[int, int, str]:
    """(pid, process group, the parent's name) of the process that runs the task."""
    with open(f"/proc/{os.getppid()}/comm") as f:
        return os.getpid(), os.getpgid(0), f.read().strip()


@pytest.mark.parametrize("warm_up", [True, False])
def test_the_cluster_starts_the_library_on_every_worker_before_the_first_run(
        tmp_path: Path, warm_up: bool) -> None:
    """Pools are pre-started so that runs do not wait: LocalCluster also starts the library
    (one per worker core) before returning, and the first run's bundles use those."""
    cfg = datavine.ManagerConfig(run_dir=tmp_path)
    run = datavine.RunConfig(memory=None)  # bundles run in the library process itself
    with datavine.LocalCluster(workers=2, cores=1, manager=cfg, run=run, warm_up=warm_up) as c:
        warm = c.warm_libraries
        calls = [delayed(library_process, pure=False)() for _ in range(8)]
        (ran,) = dask.compute(calls, scheduler=c.get)
    pids = {pid for pid, _, _ in ran}
    # every call ran in a library under a vine_worker, one library per worker core at most
    assert {parent for _, _, parent in ran} == {"vine_worker"} and os.getpid() not in pids
    assert 1 <= len(pids) <= 2, ran
    if warm_up:
        assert {worker for worker, _ in warm} == {"local-0", "local-1"}
        assert pids <= {pid for _, pid in warm}
    else:  # none started with the cluster: the run started them
        assert warm == set()


def test_the_library_is_the_process_the_worker_kills(tmp_path: Path) -> None:
    """vine_worker stops a library with kill(-pid, SIGKILL): the library must be that pid
    (the worker's `sh -c` exec-ed it) and lead its own group, else the kill reaches nothing
    and the worker blocks until the library ends by itself (taskvine_port.exec_command,
    remote.library_started)."""
    cfg = datavine.ManagerConfig(run_dir=tmp_path)
    with datavine.LocalCluster(workers=1, cores=1, manager=cfg, run=datavine.RunConfig(
            memory=None, progress=False)) as c:
        pid, group, parent = c.get({"p": (library_process,)}, "p")
    assert parent == "vine_worker"
    assert group == pid


def test_a_local_cluster_whose_workers_never_connect_says_so(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The library's first calls go out before the workers connect: workers that never do
    (here, a wrong password) still end the start with NoWorkersError after the bound, naming
    how long it waited, and nothing keeps running."""
    from datavine.deploy import local_workers

    wrong = tmp_path / "wrong.password"
    wrong.write_text("not the cluster's password")
    real = local_workers.worker_command
    monkeypatch.setattr(local_workers, "worker_command",
                        lambda *a, **k: real(*a, **{**k, "password_file": wrong}))
    cfg = datavine.ManagerConfig(run_dir=tmp_path / "run")
    start = time.monotonic()
    with (pytest.raises(datavine.NoWorkersError, match=r"only 0 of 1 workers .* within [3-9] s"),
          datavine.LocalCluster(workers=1, cores=1, manager=cfg, connect_timeout_s=3)):
        pass
    assert time.monotonic() - start < 30


def test_the_runtime_is_the_port_a_run_drives_and_results_go_to_subscribers(
        tmp_path: Path) -> None:
    """The runtime composes TaskVine's port, the library and the worker watch into the one
    port :class:`GraphRun` drives; result hooks are subscribed for a block, in order."""
    from datavine.manager.port import RunPort
    from datavine.manager.runtime import Runtime

    rt = Runtime(datavine.ManagerConfig(run_dir=tmp_path))
    try:
        assert isinstance(rt, RunPort)
        first, second = [], []
        with rt.subscribe_results(lambda keys, values: first.append(keys)):
            with rt.subscribe_results(lambda keys, values: second.append(keys)):
                assert len(rt.result_hooks) == 2
                rt._publish(["a"], {"a": 1})
            rt._publish(["b"], {})
        assert rt.result_hooks == ()
        assert first == [["a"], ["b"]] and second == [["a"]]
    finally:
        rt.close()


@pytest.mark.parametrize("debug_log", [False, True])
def test_taskvine_debug_log_keeps_worker_messages_only_when_asked(tmp_path: Path,
                                                                  debug_log: bool) -> None:
    """TaskVine writes every message to every worker in its debug log; datavine keeps only
    its notices and errors there unless ``ManagerConfig(debug_log=True)``."""
    config = datavine.ManagerConfig(run_dir=tmp_path, debug_log=debug_log)
    with datavine.LocalCluster(workers=1, manager=config) as cluster:
        assert delayed(operator.add)(1, 2).compute(scheduler=cluster.get) == 3
        log = Path(cluster.runtime.info_dir) / "vine-logs" / "debug"
        text = log.read_text(errors="replace")
    assert "manager start" in text  # written before datavine turned the flags down
    assert ("tx to " in text) is debug_log
