"""Backup copies: the pure decisions (:mod:`datavine.scheduler.speculation`) and the run's
state machine driving them (a copy wins and is counted once; the first copy wins and the
copy is cancelled; a failed copy is dropped and its first copy goes on), played by hand as
in ``tests/test_run_state.py``: no TaskVine, no clock."""

from __future__ import annotations

from dataclasses import replace
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from datavine.config import RunConfig
from datavine.io.shards import ShardMap
from datavine.protocol import BundleResult, Status
from datavine.scheduler.pieces import task_pieces
from datavine.scheduler.run_messages import Deliver, Fail, PoolSample, Submit, Withdraw
from datavine.scheduler.speculation import (
    IdleWorker,
    Lanes,
    OutCall,
    WorkerPace,
    choose,
    late,
    outrun_s,
    worth_copying,
)
from tests.test_run_state import CFG, Pool, of

SPEC = replace(CFG, bundles_per_slot=2, speculation=True, speculation_after=2.0,
               speculation_slack_s=0.2, speculation_waiting=True)
ADDR = {"w1": "10.0.0.1:1", "w2": "10.0.0.2:1"}


def plus(a: int, b: int) -> int:
    return a + b


# --- the pure decisions -----------------------------------------------------------------------
def test_queued_calls_are_copied_first_then_the_latest_to_an_idle_worker_of_their_rack() -> None:
    out = [OutCall(1, "w1", False, 0.0, 0.1, "A"),  # late: 10 expected times
           OutCall(2, "w1", True, None, 0.1, "A"),  # waits behind call 1
           OutCall(3, "w3", False, 9.7, 0.1, "B"),  # on time
           OutCall(4, "w3", False, 8.0, None, "B")]  # cost unknown: never late
    idle = [IdleWorker("w2", "B", 1), IdleWorker("w4", "A", 1)]
    chosen = choose(out, idle, 10.0, late_factor=2.0, late_slack_s=0.2)
    assert [(c.call, w) for c, w in chosen] == [(2, "w4"), (1, "w2")]


def test_a_call_through_a_shard_found_slow_is_copied_before_it_is_late() -> None:
    on_time = OutCall(1, "w1", False, 9.9, 1.0, "A")  # 0.1 s of its expected 1 s
    through_slow = replace(on_time, call=2, slow_shard=True)
    idle = [IdleWorker("w2", "A", 1)]
    assert choose([on_time], idle, 10.0, late_factor=2.0, late_slack_s=0.2) == []
    chosen = choose([on_time, through_slow], idle, 10.0, late_factor=2.0, late_slack_s=0.2)
    assert [(c.call, w) for c, w in chosen] == [(2, "w2")]


def test_a_copy_never_goes_to_its_own_worker_nor_beyond_the_idle_cores() -> None:
    out = [OutCall(1, "w1", True, None, 1.0), OutCall(2, "w1", True, None, 2.0)]
    assert choose(out, [IdleWorker("w1", None, 3)], 5.0, late_factor=2, late_slack_s=0) == []
    chosen = choose(out, [IdleWorker("w2", None, 1)], 5.0, late_factor=2, late_slack_s=0)
    assert [c.call for c, _ in chosen] == [2]  # the longer wait


@given(st.floats(0.0, 100.0), st.floats(0.001, 10.0), st.floats(1.0, 5.0), st.floats(0, 1))
def test_a_call_is_late_only_past_its_bound(began: float, expected: float, factor: float,
                                            slack: float) -> None:
    call = OutCall(1, "w1", False, began, expected)
    bound = began + factor * expected + slack
    assert not late(call, bound - 1e-6, factor, slack)
    assert late(call, bound + 1e-3, factor, slack)
    assert not late(replace(call, queued=True, began=None), bound + 1.0, factor, slack)


def test_a_call_on_a_slow_worker_is_outrun_by_a_copy_on_a_faster_idle_one() -> None:
    # expected 0.4 s; w1 runs at 2.5x (ends at 1.0 s), the idle w2 at 0.8x
    slow = OutCall(1, "w1", False, 0.0, 0.4, pace=2.5)
    assert abs(outrun_s(slow, 0.1, 0.8) - (1.0 - (0.1 + 0.32))) < 1e-9
    chosen = choose([slow], [IdleWorker("w2", None, 1, pace=0.8)], 0.1,
                    late_factor=2.0, late_slack_s=0.2)
    assert [(c.call, w) for c, w in chosen] == [(1, "w2")]
    # the same call near its end, or a copy as slow as it: no copy
    assert choose([slow], [IdleWorker("w2", None, 1, pace=0.8)], 0.6,
                  late_factor=2.0, late_slack_s=0.2) == []
    assert choose([slow], [IdleWorker("w2", None, 1, pace=2.5)], 0.1,
                  late_factor=2.0, late_slack_s=0.2) == []


def test_a_call_at_the_common_pace_is_never_outrun() -> None:
    for now in (0.0, 0.1, 0.3, 0.39):
        call = OutCall(1, "w1", False, 0.0, 0.4, pace=1.0)
        assert outrun_s(call, now, 1.0) <= 0.0
        assert choose([call], [IdleWorker("w2", None, 1)], now, late_factor=2.0,
                      late_slack_s=0.0) == []


def test_the_outrun_copy_goes_to_the_fastest_idle_worker() -> None:
    slow = OutCall(1, "w1", False, 0.0, 1.0, pace=4.0)
    idle = [IdleWorker("w2", None, 1, pace=1.5), IdleWorker("w3", None, 1, pace=0.9)]
    assert [w for _, w in choose([slow], idle, 0.1, late_factor=2.0, late_slack_s=0.2)] == [
        "w3"]


def test_a_workers_pace_is_the_median_of_its_last_bundles() -> None:
    pace = WorkerPace(keep=5, min_samples=3)
    pace.observe("w1", 4.0, 1.0)  # the first bundle after the library started: imports
    pace.observe("w1", 1.0, 1.0)
    assert pace.of("w1") == 1.0  # two bundles are no pace
    pace.observe("w1", 1.2, 1.0)
    assert pace.of("w1") == 1.2  # the slow first one does not make it slow
    for _ in range(3):
        pace.observe("w1", 3.0, 1.0)  # it slows down for good
    assert pace.of("w1") == 3.0
    pace.observe("w1", 1.0, None)  # cost unknown: not counted
    assert pace.of("w1") == 3.0 and pace.of("w2") == 1.0


calls = st.builds(OutCall, st.integers(1, 5), st.sampled_from(["w1", "w2"]), st.booleans(),
                  st.one_of(st.none(), st.floats(0.0, 10.0)),
                  st.one_of(st.none(), st.floats(0.01, 5.0)), st.none(),
                  st.floats(0.5, 4.0), st.booleans())
idle_workers = st.lists(st.builds(IdleWorker, st.sampled_from(["w2", "w3", "w4"]), st.none(),
                                  st.integers(1, 2), st.floats(0.5, 4.0)), max_size=3)


@given(st.lists(calls, max_size=4), idle_workers, st.floats(0.0, 12.0))
def test_a_look_whose_calls_are_not_worth_copying_chooses_nothing(
        out: list[OutCall], idle: list[IdleWorker], now: float) -> None:
    """The pre-check that spares a look the list of idle workers never hides a copy
    choose would start: with none worth copying at the fastest pace, none is chosen."""
    fastest = min([1.0, *(w.pace for w in idle)])
    if not any(worth_copying(c, now, fastest, late_factor=2.0, late_slack_s=0.2) for c in out):
        assert choose(out, idle, now, late_factor=2.0, late_slack_s=0.2) == []


def test_the_fastest_pace_is_the_fastest_measured_worker_or_the_common_one() -> None:
    pace = WorkerPace(keep=3, min_samples=2)
    assert pace.fastest() == 1.0
    for ran in (0.5, 0.6):
        pace.observe("quick", ran, 1.0)
    for ran in (3.0, 3.0):
        pace.observe("slow", ran, 1.0)
    assert pace.of("quick") == 0.55 and pace.fastest() == 0.55
    assert WorkerPace(min_samples=1).fastest() == 1.0


def test_lanes_start_the_next_call_when_one_ends() -> None:
    lanes = Lanes(lambda worker: 1)
    lanes.place(1, "w1", 0.0)
    lanes.place(2, "w1", 0.5)
    assert lanes.began == {1: 0.0} and lanes.queued(2)
    assert lanes.idle({"w1": None, "w2": "A"}) == [IdleWorker("w2", "A", 1)]
    lanes.remove(1, 2.0)
    assert lanes.began == {2: 2.0} and not lanes.queued(2)
    lanes.place(2, "w2", 3.0)  # TaskVine moved it: it runs there now
    assert lanes.on == {2: "w2"} and lanes.began == {2: 3.0} and "w1" not in lanes.lane


# --- in the run's state machine -----------------------------------------------------------------
def two_workers(dsk: dict[Any, Any], keys: list[Any], cfg: Any = SPEC) -> Pool:
    pool = Pool(dsk, keys, cfg, cores=2)
    topology = pool.state.learned.topology
    for worker, addr in ADDR.items():
        topology.announce(worker, None, 1)
        topology.learn(worker, None, addr)
    return pool


def placed(pool: Pool, where: dict[int, str]) -> list[Any]:
    """A look at the pool: each call runs on the worker named."""
    return pool.step(PoolSample(pool.now, 2, 2, {c: "RUNNING" for c in pool.out},
                                where={c: ADDR[w] for c, w in where.items()}))


def test_a_call_waiting_behind_another_is_copied_to_an_idle_worker_and_counted_once() -> None:
    pool = two_workers({("t", i): (plus, i, 10) for i in range(3)},
                       [("t", i) for i in range(3)])
    c1, c2, c3 = (s.call for s in of(Submit, pool.tick()))
    placed(pool, {c1: "w1", c2: "w1", c3: "w2"})  # c2 waits in w1's library behind c1
    pool.finish(c3, "w2")
    (copy,) = of(Submit, pool.tick())  # w2 idles, nothing else to send: c2 gets a copy
    keys = pool.out[c2].keys
    assert copy.target.worker == "w2" and copy.keys == keys
    out = pool.finish(copy.call, "w2")  # the copy comes first
    assert of(Withdraw, out) == [Withdraw(c2, running=True)]
    assert [d.keys for d in of(Deliver, out)] == [keys]
    pool.out.pop(c2)  # cancelled: it never comes back
    pool.finish(c1, "w1")
    assert pool.state.finished
    assert pool.state.results() == {("t", i): i + 10 for i in range(3)}
    backups = pool.state.summary.backups
    assert (backups.started, backups.queued, backups.won, backups.cancelled) == (1, 1, 1, 0)
    assert pool.state.summary.tasks == 3
    story = [s.detail for s in pool.state.story(keys[0])]
    assert any("backup copy" in n and "came first" in n for n in story), story
    pool.state.close()
    pool.state.validate()


def test_a_late_call_is_copied_and_the_copy_cancelled_when_the_first_comes_first() -> None:
    pool = two_workers({"x": (plus, 1, 2)}, ["x"])
    pool.state.learned.costs.observe("x", 1, 0.1)  # measured: 0.1 s
    (first,) = of(Submit, pool.tick())
    placed(pool, {first.call: "w1"})
    assert of(Submit, pool.tick(0.2)) == []  # 0.3 s in: not late yet (bound 0.4 s)
    (copy,) = of(Submit, pool.tick(0.5))  # 0.8 s in: late
    assert copy.target.worker == "w2"
    out = pool.finish(first.call, "w1")
    assert of(Withdraw, out) == [Withdraw(copy.call, running=True)]
    assert len(of(Deliver, out)) == 1
    pool.out.pop(copy.call)
    assert pool.state.finished and pool.state.results() == {"x": 3}
    backups = pool.state.summary.backups
    assert (backups.started, backups.late, backups.won, backups.cancelled) == (1, 1, 0, 1)
    notes = [s.detail for s in pool.state.story("x")]
    assert any("backup copy" in n and "cancelled" in n for n in notes), notes


def test_a_call_stopped_while_it_ran_is_reported_with_a_bound_on_what_it_read() -> None:
    """The worker drops a cancelled call with its process: what it read is in no result.
    The summary says how many such calls there were and bounds their bytes by the winner's
    (they read the same chunks); a copy cancelled while it only waited read nothing."""
    for first_wins in (True, False):
        pool = two_workers({"x": (plus, 1, 2)}, ["x"])
        pool.state.learned.costs.observe("x", 1, 0.1)
        (first,) = of(Submit, pool.tick())
        placed(pool, {first.call: "w1"})
        (copy,) = of(Submit, pool.tick(0.5))  # late: a copy on the idle w2, running there
        winner, worker = (first.call, "w1") if first_wins else (copy.call, "w2")
        read = {"lfn": "/store/x.root", "server": "xcache-b:1094", "bytes": 3_000_000}
        result = replace(pool.result(winner, worker), reads=[read, {
            "lfn": "/store/x.root", "server": "memory", "bytes": 0, "cached": 5_000}])
        pool.finish(winner, worker, result)
        backups = pool.state.summary.backups
        assert (backups.unmeasured, backups.unmeasured_bytes) == (1, 3_000_000)
        line = "\n".join(pool.state.summary.lines())
        assert "1 stopped while they ran, their reads not counted above (up to 2.9 MB)" in line
        assert pool.state.summary.reads.far_bytes + pool.state.summary.reads.near_bytes \
            == 3_000_000  # the winner's own reads, counted once

    pool = two_workers({("t", i): (plus, i, 10) for i in range(3)},
                       [("t", i) for i in range(3)])
    c1, c2, c3 = (s.call for s in of(Submit, pool.tick()))
    placed(pool, {c1: "w1", c2: "w1", c3: "w2"})  # c2 waits behind c1
    pool.finish(c3, "w2")
    (copy,) = of(Submit, pool.tick())
    pool.finish(copy.call, "w2")  # the copy wins; c2, cancelled, never ran
    assert pool.state.summary.backups.unmeasured == 0


def reads(path: str) -> int:
    return len(path)


def test_a_bundle_that_reads_a_file_is_copied_with_or_without_a_shard_map() -> None:
    pool = two_workers({"x": (reads, "/data/f.root")}, ["x"])
    pool.state.learned.costs.observe("x", 1, 0.1)
    (first,) = of(Submit, pool.tick())
    placed(pool, {first.call: "w1"})
    (copy,) = of(Submit, pool.tick(1.0))
    assert copy.spec.avoid == () and copy.target.worker == "w2"
    pool.finish(copy.call, "w2")
    assert pool.state.results() == {"x": len("/data/f.root")}


def test_a_copy_reads_around_the_shard_its_first_copy_reads_from() -> None:
    shards = ShardMap.from_urls(["root://xc-a:1094", "root://xc-b:1094"])
    url = "root://redirector:1094//store/f.root"
    pool = two_workers({"x": (reads, url)}, ["x"], replace(SPEC, shardmap=shards))
    pool.state.learned.costs.observe("x", 1, 0.1)
    (first,) = of(Submit, pool.tick())
    placed(pool, {first.call: "w1"})
    (copy,) = of(Submit, pool.tick(1.0))  # late: its shard may be the slow part
    assert first.spec.avoid == () and copy.spec.avoid == (shards.shard_for(url).name,)


def test_a_copy_of_a_call_that_only_waits_reads_where_its_first_copy_would() -> None:
    shards = ShardMap.from_urls(["root://xc-a:1094", "root://xc-b:1094"])
    urls = [f"root://redirector:1094//store/f{i}.root" for i in range(3)]
    pool = two_workers({("t", i): (reads, u) for i, u in enumerate(urls)},
                       [("t", i) for i in range(3)], replace(SPEC, shardmap=shards))
    c1, c2, c3 = (s.call for s in of(Submit, pool.tick()))
    placed(pool, {c1: "w1", c2: "w1", c3: "w2"})
    pool.finish(c3, "w2")
    (copy,) = of(Submit, pool.tick())
    assert copy.spec.avoid == ()


def test_a_call_sent_through_a_shard_found_slow_since_is_copied_around_it() -> None:
    shards = ShardMap.from_urls(["root://xc-a:1094", "root://xc-b:1094"])
    url = "root://redirector:1094//store/f.root"
    home = shards.shard_for(url).name
    pool = two_workers({"x": (reads, url)}, ["x"], replace(SPEC, shardmap=shards))
    pool.state.learned.costs.observe("x", 1, 10.0)  # expected 10 s: far from late
    (first,) = of(Submit, pool.tick())
    placed(pool, {first.call: "w1"})
    assert of(Submit, pool.tick(0.5)) == []  # on time, its shard fine: no copy
    pool.state.learned.shard_health.read_around(home, until=pool.now + 60)  # judged slow
    (copy,) = of(Submit, pool.tick(0.5))
    assert copy.target.worker == "w2" and copy.spec.avoid == (home,)
    backups = pool.state.summary.backups
    assert (backups.started, backups.slow_shard, backups.late) == (1, 1, 0)
    story = [s.detail for s in pool.state.story("x")]
    assert any(f"reads through shard {home}, found slow" in n for n in story), story


def test_a_copy_that_fails_is_dropped_and_its_first_copy_goes_on() -> None:
    pool = two_workers({"x": (plus, 1, 2)}, ["x"])
    pool.state.learned.costs.observe("x", 1, 0.1)
    (first,) = of(Submit, pool.tick())
    placed(pool, {first.call: "w1"})
    (copy,) = of(Submit, pool.tick(1.0))
    out = pool.finish(copy.call, "w2", BundleResult(Status.MEMORY, message="over its cap"))
    assert not of(Fail, out) and not of(Withdraw, out)
    assert pool.state.summary.retries == 0  # not the bundle's failure
    pool.finish(first.call, "w1")
    assert pool.state.finished and pool.state.results() == {"x": 3}
    assert pool.state.summary.backups.failed == 1


def test_no_copies_when_speculation_is_off() -> None:
    pool = two_workers({("t", i): (plus, i, 10) for i in range(3)},
                       [("t", i) for i in range(3)], replace(SPEC, speculation=False))
    c1, c2, c3 = (s.call for s in of(Submit, pool.tick()))
    placed(pool, {c1: "w1", c2: "w1", c3: "w2"})
    pool.finish(c3, "w2")
    assert of(Submit, pool.tick(5.0)) == []
    assert pool.state.summary.backups.started == 0


def test_the_run_asks_for_a_look_at_its_tail_until_it_knows_where_its_calls_run() -> None:
    pool = two_workers({("t", i): (plus, i, 10) for i in range(3)},
                       [("t", i) for i in range(3)])
    c1, c2, c3 = (s.call for s in of(Submit, pool.tick()))
    assert pool.state.wants_look  # nothing more to send; where the calls run is unknown
    placed(pool, {c1: "w1", c2: "w1", c3: "w2"})
    assert not pool.state.wants_look
    no_copies = two_workers({"x": (plus, 1, 2)}, ["x"], replace(SPEC, speculation=False))
    no_copies.tick()
    assert not no_copies.state.wants_look


def chunk_len(chunk: tuple[str, int, int]) -> int:
    return chunk[2] - chunk[1]


def test_a_waiting_call_whose_worker_holds_its_columns_is_not_copied() -> None:
    """It runs there soon, from memory (issue 30's column cache): a copy elsewhere would
    decode the same columns again."""
    chunks = [(f"/data/f{i}.root", 0, 100) for i in range(3)]
    pool = two_workers({("t", i): (chunk_len, c) for i, c in enumerate(chunks)},
                       [("t", i) for i in range(3)])
    c1, c2, c3 = (s.call for s in of(Submit, pool.tick()))
    held = {s: pool.out[s].keys[0] for s in (c1, c2, c3)}
    topology = pool.state.learned.topology
    (piece,) = task_pieces(pool.state.graph.nodes[held[c2]])
    topology.read(topology.workers["w1"], [piece])
    placed(pool, {c1: "w1", c2: "w1", c3: "w2"})
    pool.finish(c3, "w2")
    assert of(Submit, pool.tick()) == []


def test_by_default_a_waiting_call_is_copied_only_behind_a_late_one() -> None:
    """RunConfig's default: a call that only waits behind another on time is not copied (no
    tail stealing); behind a straggler it is, before the straggler itself."""
    pool = two_workers({("t", i): (plus, i, 10) for i in range(3)},
                       [("t", i) for i in range(3)], replace(SPEC, speculation_waiting=False))
    assert not RunConfig().speculation_waiting and RunConfig().speculation
    pool.state.learned.costs.observe("t", 1, 0.1)
    c1, c2, c3 = (s.call for s in of(Submit, pool.tick()))
    placed(pool, {c1: "w1", c2: "w1", c3: "w2"})
    pool.finish(c3, "w2")
    assert of(Submit, pool.tick(0.1)) == []  # c2 only waits behind c1, which is on time
    # c1 is late now: c2 waits behind a straggler, and the one idle core takes its copy
    (copy,) = of(Submit, pool.tick(1.0))
    assert copy.keys == pool.out[c2].keys


@pytest.mark.parametrize("evidence", ["reads", "stuck"])
def test_calls_waiting_to_read_through_a_shard_found_slow_are_sent_again_around_it(
        evidence: str) -> None:
    """Found slow (by its clocked reads, or by its calls running on two workers far past
    the other shard's bundles), a shard is read around from the next call on; calls already
    sent through it that wait in their worker's library behind another are withdrawn and
    sent again (reading around it), not left to crawl through it; a call running there, or
    reading through another shard, is left as it is."""
    from datavine.io.shards import logical_name
    from datavine.scheduler.run_messages import CallWithdrawn

    shards = ShardMap.from_urls(["root://xc-a:1094", "root://xc-b:1094"])
    slow_shard = shards.shards[0].name
    urls = [f"root://redirector:1094//store/f{i}.root" for i in range(40)]
    homes = {u: shards.shard_for(logical_name(u)).name for u in urls}
    on_a = [u for u in urls if homes[u] == slow_shard][:3]
    on_b = [u for u in urls if homes[u] != slow_shard][:1]
    chosen = on_a + on_b
    cfg = replace(SPEC, shardmap=shards, speculation=False, placement=None,
                  max_bundle_tasks=1)
    pool = two_workers({("r", i): (reads, u) for i, u in enumerate(chosen)},
                       [("r", i) for i in range(len(chosen))], cfg)
    sent = of(Submit, pool.tick())
    assert len(sent) == 4
    url_of = {s.call: chosen[s.spec.nodes[0][0][1]] for s in sent}
    a_calls = [c for c, u in url_of.items() if homes[u] == slow_shard]
    (b_call,) = [c for c, u in url_of.items() if homes[u] != slow_shard]
    # w1 runs an xcache-a call with another waiting behind it; w2 runs an xcache-a call
    # with the xcache-b call waiting behind it
    placed(pool, {a_calls[0]: "w1", a_calls[1]: "w1", a_calls[2]: "w2", b_call: "w2"})
    pace = pool.state.learned.shard_pace
    if evidence == "reads":
        for _ in range(2):  # clocked reads: xcache-a at a tenth of xcache-b's rate
            pace.observe_read(slow_shard, 1.0, 4_000_000)
            pace.observe_read(shards.shards[1].name, 0.1, 4_000_000)
        out = pool.tick(0.3)
    else:  # xcache-b's bundles took 0.2 s; xcache-a's calls run on w1 and w2
        for _ in range(3):
            pace.observe_wall(pool.state.inflight[b_call].category, shards.shards[1].name,
                              0.2)
        assert of(Withdraw, pool.tick(0.3)) == []  # 0.3 s: not past the bar (1.2 s)
        out = pool.tick(1.2)
    assert of(Withdraw, out) == [Withdraw(a_calls[1], running=True)]
    (said,) = pool.state.summary.reads.slow_shards
    assert ("calls running" in said) == (evidence == "stuck"), said
    assert "1 calls waiting to read through it sent again" in said, said
    pool.out.pop(a_calls[1])
    again = of(Submit, pool.step(CallWithdrawn(a_calls[1])) + pool.tick())
    assert len(again) == 1 and slow_shard in again[0].spec.avoid
    assert again[0].keys == sent[[s.call for s in sent].index(a_calls[1])].keys
    for call in list(pool.out):
        pool.finish(call, "w1")
    assert pool.state.finished
    assert pool.state.results() == {("r", i): len(u) for i, u in enumerate(chosen)}
    assert pool.state.summary.tasks == 4  # each counted once


def test_looks_for_backup_copies_thin_out_with_the_calls_out() -> None:
    """A look walks every call out: every 50 ms for a few calls (a straggler on the box is
    found at once), every 1 ms per call beyond 50 (0.26 s at 256 workers, ~0.2% of a core)."""
    from datavine.scheduler.run_copies import speculate_every

    assert speculate_every(0) == speculate_every(4) == speculate_every(50) == 0.05
    assert speculate_every(256) == pytest.approx(0.256)
    assert speculate_every(512) > speculate_every(256)
