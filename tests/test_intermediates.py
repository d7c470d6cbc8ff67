"""Values kept on workers: the bookkeeping (fake TaskVine files), the planner's recovery of
lost values, and the real path on vine_workers (a tree whose intermediates never reach the
manager, and a worker killed while it holds some)."""

from __future__ import annotations

import threading
import time
from typing import Any

import pytest

from datavine.scheduler import graph as graphs
from datavine.scheduler.bundling import CostModel, Planner
from datavine.scheduler.intermediates import Intermediates


class Files:
    """Fake TaskVine temp files: which are declared."""

    def __init__(self) -> None:
        self.live: set[int] = set()
        self.n = 0

    def declare(self) -> int:
        self.n += 1
        self.live.add(self.n)
        return self.n

    def undeclare(self, f: int) -> None:
        self.live.remove(f)  # undeclaring twice, or what was never declared, is a bug


def test_kept_values_are_undeclared_when_consumed_inlined_or_failed() -> None:
    files = Files()
    kept = Intermediates(files.declare, files.undeclare)
    plan = kept.plan(["a", "b", "c"], [])
    # one file for the bundle's outputs, whatever their number
    assert len(files.live) == 1 and set(plan.store) == {"a", "b", "c"}
    assert len(set(plan.store.values())) == 1
    # "a" kept, "b" small enough to come back inline, "c" not written
    kept.made(plan, stored={"a": 1000}, inline=["b"], worker="w1")
    assert set(kept.held) == {"a"} and len(files.live) == 1
    consumer = kept.plan([], ["a", "b"])
    assert set(consumer.fetch) == {"a"}  # "b" travels inline
    kept.fetched(consumer, "w2")
    assert kept.peer_bytes == 1000 and kept.kept_bytes == 1000
    kept.consumed("a")
    assert not kept.held and not files.live
    failed = kept.plan(["d"], [])
    kept.failed(failed)
    kept.failed(failed)  # idempotent
    assert not files.live


def test_a_bundle_file_that_holds_nothing_is_dropped_at_once() -> None:
    files = Files()
    kept = Intermediates(files.declare, files.undeclare)
    kept.made(kept.plan(["a", "b"], []), stored={}, inline=["a", "b"], worker="w1")
    assert not kept.held and not files.live


def test_one_file_per_bundle_is_fetched_once_and_dropped_with_its_last_value() -> None:
    files = Files()
    kept = Intermediates(files.declare, files.undeclare)
    kept.made(kept.plan(["a", "b", "c"], []), {"a": 10, "b": 20, "c": 30}, [], "w1")
    kept.made(kept.plan(["d"], []), {"d": 40}, [], "w2")
    assert len(files.live) == 2
    consumer = kept.plan([], ["a", "b", "d"])
    # a and b share their bundle's file: one name, fetched once; d has its own
    assert consumer.fetch["a"] == consumer.fetch["b"] != consumer.fetch["d"]
    kept.fetched(consumer, "w2")
    assert kept.peer_bytes == 60  # a whole file moves: a, b and c; d was on w2 already
    kept.consumed("a")
    kept.consumed("b")
    assert len(files.live) == 2  # c still needs the first file
    kept.consumed("c")
    kept.consumed("d")
    assert not files.live and not kept.held


def test_a_lost_file_loses_every_value_in_it() -> None:
    files = Files()
    kept = Intermediates(files.declare, files.undeclare)
    kept.made(kept.plan(["a", "b"], []), {"a": 10, "b": 20}, [], "w1")
    kept.made(kept.plan(["c"], []), {"c": 5}, [], "w1")
    assert kept.lose(["a", "a"]) == ["a", "b"]  # b was in the same file
    assert set(kept.held) == {"c"} and len(files.live) == 1


def test_sizes_learned_in_one_run_decide_the_next_runs_first_bundles() -> None:
    learned: dict[str, int] = {}
    first = Intermediates(Files().declare, lambda f: None, largest=learned)
    assert first.worth_keeping("leaf", inline_max=100)  # unknown: keep
    first.observe("leaf", 10)
    first.observe("tree", 5000)
    second = Intermediates(Files().declare, lambda f: None, largest=learned)
    assert not second.worth_keeping("leaf", inline_max=100)  # small last run: inline
    assert second.worth_keeping("tree", inline_max=100)
    second.observe("leaf", 500)  # larger this time: kept again from now on
    assert second.worth_keeping("leaf", inline_max=100) and learned["leaf"] == 500


def test_values_on_a_lost_worker_are_forgotten() -> None:
    files = Files()
    kept = Intermediates(files.declare, files.undeclare)
    for key, worker in (("a", "w1"), ("b", "w2"), ("c", "w1")):
        kept.made(kept.plan([key], []), {key: 5}, [], worker)
    assert sorted(kept.lost_on({"w1"})) == ["a", "c"]
    assert set(kept.held) == {"b"} and len(files.live) == 1
    kept.clear()
    assert not files.live


def _tree(n: int = 8) -> tuple[graphs.TaskGraph, Any]:
    dsk: dict[Any, Any] = {("leaf", i): (int, i) for i in range(n)}
    final = graphs.add_merge_tree(dsk, list(dsk), 2, key=lambda d, j: ("merge", d, j),
                                  task=lambda keys: (sum, list(keys)))
    return graphs.build(dsk, [final]), final


def _run(planner: Planner, available: set[Any]) -> None:
    """Complete every bundle the planner hands out (values become available)."""
    while not planner.finished:
        bundles = planner.next_bundles(4)
        assert bundles, "the planner stalled"
        for b in bundles:
            planner.complete(b)
            available.update(b.outputs)


def test_undo_reruns_lost_values_and_what_they_need() -> None:
    graph, final = _tree()
    planner = Planner(graph, files=lambda k: (), costs=CostModel(), target_s=1.0, max_tasks=1)
    available: set[Any] = set()
    _run(planner, available)
    # Level-1 merge ("merge", 1, 0) was lost, and the leaves/merges below it were consumed.
    lost = ("merge", 1, 0)
    available = {final}
    undone = planner.undo([lost], available.__contains__)
    assert lost in undone
    assert {("merge", 0, 0), ("merge", 0, 1), ("leaf", 0), ("leaf", 3)} <= undone
    assert ("merge", 1, 1) not in undone and final not in undone
    ready = {k for b in planner.next_bundles(16) for k in b.keys}
    assert ready == {k for k in undone if k[0] == "leaf"}  # merges wait for their inputs


def test_undo_stops_at_values_still_held() -> None:
    graph, _ = _tree()
    planner = Planner(graph, files=lambda k: (), costs=CostModel(), target_s=1.0, max_tasks=1)
    _run(planner, set())
    undone = planner.undo([("merge", 1, 0)], lambda k: k in {("merge", 0, 0), ("merge", 0, 1)})
    assert undone == {("merge", 1, 0)}
    (bundle,) = planner.next_bundles(1)
    assert bundle.keys == [("merge", 1, 0)]


# --- on real workers ------------------------------------------------------------------------
def make_array(i: int) -> Any:
    import numpy as np

    return np.full(512 * 1024, float(i))  # 4 MiB


def add_arrays(*parts: Any) -> Any:
    return sum(parts)


def _array_tree(n: int, fanin: int) -> tuple[dict[Any, Any], Any]:
    dsk: dict[Any, Any] = {("make", i): (make_array, i) for i in range(n)}
    final = graphs.add_merge_tree(dsk, list(dsk), fanin, key=lambda d, j: ("add", d, j),
                                  task=lambda keys: (add_arrays, *keys))
    return dsk, final


@pytest.mark.taskvine
def test_intermediates_stay_on_workers(cluster: Any) -> None:
    dsk, final = _array_tree(16, 4)
    (value,) = cluster.get(dsk, [final])
    assert value[0] == sum(range(16)) and value.nbytes == 4 * 2**20
    traffic = cluster.last_summary.traffic
    # Bundles merge subtrees in one process; their results wait on the workers for the
    # last merge, and only its value reaches the manager.
    assert traffic.kept >= 4 * 2**20, cluster.last_summary.lines()
    assert traffic.manager < 1.5 * value.nbytes, cluster.last_summary.lines()


@pytest.mark.taskvine
def test_intermediates_stay_on_workers_uncapped(tmp_path: Any) -> None:
    """Bundles run in the library process itself: files are read and written in the call's
    sandbox there too."""
    import datavine

    dsk, final = _array_tree(8, 2)
    with datavine.LocalCluster(workers=2, cores=1, manager=datavine.ManagerConfig(
            run_dir=tmp_path), run=datavine.RunConfig(memory=None, max_bundle_tasks=2)) as c:
        (value,) = c.get(dsk, [final])
        traffic = c.last_summary.traffic
    assert value[0] == sum(range(8))
    assert traffic.kept > 0 and traffic.manager < 1.5 * value.nbytes


@pytest.mark.taskvine
def test_inline_mode_sends_everything_through_the_manager(cluster: Any) -> None:
    dsk, final = _array_tree(8, 4)
    run = cluster.runtime.run_config
    # one task per bundle: how the graph is cut must not depend on the costs this shared
    # cluster learned in earlier tests (bigger bundles keep more inside one process)
    cluster.runtime.run_config = run.replace(keep_on_workers=False, max_bundle_tasks=1)
    try:
        (value,) = cluster.get(dsk, [final])
    finally:
        cluster.runtime.run_config = run
    assert value[0] == sum(range(8))
    traffic = cluster.last_summary.traffic
    # each leaf's 4 MiB comes back to the manager and goes out again to its merge
    assert traffic.kept == 0 and traffic.manager > 2 * 8 * 4 * 2**20, traffic


def make_marked(i: int, folder: str) -> Any:
    """A 4 MiB leaf that leaves a mark naming the worker that made it (one per run)."""
    import os
    from pathlib import Path

    import numpy as np

    worker = os.environ.get("DATAVINE_WORKER_ID", "?")
    Path(folder, f"{i}.{worker}.{time.monotonic_ns()}").touch()
    time.sleep(0.1)
    return np.full(512 * 1024, float(i))


def wait_for_file(path: str, timeout_s: float) -> int:
    """Returns once ``path`` exists (bounded: a test that never writes it does not hang)."""
    import os

    deadline = time.monotonic() + timeout_s
    while not os.path.exists(path) and time.monotonic() < deadline:
        time.sleep(0.05)
    return 0


def add_after(gate: int, *parts: Any) -> Any:
    return gate + sum(parts)


def _makers(folder: Any) -> dict[int, list[str]]:
    """Leaf -> the workers that made it, in order."""
    runs: dict[int, list[tuple[int, str]]] = {}
    for mark in folder.iterdir():
        i, worker, ns = mark.name.split(".")
        runs.setdefault(int(i), []).append((int(ns), worker))
    return {i: [w for _, w in sorted(r)] for i, r in runs.items()}


@pytest.mark.taskvine
def test_worker_killed_while_holding_values(tmp_path: Any) -> None:
    """The leaves' values wait on the workers behind a gate: a worker that made some of them
    is killed, and the gate opens once datavine has seen it leave (before any consumer is
    sent, so that TaskVine's own recovery tasks do not remake them first): the values it
    held are lost and made again, on the other workers."""
    import datavine

    n = 12
    marks, gate = tmp_path / "marks", tmp_path / "killed"
    marks.mkdir()
    dsk: dict[Any, Any] = {("make", i): (make_marked, i, str(marks)) for i in range(n)}
    dsk["gate"] = (wait_for_file, str(gate), 120.0)
    pairs = [("pair", j) for j in range(n // 2)]
    for j, key in enumerate(pairs):  # no leaf is consumed before the gate opens
        dsk[key] = (add_after, "gate", ("make", 2 * j), ("make", 2 * j + 1))
    final = graphs.add_merge_tree(dsk, pairs, 2, key=lambda d, j: ("add", d, j),
                                  task=lambda keys: (add_arrays, *keys))
    run = datavine.RunConfig(max_bundle_tasks=2, target_bundle_s=0.01, no_worker_timeout_s=30,
                             timeout_s=180)
    with datavine.LocalCluster(workers=3, cores=1, run=run,
                               manager=datavine.ManagerConfig(run_dir=tmp_path)) as cluster:
        done: list[int] = []
        victims: list[int] = []  # leaves delivered and held by the killed worker
        killed: list[str] = []

        def open_the_gate_once_the_loss_is_seen(worker: str) -> None:
            known = cluster.runtime.learned.topology.workers
            deadline = time.monotonic() + 60  # bounded; a loss never seen fails below
            while worker in known and time.monotonic() < deadline:
                time.sleep(0.05)
            gate.touch()

        def kill_a_worker_holding_values(keys: list[Any], values: dict[Any, Any]) -> None:
            done.extend(k[1] for k in keys if isinstance(k, tuple) and k[0] == "make")
            if len(done) >= 4 and not killed:
                makers = _makers(marks)
                worker = makers[done[-1]][0]  # "local-<i>": it holds that leaf's value
                victims.extend(i for i in done if makers[i] == [worker])
                cluster.workers.kill(int(worker.split("-")[1]))
                killed.append(worker)
                threading.Thread(target=open_the_gate_once_the_loss_is_seen, args=(worker,),
                                 daemon=True).start()

        with cluster.subscribe_results(kill_a_worker_holding_values):
            (value,) = cluster.get(dsk, [final])
        summary = cluster.last_summary
    assert value[0] == sum(range(n))
    assert killed and victims, "no worker was killed while it held a value"
    assert killed[0] in summary.lost_workers, summary.lines()
    assert summary.recomputed >= len(victims), summary.lines()
    assert any("values kept on lost workers" in f for f in summary.failures), summary.lines()
    makers = _makers(marks)
    for i in victims:  # each was made again, on another worker
        assert len(makers[i]) >= 2 and makers[i][-1] != killed[0], (i, makers[i])


def make_or_stall(i: int) -> Any:
    import numpy as np

    time.sleep(0.2 if i < 6 else 60)
    return np.full(64 * 1024, float(i))  # 512 KiB: kept on the worker


@pytest.mark.taskvine
def test_interrupted_run_hands_kept_values_to_the_result_hook(tmp_path: Any) -> None:
    """Ctrl-C: the values still kept on workers are fetched for the result hook (the coffea
    executor merges what finished from them) before they are dropped."""
    import os
    import signal

    import datavine

    dsk: dict[Any, Any] = {("stall", i): (make_or_stall, i) for i in range(8)}
    final = graphs.add_merge_tree(dsk, list(dsk), 2, key=lambda d, j: ("add", d, j),
                                  task=lambda keys: (add_arrays, *keys))
    seen: dict[Any, Any] = {}
    run = datavine.RunConfig(max_bundle_tasks=1, target_bundle_s=0.001)
    with datavine.LocalCluster(workers=2, cores=1, run=run,
                               manager=datavine.ManagerConfig(run_dir=tmp_path)) as cluster:
        timer = threading.Timer(4.0, os.kill, (os.getpid(), signal.SIGINT))
        with cluster.subscribe_results(lambda keys, values: seen.update(values)):
            timer.start()
            with pytest.raises(KeyboardInterrupt):
                cluster.get(dsk, [final])
        timer.join()
    assert seen, "no kept value reached the hook"
    for key, value in seen.items():  # each is the right value: an item or a sum of items
        width = 2 ** (key[1] + 1) if key[0] == "add" else 1  # leaves under a merge
        items = [key[1]] if key[0] == "stall" else range(width * key[2], width * (key[2] + 1))
        assert float(value[0]) == sum(items), (key, float(value[0]))
