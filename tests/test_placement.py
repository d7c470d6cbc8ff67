"""Placement: scoring workers by nearness to a task's data, and delay scheduling."""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from datavine.io.shards import ShardMap
from datavine.scheduler.placement import (
    Placement,
    PlacementPolicy,
    TaskInputs,
    Tier,
    WorkerView,
    decide,
    rank_workers,
    score,
)

FILES = [f"/store/f{i}.root" for i in range(6)]
RACKS = ["A", "B", "C"]
POLICY = PlacementPolicy(max_wait_s=5.0, cache_wait_s=1.0)


def _task(*pairs: tuple[str, str | None]) -> TaskInputs:
    return TaskInputs(tuple(f for f, _ in pairs), dict(pairs))


def test_score_prefers_cached_then_rack_then_any() -> None:
    task = _task(("/a.root", "A"))
    cached = WorkerView("w1", rack="A", files_read=frozenset({"/a.root"}))
    in_rack = WorkerView("w2", rack="A")
    far = WorkerView("w3", rack="B")
    far_read = WorkerView("w4", rack="B", files_read=frozenset({"/a.root"}))
    assert score(task, cached).tier == Tier.CACHED
    assert score(task, in_rack).tier == Tier.RACK
    assert score(task, far).tier == Tier.FAR
    # reads go through the file's shard: having read it in another rack does not make it near
    assert score(task, far_read).tier == Tier.FAR
    assert score(task, cached) > score(task, in_rack) > score(task, far)
    assert [w.id for w in rank_workers(task, [far, in_rack, cached])] == ["w1", "w2", "w3"]


def test_taskinputs_from_shardmap_uses_logical_names_and_shard_racks() -> None:
    smap = ShardMap.from_urls(["root://s0:1", "root://s1:1"], racks=["A", "B"])
    task = TaskInputs.from_shardmap(["root://origin:1094//store/x.root", "/store/x.root",
                                     "/store/y.root"], smap)
    assert task.files == ("/store/x.root", "/store/y.root")
    assert task.racks == {f: smap.rack_for(f) for f in task.files}
    assert task.home_rack() in {"A", "B"}


def test_runs_on_a_free_worker_that_already_read_the_file() -> None:
    task = _task(("/a.root", "A"))
    workers = [WorkerView("near", "A"), WorkerView("hot", "A", 1, frozenset({"/a.root"})),
               WorkerView("far-hot", "B", 1, frozenset({"/a.root"}))]
    p = decide(task, workers, waited_s=0, policy=POLICY)
    assert (p.action, p.tier, p.workers, p.rack) == ("run", Tier.CACHED, ("hot",), None)


def test_holds_for_a_busy_near_worker_then_gives_up() -> None:
    task = _task(("/a.root", "A"))
    workers = [WorkerView("near", "A", free_slots=0), WorkerView("far", "B", free_slots=4)]
    held = decide(task, workers, waited_s=0.5, policy=POLICY)
    assert held.action == "hold" and held.tier == Tier.RACK
    assert held.retry_after_s == 4.5
    late = decide(task, workers, waited_s=5.0, policy=POLICY)
    assert late == Placement("run", Tier.FAR, reason=late.reason) and late.anywhere


def test_rack_placement_names_the_rack_feature() -> None:
    task = _task(("/a.root", "A"), ("/b.root", "A"), ("/c.root", "B"))
    workers = [WorkerView("a1", "A"), WorkerView("a2", "A", 2), WorkerView("b1", "B", 8)]
    p = decide(task, workers, waited_s=0, policy=POLICY)
    assert (p.action, p.tier, p.rack) == ("run", Tier.RACK, "A")
    assert p.workers == ("a2", "a1")  # more free slots first


def test_does_not_wait_when_no_near_worker_is_connected() -> None:
    task = _task(("/a.root", "A"))
    workers = [WorkerView("b1", "B", free_slots=0), WorkerView("c1", "C", free_slots=1)]
    p = decide(task, workers, waited_s=0, policy=POLICY)
    assert p.action == "run" and p.tier == Tier.FAR and p.anywhere


def test_cached_wait_is_shorter_than_rack_wait() -> None:
    task = _task(("/a.root", "A"))
    workers = [WorkerView("hot", "A", 0, frozenset({"/a.root"})), WorkerView("a1", "A", 1)]
    assert decide(task, workers, waited_s=0.2, policy=POLICY).action == "hold"
    p = decide(task, workers, waited_s=1.5, policy=POLICY)
    assert (p.action, p.tier, p.workers) == ("run", Tier.RACK, ("a1",))


def test_trivial_cases() -> None:
    assert decide(TaskInputs(()), [WorkerView("w")], 0).anywhere
    assert decide(_task(("/a.root", "A")), [], 0).anywhere


workers_st = st.lists(
    st.builds(WorkerView, id=st.sampled_from([f"w{i}" for i in range(12)]),
              rack=st.sampled_from([*RACKS, None]), free_slots=st.integers(0, 3),
              files_read=st.frozensets(st.sampled_from(FILES), max_size=3)),
    max_size=8, unique_by=lambda w: w.id)
task_st = st.lists(st.tuples(st.sampled_from(FILES), st.sampled_from([*RACKS, None])),
                   min_size=1, max_size=4, unique_by=lambda p: p[0]).map(lambda ps: _task(*ps))


@settings(max_examples=300, deadline=None)
@given(task=task_st, workers=workers_st, waited=st.floats(0, 10),
       policy=st.builds(PlacementPolicy, max_wait_s=st.floats(0, 6), cache_wait_s=st.floats(0, 6)))
def test_decide_invariants(task: TaskInputs, workers: list[WorkerView], waited: float,
                           policy: PlacementPolicy) -> None:
    p = decide(task, workers, waited, policy)
    by_id = {w.id: w for w in workers}
    best = max((score(task, w).tier for w in workers), default=Tier.FAR)
    if p.action == "hold":
        assert waited < policy.max_wait_s  # never past the limit
        assert best > Tier.FAR  # only for a near worker that exists
        assert p.retry_after_s > 0
    else:
        assert all(by_id[w].free_slots > 0 for w in p.workers)
        assert all(score(task, by_id[w]).tier == p.tier for w in p.workers)
        assert p.rack is None or all(by_id[w].rack == p.rack for w in p.workers)
        free = [w for w in workers if w.free_slots > 0]
        if free:  # it never picks a worse tier than a free worker offers
            assert p.tier == max(score(task, w).tier for w in free) or not p.workers
    if waited >= policy.max_wait_s:
        assert p.action == "run"


@settings(max_examples=200, deadline=None)
@given(task=task_st, worker=workers_st.filter(bool).map(lambda ws: ws[0]),
       extra=st.sampled_from(FILES))
def test_reading_a_file_never_lowers_a_score(task: TaskInputs, worker: WorkerView,
                                              extra: str) -> None:
    hotter = WorkerView(worker.id, worker.rack, worker.free_slots, worker.files_read | {extra})
    assert score(task, hotter) >= score(task, worker)


def test_placement_off_reason_names_the_missing_racks() -> None:
    from datavine.scheduler.placement import placement_off_reason

    racked = ShardMap.from_urls(["root://a:1", "root://b:1"], racks=["A", "B"])
    bare = ShardMap.from_urls(["root://a:1", "root://b:1"])
    policy = PlacementPolicy()
    assert placement_off_reason(policy, racked, ["A", None]) is None
    assert placement_off_reason(None, racked, [None]) is None  # off on purpose: no note
    assert placement_off_reason(policy, None, [None]) is None
    assert "no worker has a rack" in (placement_off_reason(policy, racked, [None, None]) or "")
    assert "shards have no racks" in (placement_off_reason(policy, bare, ["A"]) or "")


def test_after_the_cache_wait_no_rack_tier_to_wait_for_means_anywhere() -> None:
    # files without racks (no shard map): once the worker that read them stayed busy for
    # cache_wait_s, holding on for a "rack" worker that cannot exist only adds latency
    task = TaskInputs(("/a.root",), {})
    busy_reader = WorkerView("w1", rack=None, free_slots=0, files_read=frozenset({"/a.root"}))
    idle = WorkerView("w2", rack=None, free_slots=1)
    policy = PlacementPolicy(max_wait_s=5.0, cache_wait_s=1.0)
    assert decide(task, [busy_reader, idle], 0.5, policy).action == "hold"
    late = decide(task, [busy_reader, idle], 1.5, policy)
    assert late.action == "run" and late.tier == Tier.FAR
