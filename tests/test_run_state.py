"""The run's state machine (:class:`datavine.scheduler.run_state.RunState`) driven event by
event: no TaskVine, no driver, no clock. Each test plays the pool by hand (which call
finishes, on which worker, with what status; which worker leaves when) and asserts on the
instructions that come out: what is submitted (and under what cap, where), withdrawn,
dropped, delivered, raised; after every event the state must agree with itself
(``RunState.validate``)."""

from __future__ import annotations

import tempfile
from dataclasses import replace
from pathlib import Path
from typing import Any

import cloudpickle
import pytest

from datavine.config import RunConfig
from datavine.errors import (
    BundleFailedError,
    MemoryCapError,
    NoWorkersError,
    RunTimeoutError,
    TaskTimeLimitError,
)
from datavine.io.column_cache import marker_name, piece_name
from datavine.io.shards import ShardMap
from datavine.protocol import BundleResult, Pickled, Status
from datavine.scheduler import graph as graphs
from datavine.scheduler.bundling import Bundle
from datavine.scheduler.inflight import Inflight
from datavine.scheduler.intermediates import Plan
from datavine.scheduler.learned import Learned
from datavine.scheduler.memory import MemoryPolicy
from datavine.scheduler.run_messages import (
    CallDone,
    CallWithdrawn,
    Deliver,
    DropTemp,
    Fail,
    Instruction,
    PoolSample,
    Submit,
    Tick,
    Withdraw,
)
from datavine.scheduler.run_state import RunState
from datavine.scheduler.topology import Target
from tests.fake_runtime import execute_in, owned_sandbox

CFG = RunConfig(memory=None, max_bundle_tasks=1, target_bundle_s=1e-6, bundles_per_slot=1,
                no_worker_timeout_s=30, timeout_s=0)


def big(i: int) -> Any:
    import numpy as np

    return np.full(32 * 1024, float(i))  # 256 KiB: kept on the worker


def add(*parts: Any) -> Any:
    return sum(parts[1:], parts[0])


def boom() -> None:
    raise ValueError("bad calibration file")


def tree(n: int, fanin: int) -> tuple[dict[Any, Any], Any]:
    dsk: dict[Any, Any] = {("big", i): (big, i) for i in range(n)}
    final = graphs.add_merge_tree(dsk, list(dsk), fanin, key=lambda d, j: ("add", d, j),
                                  task=lambda keys: (add, *keys))
    return dsk, final


class Pool:
    """Plays TaskVine and its workers for one RunState, by hand."""

    def __init__(self, dsk: dict[Any, Any], keys: list[Any], cfg: RunConfig = CFG,
                 cores: int = 2) -> None:
        self.state = RunState(graphs.build(dsk, keys), cfg, Learned.fresh(cfg), now=0.0,
                              port=9123)
        self.now = 0.0
        self.cores = cores
        self.out: dict[int, Submit] = {}  # calls submitted, not finished
        self.declared: set[int] = set()
        self.made: dict[int, tuple[str, bytes]] = {}  # temp -> (worker, bytes)
        self.sandbox = owned_sandbox(self, "datavine-state-")

    def step(self, *events: Any) -> list[Instruction]:
        """Hand the state ``events``; its lifecycle must agree with the rest of it after."""
        out = self.state.handle(*events)
        self.state.validate()
        for ins in out:
            if isinstance(ins, Submit):
                self.out[ins.call] = ins
                self.declared |= set(ins.store.values())
            elif isinstance(ins, DropTemp):
                self.declared.remove(ins.temp)  # dropped twice, or never declared: a bug
                self.made.pop(ins.temp, None)
        return out

    def tick(self, dt: float = 0.1, workers: int | None = None) -> list[Instruction]:
        self.now += dt
        n = self.cores if workers is None else workers
        return self.step(Tick(self.now, n, n))

    def result(self, call: int, worker: str) -> BundleResult:
        """Run the call's spec for real, as the worker would, in a sandbox of its own."""
        ins = self.out[call]
        box = Path(tempfile.mkdtemp(dir=self.sandbox))
        for name, temp in ins.fetch.items():
            (box / name).write_bytes(self.made[temp][1])
        result = execute_in(box, cloudpickle.dumps(ins.spec.encode()))
        for name, temp in ins.store.items():
            if (box / name).exists():
                self.made[temp] = (worker, (box / name).read_bytes())
        return result

    def finish(self, call: int, worker: str = "w1", result: Any = "run") -> list[Instruction]:
        if result == "run":
            result = self.result(call, worker)
        self.out.pop(call)
        return self.step(CallDone(call, result, worker, self.now))

    def drain(self, worker: str = "w1") -> list[Instruction]:
        seen: list[Instruction] = []
        for _ in range(200):
            if self.state.finished:
                return seen
            seen += self.tick()
            for call in list(self.out):
                seen += self.finish(call, worker)
        raise AssertionError("the run did not finish")


def of(kind: type, instructions: list[Instruction]) -> list[Any]:
    return [i for i in instructions if isinstance(i, kind)]


def test_a_tree_keeps_its_values_on_workers_and_drops_each_when_consumed() -> None:
    dsk, final = tree(4, 2)
    pool = Pool(dsk, [final])
    seen = pool.drain()
    (value,) = pool.state.results().values()
    assert value[0] == sum(range(4))
    submits = of(Submit, seen)
    assert sum(len(s.spec.nodes) for s in submits) == 7 and not of(Fail, seen)
    # every value that crossed from one bundle to another stayed on the worker that made it,
    # and was fetched once, by its consumer
    stored = sorted(t for s in submits for t in s.store.values())
    assert len(stored) >= 2 and stored == sorted(t for s in submits for t in s.fetch.values())
    assert all(not s.spec.inputs for s in submits)
    assert not pool.declared, "temps left declared"
    assert [k for d in of(Deliver, seen) for k in d.keys][-1] == final


def test_inline_mode_stores_nothing() -> None:
    dsk, final = tree(4, 2)
    pool = Pool(dsk, [final], CFG.replace(keep_on_workers=False))
    seen = pool.drain()
    assert all(not s.store and not s.fetch for s in of(Submit, seen))
    assert pool.state.summarize(1.0, 2, 0, 0).traffic.kept == 0


def test_values_that_came_back_go_on_to_their_consumers_as_the_bytes_they_came_in() -> None:
    """A value a bundle sent back is kept as its pickle: a bundle that consumes it gets
    those very bytes (the manager does not unpickle and pickle it again), and the run's
    output is the value itself, the same object each time it is asked for."""
    dsk, final = tree(4, 2)
    pool = Pool(dsk, [final], CFG.replace(keep_on_workers=False))
    sent_back: dict[Any, bytes] = {}
    seen: list[Instruction] = []
    for _ in range(200):
        if pool.state.finished:
            break
        seen += pool.tick()
        for call in list(pool.out):
            result = pool.result(call, "w1")
            sent_back.update(result.values)
            pool.out.pop(call)
            seen += pool.step(CallDone(call, result, "w1", pool.now))
    merges = [s for s in of(Submit, seen) if s.spec.inputs]
    assert merges, "no bundle took a value inline"
    for submit in merges:
        for key, value in submit.spec.inputs.items():
            assert isinstance(value, Pickled) and value.blob is sent_back[key], key
    (value,) = pool.state.results().values()
    assert value[0] == sum(range(4)) and pool.state.results()[final] is value


def test_an_overrun_is_retried_under_a_larger_cap_then_gives_up_at_the_ceiling() -> None:
    cfg = CFG.replace(memory=MemoryPolicy(default_mb=512, floor_mb=256, ceiling_mb=2048))
    pool = Pool({"x": (int, 1)}, ["x"], cfg)
    (first,) = of(Submit, pool.tick())
    assert first.cap_mb == 512
    over = BundleResult(Status.MEMORY, peak_mb=700.0, cap_mb=512.0)
    assert not of(Fail, pool.finish(first.call, result=over))
    (second,) = of(Submit, pool.tick())
    assert second.cap_mb is not None and second.cap_mb >= 1024
    assert pool.state.summary.retries == 1
    assert not of(Fail, pool.finish(second.call, result=replace(over, peak_mb=1500.0)))
    (third,) = of(Submit, pool.tick())
    assert third.cap_mb == 2048
    (fail,) = of(Fail, pool.finish(third.call, result=replace(over, peak_mb=2100.0)))
    assert isinstance(fail.error, MemoryCapError)


def test_a_call_lost_with_its_worker_runs_again_anywhere_then_fails_naming_it() -> None:
    cfg = CFG.replace(max_retries=2)
    pool = Pool({"x": (int, 1)}, ["x"], cfg)
    for _attempt in range(3):
        (submit,) = of(Submit, pool.tick())
        assert submit.features == ()  # no placement needed; a lost call goes anywhere
        out = pool.finish(submit.call, result=None)
    (fail,) = of(Fail, out)
    assert isinstance(fail.error, BundleFailedError) and "x" in str(fail.error)
    assert pool.state.summary.retries == 2


def test_no_workers_fails_after_its_bound_on_the_events_clock() -> None:
    pool = Pool({"x": (int, 1)}, ["x"])
    assert not of(Fail, pool.step(Tick(29.0, 0, 0)))
    (fail,) = of(Fail, pool.step(Tick(30.5, 0, 0)))
    assert isinstance(fail.error, NoWorkersError) and "9123" in str(fail.error)


def test_a_worker_joining_resets_the_no_worker_bound() -> None:
    pool = Pool({"x": (int, 1)}, ["x"])
    pool.step(Tick(20.0, 1, 1))
    assert not of(Fail, pool.step(Tick(45.0, 0, 0)))


def test_the_run_timeout_names_what_was_done() -> None:
    pool = Pool({"x": (int, 1)}, ["x"], CFG.replace(timeout_s=60))
    (fail,) = of(Fail, pool.step(Tick(61.0, 2, 2)))
    assert isinstance(fail.error, RunTimeoutError) and "0 tasks done" in str(fail.error)


def test_a_requeued_call_still_waiting_is_withdrawn_and_resubmitted_at_once() -> None:
    pool = Pool({"x": (int, 1)}, ["x"])
    (submit,) = of(Submit, pool.tick())
    assert not pool.step(PoolSample(pool.now, 2, 2, {submit.call: "RUNNING"}))
    # seen running, now waiting again: its library died under it ("forsaken")
    out = pool.step(PoolSample(pool.now, 2, 2, {submit.call: "READY"}))
    assert out == [Withdraw(submit.call)]
    pool.out.pop(submit.call)
    assert not pool.step(CallWithdrawn(submit.call))
    (again,) = of(Submit, pool.tick())
    assert again.spec.nodes == submit.spec.nodes
    assert pool.state.summary.retries == 1
    pool.finish(again.call)
    assert pool.state.results() == {"x": 1}


def test_a_requeued_call_already_running_elsewhere_is_only_counted() -> None:
    pool = Pool({"x": (int, 1)}, ["x"])
    (submit,) = of(Submit, pool.tick())
    out = pool.step(PoolSample(pool.now, 2, 2, {submit.call: "RUNNING"},
                               requeued=frozenset({submit.call})))
    assert not out and pool.state.summary.retries == 1
    pool.finish(submit.call)
    assert pool.state.finished


def test_values_on_a_lost_worker_are_made_again_and_their_consumer_withdrawn() -> None:
    dsk, final = tree(4, 4)  # four leaves, one merge that fetches them all
    pool = Pool(dsk, [final], cores=4)
    leaves = of(Submit, pool.tick())
    assert len(leaves) == 4
    on_lost = [leaf.keys[0] for leaf in leaves[:2]]
    for n, leaf in enumerate(leaves):
        pool.finish(leaf.call, worker="10.0.0.1:1" if n < 2 else "10.0.0.2:1")
    (merge,) = of(Submit, pool.tick())
    assert len(merge.fetch) == 4
    out = pool.step(PoolSample(pool.now, 1, 1, {merge.call: "READY"},
                               lost_addr=frozenset({"10.0.0.1:1"})))
    assert Withdraw(merge.call) in out
    assert len(of(DropTemp, out)) == 2  # the two values that were on the lost worker
    pool.out.pop(merge.call)
    pool.step(CallWithdrawn(merge.call))
    again = of(Submit, pool.tick())
    assert sorted(k for s in again for k in s.keys) == sorted(on_lost)
    pool.drain(worker="10.0.0.2:1")
    assert pool.state.results()[final][0] == sum(range(4))
    assert pool.state.summary.recomputed == 2 and pool.state.summary.lost_workers
    assert not pool.declared


def test_a_users_exception_is_raised_with_the_task_named() -> None:
    pool = Pool({"calib": (boom,)}, ["calib"])
    (submit,) = of(Submit, pool.tick())
    (fail,) = of(Fail, pool.finish(submit.call))
    assert isinstance(fail.error, ValueError)
    assert any("'calib'" in note for note in fail.error.__notes__)


def test_a_task_over_its_time_limit_runs_once_more_then_fails() -> None:
    pool = Pool({"x": (int, 1)}, ["x"], CFG.replace(task_time_limit_s=5))
    over = BundleResult(Status.TIME, key="x", limit_s=5.0,
                        message="task 'x' ran past its 5 s limit")
    (first,) = of(Submit, pool.tick())
    assert first.limit_s == 5
    assert not of(Fail, pool.finish(first.call, result=over))
    (second,) = of(Submit, pool.tick())
    (fail,) = of(Fail, pool.finish(second.call, result=over))
    assert isinstance(fail.error, TaskTimeLimitError)


def test_close_drops_every_temp_still_declared() -> None:
    dsk, final = tree(4, 4)
    pool = Pool(dsk, [final], cores=4)
    leaves = of(Submit, pool.tick())
    pool.finish(leaves[0].call)  # one value kept, three calls still out
    assert pool.declared
    pool.step()  # nothing
    for ins in pool.state.close():
        assert isinstance(ins, DropTemp)
        pool.declared.remove(ins.temp)
    assert not pool.declared


def test_handle_rejects_what_is_not_an_event() -> None:
    pool = Pool({"x": (int, 1)}, ["x"])
    with pytest.raises(TypeError, match="not an event"):
        pool.step("tick")


def test_a_shard_failing_under_a_read_cools_down_and_the_bundle_runs_again() -> None:
    pool = Pool({"x": (int, 1)}, ["x"])
    (first,) = of(Submit, pool.tick())
    failed = BundleResult(Status.INPUT, server="xcache-2", message="[ERROR] Operation expired")
    assert not of(Fail, pool.finish(first.call, result=failed))
    health = pool.state.learned.shard_health
    assert "xcache-2" in health.failed(pool.now)  # cooled down at the event's time
    (again,) = of(Submit, pool.tick())
    pool.finish(again.call)
    summary = pool.state.summary
    assert pool.state.results() == {"x": 1}
    assert summary.reads.failovers == 1 and "xcache-2" in summary.reads.failover_errors[0]


def entries(chunk: tuple[str, int, int], *_: Any) -> int:
    """A chunk task: the entries of its range (``_``: what it waits for)."""
    return chunk[2] - chunk[1]


def test_a_chunk_whose_piece_a_cache_holds_goes_before_the_order() -> None:
    """Three chunks of three files; one worker's column cache holds the piece of the chunk
    that comes last in order: it goes first (a cache keeps what the order of reads leaves
    it), and the others follow in order."""
    dsk = {name: (entries, (f"/data/{name}.root", 0, 10)) for name in ("a", "b", "c")}
    pool = Pool(dsk, list(dsk), replace(CFG, bundles_per_slot=1))
    order = sorted(dsk, key=pool.state.planner._priority.__getitem__)
    last = order[-1]
    topology = pool.state.learned.topology
    for name in ("w1", "w2"):
        topology.announce(name, None, cores=1)
    path = f"/data/{last}.root"  # w1 read that chunk: the file, its piece, the marker
    topology.learn("w1", None, "127.0.0.1:9001", [path, piece_name(path, 0, 10),
                                                   marker_name(path)])
    first, second = of(Submit, pool.tick())
    assert first.spec.keys == [last] and first.target.worker == "w1"
    assert second.spec.keys == [order[0]]


def test_a_chunk_in_flight_draws_its_later_copy_to_the_worker_that_will_hold_it() -> None:
    """Two chunks of one file go to the worker in its shard's rack; the first one's result
    tells placement that the worker's column cache holds pieces of the file (so it matches
    pieces, not the file), while the second still runs there. A later copy of the second
    chunk still goes to that worker: its piece counted as held there from its sending.
    When that call fails, the piece stops counting."""
    path = "/data/f.root"
    a, b = (path, 0, 10), (path, 10, 20)
    dsk = {"a": (entries, a), "b": (entries, b), "b-again": (entries, b, "a")}
    shards = ShardMap.from_urls(["root://a:1"], racks=["A"])
    pool = Pool(dsk, list(dsk), replace(CFG, bundles_per_slot=2, shardmap=shards))
    topology = pool.state.learned.topology
    for name, rack in (("w1", "A"), ("w2", "B")):
        topology.announce(name, rack, cores=2)
    sent = {s.spec.keys[0]: s for s in of(Submit, pool.tick())}
    assert set(sent) == {"a", "b"} and all(s.target.worker == "w1" for s in sent.values())
    held = [{"lfn": piece_name(path, 0, 10), "server": "memory"},
            {"lfn": marker_name(path), "server": "memory"}]
    result = BundleResult(Status.OK, values={"a": cloudpickle.dumps(10)}, reads=held,
                          worker="w1", rack="A")
    pool.finish(sent["a"].call, "127.0.0.1:9001", result)
    (again,) = of(Submit, pool.tick())
    assert again.spec.keys == ["b-again"] and again.target.worker == "w1"
    assert topology.holder([piece_name(path, 10, 20)]) == "w1"
    pool.finish(sent["b"].call, "127.0.0.1:9001", None)  # its worker died under it
    assert topology.holder([piece_name(path, 10, 20)]) is None


@pytest.mark.parametrize("column_cache", [True, False])
def test_a_worker_that_opened_a_file_draws_its_chunks_only_without_column_caches(
        column_cache: bool) -> None:
    """A run's first step opened every file on one worker (its metadata: coffea's
    preprocessing, the scale test's file infos), caching no piece. With column caches that
    worker holds nothing the chunks read: the first bundles fill both workers' slots at once
    (the default scale test had held them for the opener, leaving the other core idle
    ~70 ms in 3 runs of 8, until the first result came). Without column caches, the file
    the worker read may be in its input cache: the chunks wait for it."""
    path = "/data/f.root"
    dsk = {f"c{i}": (entries, (path, 10 * i, 10 * i + 10)) for i in range(6)}
    pool = Pool(dsk, list(dsk), replace(CFG, bundles_per_slot=2, column_cache=column_cache),
                cores=2)
    topology = pool.state.learned.topology
    for name in ("w1", "w2"):
        topology.announce(name, None, cores=1)
    topology.learn("w1", None, "127.0.0.1:9001", [path])  # it opened the file
    sent = of(Submit, pool.tick())
    held = len(pool.state.dispatch.held)
    if column_cache:
        assert len(sent) == 4 and not held  # two calls for each worker's one core
    else:
        assert len(sent) == 2 and {s.target.worker for s in sent} == {"w1"} and held


@pytest.mark.parametrize("capped", [True, False])
def test_chunks_a_worker_holds_go_together_after_its_cache_drops_a_piece(capped: bool) -> None:
    """The planner puts ready chunks that one worker's column cache holds in one call to it
    (the worker is their *holder*), capped or not, also after that cache dropped a piece
    (it holds less than the run reads): the held chunks go first, so the hits stay."""
    path, other = "/data/f.root", piece_name("/data/g.root", 0, 10)
    dsk = {"a": (entries, (path, 0, 10)), "b": (entries, (path, 0, 10), "a")}
    cfg = replace(CFG, memory=MemoryPolicy() if capped else None)
    pool = Pool(dsk, list(dsk), cfg)
    topology = pool.state.learned.topology
    topology.announce("w1", None, cores=2)
    topology.learn("w1", None, "127.0.0.1:9001", [path, piece_name(path, 0, 10),
                                                   marker_name(path), other,
                                                   marker_name("/data/g.root")])
    assert pool.state.planner._holder is not None  # the planner asks, capped or not
    (sent,) = of(Submit, pool.tick())
    assert sent.target.worker == "w1" and pool.state._holder("b") == "w1"
    reads = [{"lfn": piece_name(path, 0, 10), "server": "memory"},
             {"lfn": marker_name(path), "server": "memory"},
             {"lfn": other, "server": "memory", "dropped": True}]
    result = BundleResult(Status.OK, values={"a": cloudpickle.dumps(10)}, reads=reads,
                          worker="w1")
    pool.finish(sent.call, "127.0.0.1:9001", result)
    assert topology.holder([piece_name(path, 0, 10)]) == "w1"
    assert topology.holder([other]) is None  # the dropped piece is no one's now
    assert pool.state._holder("b") == "w1"


def test_a_workers_backlog_counts_a_cold_read_at_its_learned_time() -> None:
    """How long a worker stays busy (what a held bundle weighs against a cold read
    elsewhere): a call's reading tasks at a cold read's learned time for each piece its
    worker did not hold when it was sent, at a hit's for the others, less what a running
    call has run. (The category's mean alone put a call that starts with a cold read at
    a third of its time.)"""
    path = "/data/f.root"
    dsk = {("read", 0): (entries, (path, 0, 10)), ("read", 1): (entries, (path, 0, 10), 1)}
    pool = Pool(dsk, list(dsk), cores=1)
    state = pool.state
    for tasks, seconds in ((1, 0.05), (4, 0.08), (1, 0.05), (4, 0.08)):  # hit 10, cold 50 ms
        state.learned.hit_saving.observe("read", tasks, seconds, decoded=1_000_000,
                                         cached=(tasks - 1) * 1_000_000)
    state.learned.topology.announce("w1", None, cores=1)
    bundle = Bundle(0, list(dsk), set(), set(dsk), files=(path,))
    cold = Inflight(bundle, Target(worker="w1"), "read", None, Plan(),
                    expected=(piece_name(path, 0, 10),))
    assert state._call_expected(cold) == pytest.approx(0.06)  # one cold read, one hit
    warm = replace(cold, expected=())
    assert state._call_expected(warm) == pytest.approx(0.02)
    state.inflight[1], state.inflight[2] = cold, warm
    state.lanes.place(1, "w1", 0.0)
    state.lanes.place(2, "w1", 0.0)  # queued behind the first: it runs on w1's one core
    state.now = 0.05
    assert state._backlog_s("w1") == pytest.approx(0.01 + 0.02)
    assert state._backlog_s("w2") == 0.0
