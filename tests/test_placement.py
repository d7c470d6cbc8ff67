"""Placement: scoring workers by nearness to a task's data, and delay scheduling."""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from datavine.io.shards import ShardMap
from datavine.scheduler.placement import (
    Placement,
    PlacementPolicy,
    Score,
    TaskInputs,
    Tier,
    WorkerView,
    _run,
    decide,
    rank_workers,
    score,
    shard_host,
)

FILES = [f"/store/f{i}.root" for i in range(6)]
RACKS = ["A", "B", "C"]
POLICY = PlacementPolicy(max_wait_s=5.0, cache_wait_s=1.0)


def _task(*pairs: tuple[str, str | None], hosts: dict[str, str] | None = None) -> TaskInputs:
    return TaskInputs(tuple(f for f, _ in pairs), dict(pairs), hosts or {})


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
    assert task.hosts == {f: smap.shard_for(f).url[7:9] for f in task.files}  # s0 or s1
    assert task.home_rack() in {"A", "B"}


def test_shard_hosts_are_normalised_and_loopback_is_here() -> None:
    assert shard_host("root://A1.Box:1094", here="mgr.box") == "a1.box"
    assert shard_host("root://localhost:1094", here="mgr.box") == "mgr.box"
    assert shard_host("root://127.0.0.1:1094", here="mgr.box") == "mgr.box"
    assert shard_host("/store/x.root") is None
    smap = ShardMap.from_urls(["root://localhost:1"], racks=["A"])
    assert TaskInputs.from_shardmap(["/x.root"], smap, here="w.box").hosts == {"/x.root": "w.box"}


def test_a_worker_on_the_shards_host_comes_between_cached_and_rack() -> None:
    task = _task(("/a.root", "A"), hosts={"/a.root": "a1.box"})
    cached = WorkerView("c", "A", 1, frozenset({"/a.root"}), host="a2.box")
    on_host = WorkerView("h", "A", 1, host="a1.box")
    rackless_on_host = WorkerView("n", None, 1, host="a1.box")
    in_rack = WorkerView("r", "A", 1, host="a2.box")
    other_rack_same_host = WorkerView("x", "B", 1, host="a1.box")  # racks simulated on one host
    far = WorkerView("f", "B", 1, host="b1.box")
    assert score(task, on_host).tier == score(task, rackless_on_host).tier == Tier.HOST
    assert score(task, other_rack_same_host).tier == Tier.FAR  # its rack says otherwise
    assert score(task, cached) > score(task, on_host) > score(task, in_rack) > score(task, far)
    order = rank_workers(task, [far, in_rack, other_rack_same_host, on_host, cached])
    assert [w.id for w in order][:3] == ["c", "h", "r"]
    p = decide(task, [in_rack, on_host, far], waited_s=0, policy=POLICY)
    assert (p.action, p.tier, p.workers, p.rack) == ("run", Tier.HOST, ("h",), "A")
    assert "a1.box" in p.reason


def test_a_busy_worker_on_the_shard_host_is_not_waited_for_when_its_rack_has_room() -> None:
    """The shard's host is preferred among free workers, never waited for: a rack's other
    hosts read the shard over the same switch (waiting would funnel the rack's work onto
    the host that runs its shard, seen in the facility model and on the box)."""
    task = _task(("/a.root", "A"), hosts={"/a.root": "a1.box"})
    workers = [WorkerView("h", "A", 0, host="a1.box"), WorkerView("r", "A", 1, host="a2.box")]
    p = decide(task, workers, waited_s=0.0, policy=POLICY)
    assert (p.action, p.tier, p.workers) == ("run", Tier.RACK, ("r",))
    free_host = [WorkerView("h", "A", 1, host="a1.box"), WorkerView("r", "A", 1, host="a2.box")]
    p = decide(task, free_host, waited_s=0.0, policy=POLICY)
    assert (p.action, p.tier, p.workers) == ("run", Tier.HOST, ("h",))
    # a worker that read the file is still worth a short wait
    cached = [WorkerView("c", "A", 0, frozenset({"/a.root"}), host="a2.box"),
              WorkerView("r", "A", 1, host="a3.box")]
    held = decide(task, cached, waited_s=0.5, policy=POLICY)
    assert (held.action, held.tier, held.retry_after_s) == ("hold", Tier.CACHED, 0.5)
    # only rackless workers on the host are near: held up to max_wait_s, then anywhere
    rackless = [WorkerView("h", None, 0, host="a1.box"), WorkerView("f", "B", 1)]
    assert decide(task, rackless, waited_s=3.0, policy=POLICY).action == "hold"
    assert decide(task, rackless, waited_s=5.0, policy=POLICY).anywhere


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


HOSTS = ["h1", "h2", "h3", "h4"]
workers_st = st.lists(
    st.builds(WorkerView, id=st.sampled_from([f"w{i}" for i in range(12)]),
              rack=st.sampled_from([*RACKS, None]), free_slots=st.integers(0, 3),
              files_read=st.frozensets(st.sampled_from(FILES), max_size=3),
              host=st.sampled_from([*HOSTS, None])),
    max_size=8, unique_by=lambda w: w.id)
task_st = st.lists(st.tuples(st.sampled_from(FILES), st.sampled_from([*RACKS, None]),
                             st.sampled_from([*HOSTS, None])),
                   min_size=1, max_size=4, unique_by=lambda p: p[0]).map(
    lambda ps: TaskInputs(tuple(f for f, _, _ in ps), {f: r for f, r, _ in ps},
                          {f: h for f, _, h in ps}))


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
        if free:  # it never picks a worse tier than a free worker offers, anywhere included
            assert p.tier == max(score(task, w).tier for w in free)
        # anywhere is the far tier, and only then: a near run names its workers
        assert p.anywhere == (p.tier == Tier.FAR), p
        if p.tier > Tier.FAR:
            assert p.workers
    if waited >= policy.max_wait_s:
        assert p.action == "run"


@settings(max_examples=200, deadline=None)
@given(task=task_st, worker=workers_st.filter(bool).map(lambda ws: ws[0]),
       extra=st.sampled_from(FILES))
def test_reading_a_file_never_lowers_a_score(task: TaskInputs, worker: WorkerView,
                                              extra: str) -> None:
    hotter = WorkerView(worker.id, worker.rack, worker.free_slots, worker.files_read | {extra},
                        worker.host)
    assert score(task, hotter) >= score(task, worker)


def _on_a_files_host(task: TaskInputs, w: WorkerView) -> bool:
    """On the host of one of the task's shards, its rack not contradicting that shard's."""
    return any(task.hosts.get(f) == w.host is not None and (
        w.rack is None or task.racks.get(f) in (None, w.rack)) for f in task.files)


@settings(max_examples=400, deadline=None)
@given(task=task_st, a=workers_st.filter(bool).map(lambda ws: ws[0]),
       b=workers_st.filter(bool).map(lambda ws: ws[0]))
def test_a_worker_on_the_shards_host_never_ranks_below_one_only_in_its_rack(
        task: TaskInputs, a: WorkerView, b: WorkerView) -> None:
    b = WorkerView("other", b.rack, a.free_slots, b.files_read, b.host)
    if not _on_a_files_host(task, a):
        return
    assert score(task, a).tier >= Tier.HOST
    b_files = set(task.files) & b.files_read
    b_only_rack = not _on_a_files_host(task, b) and not b_files
    if b_only_rack:  # in the files' rack, or anywhere
        assert score(task, b).tier <= Tier.RACK < score(task, a).tier
        assert rank_workers(task, [b, a])[0].id == a.id


@settings(max_examples=300, deadline=None)
@given(task=task_st, workers=workers_st, waited=st.floats(0, 10))
def test_a_free_worker_on_the_host_is_chosen_over_rack_and_anywhere(
        task: TaskInputs, workers: list[WorkerView], waited: float) -> None:
    p = decide(task, workers, waited, POLICY)
    free_on_host = [w for w in workers if w.free_slots > 0 and _on_a_files_host(task, w)]
    if free_on_host and p.action == "run":
        assert p.tier >= Tier.HOST and p.workers and not p.anywhere


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


# --- the decision as first written: the faster one must not differ --------------------------
def reference_score(task: TaskInputs, w: WorkerView) -> Score:
    cached = sum(1 for f in task.files if f in w.files_read
                 and task.racks.get(f) in (None, w.rack))
    on_host = sum(1 for f in task.files if w.host is not None and task.hosts.get(f) == w.host
                  and (w.rack is None or task.racks.get(f) in (None, w.rack)))
    in_rack = sum(1 for f in task.files if w.rack is not None and task.racks.get(f) == w.rack)
    tier = (Tier.CACHED if cached else Tier.HOST if on_host else Tier.RACK if in_rack
            else Tier.FAR)
    return Score(tier, cached, on_host, in_rack)


def reference_decide(task: TaskInputs, workers: list[WorkerView], waited_s: float,
                     policy: PlacementPolicy) -> Placement:
    if not task.files:
        return Placement("run", Tier.FAR, reason="task reads no known input files")
    if not workers:
        return Placement("run", Tier.FAR, reason="no near worker connected")
    scores = {w.id: reference_score(task, w) for w in workers}
    best_connected = max(s.tier for s in scores.values())
    free = sorted(sorted((w for w in workers if w.free_slots > 0), key=lambda w: w.id),
                  key=lambda w: (scores[w.id], w.free_slots), reverse=True)
    best_free = max((scores[w.id].tier for w in free), default=None)
    cache_wait_s = min(policy.cache_wait_s, policy.max_wait_s)
    if waited_s < cache_wait_s:
        wanted = best_connected if best_connected == Tier.CACHED else min(best_connected,
                                                                          Tier.RACK)
    elif waited_s < policy.max_wait_s and any(s.rack_files or s.host_files
                                               for s in scores.values()):
        wanted = min(best_connected, Tier.RACK)
    else:
        wanted = Tier.FAR
    if best_free is not None and best_free >= wanted:
        return _run([w for w in free if scores[w.id].tier == best_free], best_free)
    if wanted > Tier.FAR:
        limit = cache_wait_s if wanted > Tier.RACK else policy.max_wait_s
        return Placement("hold", wanted, retry_after_s=max(limit - waited_s, 0.0),
                         reason=f"near workers ({wanted.name.lower()}) are busy; "
                                f"waited {waited_s:.1f} s of {limit:.1f} s")
    return Placement("run", Tier.FAR, reason="no near worker free: any worker")


@settings(max_examples=500, deadline=None)
@given(task=task_st, workers=workers_st, waited=st.floats(0, 10),
       policy=st.builds(PlacementPolicy, max_wait_s=st.floats(0, 6), cache_wait_s=st.floats(0, 6)))
def test_decide_and_score_are_as_first_written(task: TaskInputs, workers: list[WorkerView],
                                               waited: float, policy: PlacementPolicy) -> None:
    """Scoring in one loop and ranking in one sort decide exactly as the first version."""
    assert all(score(task, w) == reference_score(task, w) for w in workers)
    assert decide(task, workers, waited, policy) == reference_decide(task, workers, waited,
                                                                     policy)
