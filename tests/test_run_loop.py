"""The run loop (:class:`datavine.manager.execution.GraphRun`) driven through retries,
overruns, lost
calls, lost kept values and shard failover on a fake port (tests/fake_runtime.py): fast,
deterministic, no TaskVine. The end-to-end tests on real workers stay in test_runtime,
test_faults and test_intermediates."""

from __future__ import annotations

from typing import Any

import pytest

from datavine.config import RunConfig
from datavine.errors import BundleFailedError, MemoryCapError, TaskTimeLimitError
from datavine.manager.execution import GraphRun
from datavine.protocol import Status
from datavine.scheduler import graph as graphs
from datavine.scheduler.memory import MemoryPolicy
from tests.fake_runtime import FakeRuntime


def big(i: int) -> Any:
    import numpy as np

    return np.full(32 * 1024, float(i))  # 256 KiB: kept on the worker


def add(*parts: Any) -> Any:
    return sum(parts[1:], parts[0])


def tree(n: int = 8, fanin: int = 2) -> tuple[dict[Any, Any], Any]:
    dsk: dict[Any, Any] = {("big", i): (big, i) for i in range(n)}
    final = graphs.add_merge_tree(dsk, list(dsk), fanin, key=lambda d, j: ("add", d, j),
                                  task=lambda keys: (add, *keys))
    return dsk, final


def run(rt: FakeRuntime, dsk: dict[Any, Any], keys: list[Any]) -> list[Any]:
    graph = graphs.build(dsk, keys)
    values = GraphRun(rt, graph, rt.run_config).execute()  # type: ignore[arg-type]
    return [values[k] for k in keys]


CFG = RunConfig(memory=None, max_bundle_tasks=1, target_bundle_s=1e-6, wait_s=1)


def test_values_stay_on_workers_and_are_dropped_when_consumed() -> None:
    rt = FakeRuntime(CFG)
    dsk, final = tree()
    (value,) = run(rt, dsk, [final])
    assert value[0] == sum(range(8))
    summary = rt.last_summary
    assert summary.traffic.kept >= 8 * 256 * 1024  # every leaf and inner merge stayed there
    assert not rt.declared, "temps left declared after the run"


def test_inline_mode_keeps_nothing() -> None:
    rt = FakeRuntime(CFG.replace(keep_on_workers=False))
    dsk, final = tree()
    assert run(rt, dsk, [final])[0][0] == sum(range(8))
    assert rt.last_summary.traffic.kept == 0 and rt.declared == set()


def test_small_outputs_stop_making_temp_files() -> None:
    rt = FakeRuntime(CFG.replace(bundles_per_slot=1))
    declared_after: list[int] = []  # results seen when each temp was declared
    declare = rt.declare_temp

    def counted() -> Any:
        declared_after.append(rt.calls)
        return declare()

    rt.declare_temp = counted  # type: ignore[method-assign]
    dsk = {("small", i): (int, i) for i in range(20)}
    dsk["total"] = (sum, list(dsk))
    assert run(rt, dsk, ["total"]) == [sum(range(20))]
    # only the first bundles of the category (one per slot, sent before any result) made
    # one; the 18 sent after a result showed how small the values are made none
    assert declared_after == [0, 0], declared_after
    assert rt.last_summary.bundles == 21  # one task per bundle: the leaves and the total
    assert rt.last_summary.traffic.kept == 0
    assert not rt.declared


def test_lost_worker_values_are_made_again() -> None:
    lost_at = {"call": 10}
    rt: FakeRuntime

    def script(n: int, spec: dict[str, Any]) -> Any:
        if n == lost_at["call"]:
            for worker in rt.workers[:1]:
                rt.lose_worker(worker)
        return None

    rt = FakeRuntime(CFG, workers=2, script=script)
    dsk, final = tree(16)
    (value,) = run(rt, dsk, [final])
    assert value[0] == sum(range(16))
    summary = rt.last_summary
    assert summary.recomputed > 0, summary.lines()
    assert len(summary.completions) > len(dsk)  # some ran twice
    assert summary.tasks == len(dsk)  # and count once
    assert not rt.declared


def test_overrun_is_retried_under_a_larger_cap_then_gives_up_at_the_ceiling() -> None:
    policy = MemoryPolicy(default_mb=100, floor_mb=50, ceiling_mb=400, growth=2.0)

    def once(n: int, spec: dict[str, Any]) -> Any:
        return {"status": Status.MEMORY, "peak_mb": 150.0} if n == 1 else None

    rt = FakeRuntime(CFG.replace(memory=policy), script=once)
    assert run(rt, {"x": (int, 3)}, ["x"]) == [3]
    assert rt.last_summary.categories["x"].overruns == 1
    assert rt.last_summary.retries == 1

    def always(n: int, spec: dict[str, Any]) -> Any:
        return {"status": Status.MEMORY, "peak_mb": 1e6}

    with pytest.raises(MemoryCapError, match="'x'"):
        run(FakeRuntime(CFG.replace(memory=policy), script=always), {"x": (int, 3)}, ["x"])


def test_lost_calls_are_retried_then_fail_naming_the_tasks() -> None:
    flaky = FakeRuntime(CFG, script=lambda n, spec: "lost" if n <= 2 else None)
    assert run(flaky, {"x": (int, 1)}, ["x"]) == [1]
    assert flaky.last_summary.retries == 2
    dead = FakeRuntime(CFG.replace(max_retries=2), script=lambda n, spec: "lost")
    with pytest.raises(BundleFailedError, match=r"'x'.*failed 3 times"):
        run(dead, {"x": (int, 1)}, ["x"])


def test_shard_failure_is_retried_and_cools_the_shard() -> None:
    def script(n: int, spec: dict[str, Any]) -> Any:
        if n == 1:
            return {"status": Status.INPUT, "server": "xcache-1", "message": "down"}
        return None

    rt = FakeRuntime(CFG, script=script)
    assert run(rt, {"x": (int, 5)}, ["x"]) == [5]
    assert rt.last_summary.reads.failovers == 1
    import time

    assert "xcache-1" in rt.learned.shard_health.failed(time.monotonic())


def test_time_limit_is_retried_once_then_raised() -> None:
    over = {"status": Status.TIME, "key": "x", "limit_s": 2.0, "message": "ran past"}
    rt = FakeRuntime(CFG, script=lambda n, spec: over if n == 1 else None)
    assert run(rt, {"x": (int, 5)}, ["x"]) == [5]
    assert rt.last_summary.timeouts == 1
    with pytest.raises(TaskTimeLimitError, match="'x'"):
        run(FakeRuntime(CFG, script=lambda n, spec: over), {"x": (int, 5)}, ["x"])


def test_user_error_is_raised_with_the_remote_traceback() -> None:
    def boom(x: int) -> int:
        raise ValueError(f"bad {x}")

    rt = FakeRuntime(CFG)
    with pytest.raises(ValueError, match="bad 4") as info:
        run(rt, {"y": (boom, 4)}, ["y"])
    assert any("remote traceback" in note for note in info.value.__notes__)
    assert rt.last_summary.retries == 0


def test_the_fake_is_the_port_a_run_drives() -> None:
    from datavine.manager.port import RunPort

    assert isinstance(FakeRuntime(CFG), RunPort)


def test_the_run_hands_delivered_values_to_its_result_hook() -> None:
    delivered: list[Any] = []
    rt = FakeRuntime(CFG)
    dsk, final = tree(4)
    graph = graphs.build(dsk, [final])
    values = GraphRun(rt, graph, CFG,  # type: ignore[arg-type]
                      on_results=lambda keys, got: delivered.append((list(keys), got))).execute()
    finished = [k for keys, _ in delivered for k in keys]
    assert sorted(map(str, finished)) == sorted(map(str, dsk))  # each task once
    assert [got for _, got in delivered if final in got] == [{final: values[final]}]


def test_a_look_asks_taskvine_only_about_calls_not_yet_placed() -> None:
    """A look at the pool asks TaskVine about the calls waiting in its queue and those its
    log says it put back, not about calls seen on a worker already: its cost follows what
    changed, not the calls out. A tail look (not full) reads no log."""

    class Watched(FakeRuntime):
        def __init__(self) -> None:
            super().__init__(CFG)
            self.asked: list[list[int]] = []
            self.put_back: list[int] = []
            self.logs_read = 0

        def call_places(self, task_ids: Any) -> dict[int, tuple[str, str | None]]:
            ids = sorted(task_ids)
            self.asked.append(ids)
            return super().call_places(ids)

        def call_worker(self, task_id: int) -> str | None:
            return self.workers[task_id % 2] if self.states.get(task_id) == "RUNNING" else None

        def requeued(self, now: float) -> list[int]:
            self.logs_read += 1
            out, self.put_back = self.put_back, []
            return out

    rt = Watched()
    loop = GraphRun(rt, graphs.build({"a": (abs, -1)}, ["a"]), CFG)  # type: ignore[arg-type]
    loop.tasks, loop.calls = {1: 11, 2: 12, 3: 13}, {11: 1, 12: 2, 13: 3}
    rt.states = {11: "RUNNING", 12: "READY", 13: "RUNNING"}
    first = loop._sample(0.0)
    assert rt.asked[-1] == [11, 12, 13]
    assert first.where == {1: rt.workers[1], 3: rt.workers[1]} and first.moved == {1, 3}
    second = loop._sample(1.0)
    assert rt.asked[-1] == [12]  # the placed calls are not asked about again
    assert second.where == first.where and second.moved == frozenset()
    assert second.states == {2: "READY"}
    rt.put_back, rt.states[11] = [11], "READY"  # TaskVine's log: it put call 1 back
    third = loop._sample(2.0)
    assert rt.asked[-1] == [11, 12] and third.requeued == {1}
    assert third.states == {1: "READY", 2: "READY"} and third.where == {3: rt.workers[1]}
    reads = rt.logs_read
    rt.states[12] = "RUNNING"
    tail = loop._sample(2.02, full=False)
    assert not tail.full and rt.logs_read == reads and tail.requeued == frozenset()
    assert rt.asked[-1] == [11, 12] and tail.moved == {2}


def test_a_run_freezes_the_heap_it_found_and_gives_it_back() -> None:
    """During a run the collector skips what the process held when it started (a full
    collection walked the whole graph); after it, nothing stays frozen, and a freeze the
    process made itself is left as it was."""
    import gc

    from datavine.manager.execution import frozen_heap

    assert gc.get_freeze_count() == 0
    seen: list[int] = []

    class Counting(FakeRuntime):
        def wait(self, timeout_s: int) -> Any:
            seen.append(gc.get_freeze_count())
            return super().wait(timeout_s)

    rt = Counting(CFG)
    assert run(rt, {"a": (abs, -1)}, ["a"]) == [1]
    assert seen and min(seen) > 0  # frozen while the run waited
    assert gc.get_freeze_count() == 0  # and given back
    gc.freeze()
    try:
        assert gc.get_freeze_count() > 0
        with frozen_heap():
            pass
        # the process's own freeze stays (its count may fall as frozen objects are freed:
        # other tests' threads end, the count fell by two in a full run)
        assert gc.get_freeze_count() > 0
    finally:
        gc.unfreeze()
