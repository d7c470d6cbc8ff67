"""The shards' pace (scheduler/shard_pace.py): a shard whose clocked reads are several times
slower per byte than the other shards', or whose bundles take several times what the other
shards' take in the same category, is read around; a run reads around it."""

from __future__ import annotations

import cloudpickle
import pytest

from datavine.config import RunConfig
from datavine.io.shards import ShardHealth
from datavine.scheduler.shard_pace import ShardPace


def pace_with(times: dict[str, list[float]], category: str = "chunk") -> ShardPace:
    pace = ShardPace(factor=3.0, min_samples=2)
    for shard, seconds in times.items():
        for s in seconds:
            pace.observe(category, shard, s)
    return pace


def test_a_shard_several_times_slower_than_the_others_is_found() -> None:
    pace = pace_with({"xcache-a": [2.0, 2.4, 2.2], "xcache-b": [0.5, 0.6, 0.55]})
    (slow,) = pace.judge()
    assert slow.shard == "xcache-a" and slow.ratio > 3.0
    assert "xcache-a" in slow.describe() and "next shard in line" in slow.describe()


def test_shards_within_the_factor_or_with_few_samples_are_not_judged() -> None:
    assert pace_with({"a": [1.0, 1.2, 1.1], "b": [0.5, 0.6]}).judge() == []
    assert pace_with({"a": [5.0], "b": [0.5, 0.6]}).judge() == []  # one sample is no pace
    assert pace_with({"a": [5.0, 5.0]}).judge() == []  # nothing to compare with
    # 6x, but milliseconds (a cold cache against a warm one): no straggler
    assert pace_with({"a": [0.06, 0.07], "b": [0.01, 0.012]}).judge() == []


MB = 1_000_000


def reads_pace(rates: dict[str, list[tuple[float, int]]]) -> ShardPace:
    pace = ShardPace(factor=3.0, min_read_samples=3)
    for shard, reads in rates.items():
        for seconds, nbytes in reads:
            pace.observe_read(shard, seconds, nbytes)
    return pace


def test_a_shard_reading_at_a_tenth_of_the_others_rate_is_found() -> None:
    # 4 MB reads: 0.1 s through b and c, 1 s through a (a tenth of the rate); the bundles
    # would take 1.9 s against 1 s with 0.9 s of decompression each: 2x, under the factor
    pace = reads_pace({"a": [(1.0, 4 * MB)] * 3, "b": [(0.1, 4 * MB)] * 3,
                       "c": [(0.11, 4 * MB)] * 2})
    (slow,) = pace.judge()
    assert slow.shard == "a" and 9 < slow.ratio < 11
    said = slow.describe()
    assert "in its reads" in said and "4.0 MB/s" in said and "next shard in line" in said


def test_reads_that_are_small_quick_or_few_say_nothing() -> None:
    # a 10x slower rate, but each read of a slow shard costs 0.1 s more: no straggler
    assert reads_pace({"a": [(0.11, 1 * MB)] * 3, "b": [(0.011, 1 * MB)] * 3}).judge() == []
    # reads under min_read_bytes are latency, not rate: not kept
    assert reads_pace({"a": [(1.0, 100_000)] * 5, "b": [(0.01, 4 * MB)] * 5}).judge() == []
    assert reads_pace({"a": [(1.0, 4 * MB)] * 2, "b": [(0.1, 4 * MB)] * 5}).judge() == []
    # 2.5x the others' time per byte: within the factor (a cold cache against a warm one)
    assert reads_pace({"a": [(2.5, 10 * MB)] * 4, "b": [(1.0, 10 * MB)] * 4}).judge() == []
    # unclocked reads (0 s: an older worker, a file opened by other means) are not samples
    assert reads_pace({"a": [(0.0, 4 * MB)] * 4, "b": [(0.1, 4 * MB)] * 4}).judge() == []


def test_a_shard_read_around_is_judged_afresh_when_it_comes_back() -> None:
    pace = reads_pace({"a": [(1.0, 4 * MB)] * 3, "b": [(0.1, 4 * MB)] * 3})
    assert [s.shard for s in pace.judge()] == ["a"]
    assert pace.judge(skip=["a"]) == []
    pace.forget("a")
    assert pace.judge() == []  # its slow reads are gone: a comes back on probation
    for _ in range(3):
        pace.observe_read("a", 0.1, 4 * MB)
    assert pace.judge() == []


def test_categories_are_compared_within_themselves() -> None:
    pace = ShardPace(factor=3.0, min_samples=2)
    for s in (2.0, 2.1):  # a heavy category on a, a light one on b: no comparison
        pace.observe("heavy", "a", s)
        pace.observe("light", "b", s / 10)
    assert pace.judge() == []


def test_calls_still_running_on_a_shard_count_once_past_the_bar() -> None:
    pace = pace_with({"b": [0.5, 0.5, 0.6]})
    # the slow shard's calls have not ended: they are its evidence
    assert pace.judge(running=[("chunk", "a", 1.0), ("chunk", "a", 1.2)]) == []
    (slow,) = pace.judge(running=[("chunk", "a", 2.0), ("chunk", "a", 2.5)])
    assert slow.shard == "a"
    assert pace.judge(running=[("chunk", "a", 2.0), ("chunk", "a", 2.5)], skip=["a"]) == []


def test_calls_stuck_on_a_shard_on_several_workers_give_it_away_before_a_read_ends() -> None:
    """Reads are clocked when they end: until the first ones through a slow shard do, its
    calls just run on. Two running far past the others' bundles, on two workers, find it."""
    pace = ShardPace()
    for seconds in (0.8, 0.2, 0.18, 0.2):  # the other shard's bundles, a cold one first
        pace.observe_wall("chunk", "b", seconds)
    # bar: max(5 x 0.2, 0.2 + 1.0) = 1.2 s
    assert pace.judge(stuck=[("chunk", "a", 1.1, "w1"), ("chunk", "a", 1.1, "w2")]) == []
    assert pace.judge(stuck=[("chunk", "a", 2.0, "w1"), ("chunk", "a", 2.0, "w1")]) == [], \
        "one slow worker is no slow shard"
    assert pace.judge(stuck=[("other", "a", 2.0, "w1"), ("other", "a", 2.0, "w2")]) == []
    (slow,) = pace.judge(stuck=[("chunk", "a", 1.5, "w1"), ("chunk", "a", 1.7, "w2"),
                                ("chunk", "b", 0.1, "w3")])
    assert slow.shard == "a" and slow.running and 7 < slow.ratio < 9
    assert "calls running 1.60 s through it, against 0.20 s" in slow.describe()
    assert pace.judge(stuck=[("chunk", "a", 2.0, "w1"), ("chunk", "a", 2.0, "w2")],
                      skip=["a"]) == []
    few = ShardPace()
    for seconds in (0.2, 0.2):
        few.observe_wall("chunk", "b", seconds)
    assert few.judge(stuck=[("chunk", "a", 5.0, "w1"), ("chunk", "a", 5.0, "w2")]) == []
    pace.forget("b")  # read around, then back: its old times judge nothing
    assert pace.judge(stuck=[("chunk", "a", 2.0, "w1"), ("chunk", "a", 2.0, "w2")]) == []


def test_a_slow_shard_is_skipped_for_a_while_without_a_failure_counted() -> None:
    health = ShardHealth()
    health.read_around("a", until=60.0)
    assert not health.is_healthy("a", 10.0) and health.failed(10.0) == ["a"]
    assert health.slow(10.0) == ["a"] and health.slow(60.0) == []
    assert health.is_healthy("a", 60.0)
    health.mark_failed("a", 61.0)  # a real failure later starts at the first strike
    assert health.slow(61.0) == []  # failed, not slow: readers fail over by themselves
    assert health.failed(61.0 + health.cooldown_s - 1) == ["a"]
    assert health.is_healthy("a", 61.0 + health.cooldown_s)


def read_file(path: str) -> int:
    return len(path)


@pytest.mark.parametrize(("read_around", "evidence"),
                         [(True, "bundles"), (True, "reads"), (False, "bundles"),
                          (False, "reads")])
def test_a_run_reads_around_a_slow_shard_and_says_so(read_around: bool, evidence: str) -> None:
    """Two shards; xcache-a is slow, in its bundles' run time (4x the others', no clocked
    reads) or in its clocked reads only (10x the seconds per byte, the bundles' time the
    same: decompression dominates): the run judges it slow, the next bundles of its files are
    read through the other shard (their call says to read around it, and the state machine's
    shard for them is the other one), and the summary says so. With
    ``read_around_slow_shards=False`` every file stays on its own shard."""
    from dataclasses import replace

    from datavine.io.shards import Shard, ShardMap, logical_name
    from datavine.protocol import BundleResult, ReadRecordDict, Status
    from datavine.scheduler import graph as graphs
    from datavine.scheduler.learned import Learned
    from datavine.scheduler.run_messages import CallDone, Submit, Tick
    from datavine.scheduler.run_state import RunState

    shardmap = ShardMap([Shard("root://a.example:1094", name="xcache-a"),
                         Shard("root://b.example:1094", name="xcache-b")],
                        origin="root://origin.example:1094")
    files = [f"root://origin.example:1094//store/f{i}.root" for i in range(24)]
    homes = {f: shardmap.shard_for(logical_name(f)).name for f in files}
    assert set(homes.values()) == {"xcache-a", "xcache-b"}
    dsk = {("read", i): (read_file, f) for i, f in enumerate(files)}
    cfg = RunConfig(memory=None, bundles_per_slot=1, shardmap=shardmap, speculation=False,
                    placement=None, target_bundle_s=1e-6, max_bundle_tasks=1,
                    read_around_slow_shards=read_around)
    state = RunState(graphs.build(dsk, list(dsk)), cfg, Learned.fresh(cfg), now=0.0)
    now, out = 0.0, {}
    seen_avoid: dict[str, list[tuple[str, ...]]] = {"xcache-a": [], "xcache-b": []}
    for _ in range(200):
        if state.finished:
            break
        now += 0.3
        for ins in state.handle(Tick(now, 4, 4)):
            if isinstance(ins, Submit):
                out[ins.call] = ins
        for call, ins in list(out.items())[:4]:
            ((key, _),) = ins.spec.nodes
            path = files[key[1]]
            entry = state.inflight[call]
            served = entry.shard or homes[path]
            seen_avoid[homes[path]].append(ins.spec.avoid)
            slow = served == "xcache-a"
            record: ReadRecordDict = {"lfn": logical_name(path), "server": served,
                                      "rack": None, "bytes": 4_000_000, "failovers": 0,
                                      "errors": ()}
            if evidence == "reads":  # the bundle's time is the same: read 1 s or 0.1 s
                wall, record["read_s"] = 1.3, (1.0 if slow else 0.1)
            else:
                wall = 1.2 if slow else 0.3  # xcache-a is 4x slower
            result = BundleResult(Status.OK, values={key: cloudpickle.dumps(len(path))},
                                  reads=[record], timing={"read_file": (1, wall)}, wall_s=wall)
            del out[call]
            state.handle(CallDone(call, replace(result), "w1:9000", now))
    assert state.finished
    assert state.results() == {k: len(files[k[1]]) for k in dsk}
    if not read_around:
        assert state.summary.reads.slow_shards == []
        assert not state.learned.shard_health.failed(now)
        assert not any(avoid for avoids in seen_avoid.values() for avoid in avoids)
        return
    (said,) = state.summary.reads.slow_shards
    assert "xcache-a" in said and "next shard in line" in said
    assert ("in its reads" in said) == (evidence == "reads"), said
    assert "xcache-a" in state.learned.shard_health.failed(now)
    late = seen_avoid["xcache-a"][-3:]  # the last calls of xcache-a's files read around it
    assert late and all("xcache-a" in avoid for avoid in late), seen_avoid["xcache-a"]
    assert not any("xcache-a" in a for a in seen_avoid["xcache-a"][:2])
