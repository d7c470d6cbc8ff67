"""A bundle's lifecycle (:mod:`datavine.scheduler.lifecycle`): the table refuses a move it does
not list, stories say what happened to a task and survive the run's summary, and -- the
property -- whatever order the pool's events come in (results, deaths, overruns, failovers,
time limits, lost workers, TaskVine's requeues, withdrawals), the run state's lifecycle agrees
with its calls, the dispatcher and the planner after every event (``RunState.validate``),
and a run that does not fail delivers the right value."""

from __future__ import annotations

import os
from dataclasses import replace
from typing import Any

import pytest
from hypothesis import HealthCheck, event, given, settings
from hypothesis import strategies as st

from datavine.errors import BundleFailedError
from datavine.io.shards import ShardMap
from datavine.protocol import BundleResult, Status
from datavine.scheduler import graph as graphs
from datavine.scheduler.lifecycle import (
    ENDS,
    MOVES,
    IllegalMove,
    InvariantError,
    Lifecycle,
    Phase,
    Reason,
)
from datavine.scheduler.memory import MemoryPolicy
from datavine.scheduler.placement import PlacementPolicy
from datavine.scheduler.run_messages import (
    CallDone,
    CallWithdrawn,
    Fail,
    Instruction,
    PoolSample,
    Submit,
    Withdraw,
)
from tests.test_run_state import CFG, Pool, of, tree

# --- the table -------------------------------------------------------------------------------


def test_the_table_names_every_phase_and_each_is_reachable_and_can_end() -> None:
    assert set(MOVES) == set(Phase)
    assert all(to <= set(Phase) for to in MOVES.values())
    reached, todo = {Phase.NEW}, [Phase.NEW]
    while todo:
        for to in MOVES[todo.pop()] - reached:
            reached.add(to)
            todo.append(to)
    assert reached == set(Phase)
    ends = {Phase.DONE, Phase.RETRIED, Phase.FAILED_OVER, Phase.WITHDRAWN, Phase.FAILED,
            Phase.ABANDONED}
    assert ends == ENDS
    assert all(MOVES[p] & ENDS for p in set(Phase) - ENDS - {Phase.NEW})


def test_an_illegal_move_is_refused_naming_the_bundle_and_both_phases() -> None:
    life = Lifecycle(start=10.0)
    life.move(3, Phase.SENT, 10.5, keys=["x"], call=7, detail="to any worker")
    life.move(3, Phase.DONE, 11.0)
    with pytest.raises(IllegalMove) as info:
        life.move(3, Phase.RUNNING, 12.0)
    text = str(info.value)
    assert "bundle 3 (tasks 'x') cannot move from done to running" in text
    assert "allowed from done: none: it has ended" in text
    assert "sent -> done" in text  # its story so far
    with pytest.raises(IllegalMove,
                       match=r"from new to withdrawn \(allowed from new: held, sent\)"):
        life.move(4, Phase.WITHDRAWN, 12.0, keys=["y"])
    assert life.phase(3) is Phase.DONE  # a refused move changes nothing


def test_a_story_reads_back_from_the_summary_and_finds_keys_by_repr() -> None:
    life = Lifecycle(start=100.0)
    life.move(0, Phase.SENT, 100.1, keys=[("big", 1)], call=1, detail="to any worker")
    life.move(0, Phase.RUNNING, 100.2, detail="on 10.0.0.1:1")
    life.move(0, Phase.RETRIED, 100.5, reason=Reason.MEMORY, detail="went over 512 MB")
    life.move(1, Phase.HELD, 100.6, keys=[("big", 1)])
    life.move(1, Phase.SENT, 100.7, call=2)
    life.move(1, Phase.DONE, 101.0, detail="on w-1")
    life.note([("big", 1)], 102.0, "its value was lost: run again")
    story = life.story(("big", 1))
    assert [(s.came_from, s.phase) for s in story if s.bundle is not None] == [
        (Phase.NEW, Phase.SENT), (Phase.SENT, Phase.RUNNING), (Phase.RUNNING, Phase.RETRIED),
        (Phase.NEW, Phase.HELD), (Phase.HELD, Phase.SENT), (Phase.SENT, Phase.DONE)]
    lines = [str(s) for s in story]
    assert lines[2] == ("    0.500 s  bundle 0 (call 1) running -> retried [memory overrun]: "
                        "went over 512 MB")
    assert lines[-1].endswith("task ('big', 1): its value was lost: run again")
    back = Lifecycle.from_dict(life.to_dict())
    assert [str(s) for s in back.story(("big", 1))] == lines
    assert [str(s) for s in back.story("('big', 1)")] == lines
    assert [str(s) for s in back.story("bundle 1")] == lines[3:6]
    assert back.story(0) == life.story(0)
    with pytest.raises(KeyError, match="no task or bundle 'nope'"):
        back.story("nope")
    assert not back.key_done(("big", 1))  # lost after it was done


# --- the run state's lifecycle ------------------------------------------------------------------


def test_a_run_tells_the_story_of_a_task_retried_after_an_overrun() -> None:
    cfg = CFG.replace(memory=MemoryPolicy(default_mb=512, floor_mb=256, ceiling_mb=2048))
    pool = Pool({"x": (int, 1)}, ["x"], cfg)
    (first,) = of(Submit, pool.tick())
    pool.step(PoolSample(pool.now, 2, 2, {first.call: "RUNNING"},
                         where={first.call: "10.0.0.1:1"}))
    pool.state.validate()
    pool.finish(first.call, result=BundleResult(Status.MEMORY, peak_mb=700.0, cap_mb=512.0,
                                                worker="w-1", host="a1.box"))
    pool.state.validate()
    (second,) = of(Submit, pool.tick())
    pool.finish(second.call, worker="10.0.0.2:1")
    pool.state.validate()
    story = pool.state.story("x")
    assert [s.phase for s in story] == [Phase.SENT, Phase.RUNNING, Phase.RETRIED, Phase.SENT,
                                        Phase.DONE]
    assert story[1].detail == "on 10.0.0.1:1"
    assert story[2].reason is Reason.MEMORY and "w-1 (a1.box)" in story[2].detail
    assert "next under 1024 MB" in story[2].detail
    assert "cap 1024 MB" in story[3].detail
    assert story[4].detail.startswith("on 10.0.0.2:1")
    pool.state.close()
    summary = pool.state.summarize(1.0, 2, 0, 0)
    assert Lifecycle.from_dict(summary.to_dict()["lifecycle"]).story("x") == story


def test_a_failed_run_names_the_story_of_its_bundle() -> None:
    pool = Pool({"x": (int, 1)}, ["x"], CFG.replace(max_retries=1))
    for _ in range(2):
        (submit,) = of(Submit, pool.tick())
        out = pool.finish(submit.call, result=None)  # its worker died under it
        pool.state.validate()
    (fail,) = of(Fail, out)
    assert isinstance(fail.error, BundleFailedError)
    (note,) = fail.error.__notes__
    assert note.startswith("datavine: the story of bundle 1 (tasks 'x'")
    assert "bundle 0 (call 1) sent -> retried [lost worker]" in note
    assert "bundle 1 (call 2) sent -> failed [lost worker]" in note
    assert pool.state.life.phase(1) is Phase.FAILED


def test_validate_catches_a_state_that_lost_track_of_a_call() -> None:
    pool = Pool({"x": (int, 1), "y": (int, 2)}, ["x", "y"])
    calls = of(Submit, pool.tick())
    pool.state.validate()
    del pool.state.inflight[calls[0].call]
    with pytest.raises(InvariantError, match="bundle 0 is sent but its call 1 is not in flight"):
        pool.state.validate()


def test_the_run_state_refuses_an_event_its_lifecycle_does_not_allow() -> None:
    """A call withdrawn that was never asked to be: not a silent requeue, an error naming
    the bundle and the move."""
    pool = Pool({"x": (int, 1)}, ["x"])
    (submit,) = of(Submit, pool.tick())
    with pytest.raises(IllegalMove, match=r"bundle 0 \(tasks 'x'\) cannot move from sent to "
                                          r"withdrawn"):
        pool.step(CallWithdrawn(submit.call))


def test_withdrawn_and_abandoned_bundles_end_their_stories() -> None:
    pool = Pool({"x": (int, 1), "y": (int, 2)}, ["x", "y"])
    x, y = of(Submit, pool.tick())
    pool.step(PoolSample(pool.now, 2, 2, {x.call: "RUNNING", y.call: "RUNNING"}))
    out = pool.step(PoolSample(pool.now, 2, 2, {x.call: "READY", y.call: "RUNNING"}))
    assert out == [Withdraw(x.call)]
    pool.state.validate()
    pool.out.pop(x.call)
    pool.step(CallWithdrawn(x.call))
    pool.state.validate()
    pool.state.close()  # the run ends with y out
    pool.state.validate()
    phases = [s.phase for s in pool.state.story(x.keys[0])]
    assert phases == [Phase.SENT, Phase.RUNNING, Phase.SENT, Phase.WITHDRAWING, Phase.WITHDRAWN]
    assert pool.state.life.phase(1) is Phase.ABANDONED
    assert [life.bundle for life in pool.state.life.troubled()] == [0, 1]


# --- the property: any order of events --------------------------------------------------------
WORKERS = ("10.0.0.1:1", "10.0.0.2:1")
EXAMPLES = int(os.environ.get("LIFECYCLE_EXAMPLES", "150"))  # 1500 passed once: ~70 s


def reader(path: str) -> int:
    return len(path)


def sum_of(*parts: Any) -> Any:
    return sum(parts[1:], parts[0])


class RandomPool(Pool):
    """A pool whose workers and TaskVine behave as ``data`` draws; the driver's part
    (cancelling a withdrawn call that is not running) is played as execution.py does."""

    def __init__(self, dsk: dict[Any, Any], keys: list[Any], cfg: Any, cores: int,
                 data: st.DataObject) -> None:
        super().__init__(dsk, keys, cfg, cores)
        self.data = data
        self.states: dict[int, str] = {}  # TaskVine's state of each call, as last played

    def step(self, *events: Any) -> list[Instruction]:
        out = super().step(*events)  # validated there
        for ins in of(Submit, out):
            self.states[ins.call] = "READY"
        for ins in of(Withdraw, out):
            if ins.call in self.out and (ins.running or self.states[ins.call] == "READY"):
                self.out.pop(ins.call)
                out += self.step(CallWithdrawn(ins.call))
        return out

    def result(self, call: int, worker: str) -> BundleResult:
        """The call run for real; an input whose temp is gone comes back LOST."""
        ins = self.out[call]
        missing = [name for name, temp in ins.fetch.items() if temp not in self.made]
        if missing:
            key = {n: k for k, n in ins.spec.input_files.items()}[missing[0]]
            return BundleResult(Status.LOST, key=key, message=f"input {missing[0]} is gone")
        cwd = os.getcwd()
        try:
            return replace(super().result(call, worker), peak_mb=10.0)
        finally:
            os.chdir(cwd)

    def outcome(self, call: int) -> Any:
        ins = self.out[call]
        kind = self.data.draw(st.sampled_from(
            ["ok"] * 12 + ["died"] * 2 + ["input", "time", "error"]
            + (["memory"] if self.state.cfg.memory is not None else [])), label="outcome")
        worker = self.data.draw(st.sampled_from(WORKERS), label="worker")
        if kind == "ok":
            return self.result(call, worker), worker
        if kind == "died":
            return None, worker
        return {"input": BundleResult(Status.INPUT, server="xc-a", message="EIO"),
                "time": BundleResult(Status.TIME, key=ins.keys[0], limit_s=5.0,
                                     message="ran past its time limit of 5 s"),
                "error": BundleResult(Status.ERROR, key=ins.keys[0], message="boom"),
                "memory": BundleResult(Status.MEMORY, peak_mb=(ins.cap_mb or 100) * 1.5,
                                       cap_mb=ins.cap_mb)}[kind], worker

    def sample(self) -> list[Instruction]:
        data, calls = self.data, sorted(self.out)
        for call in calls:
            self.states[call] = data.draw(st.sampled_from(["READY", "RUNNING"]), label="state")
        requeued = data.draw(st.sets(st.sampled_from(calls)) if calls else st.just(set()),
                             label="requeued")
        lost = data.draw(st.sets(st.sampled_from(WORKERS), max_size=1), label="lost")
        for temp in [t for t, (w, _) in self.made.items() if w in lost]:
            del self.made[temp]
        gone = data.draw(st.sets(st.just("a0"), max_size=1), label="gone")
        where = {c: data.draw(st.sampled_from(WORKERS)) for c in calls
                 if self.states[c] == "RUNNING"}
        return self.step(PoolSample(self.now, 2, 2, dict(self.states), frozenset(requeued),
                                    frozenset(gone), frozenset(lost), where=where))


def build_run(data: st.DataObject) -> tuple[RandomPool, Any]:
    memory = data.draw(st.booleans(), label="memory")
    files = data.draw(st.booleans(), label="files")
    cfg = CFG.replace(
        max_retries=data.draw(st.integers(1, 4), label="max_retries"),
        memory=MemoryPolicy(default_mb=100, floor_mb=50, ceiling_mb=1600) if memory else None,
        task_time_limit_s=5.0)
    n = data.draw(st.integers(1, 5), label="leaves")
    if files:  # leaves read files on two racks' shards; one worker, in rack A
        dsk: dict[Any, Any] = {("read", i): (reader, f"/store/f{i}.root") for i in range(n)}
        final = graphs.add_merge_tree(dsk, list(dsk), 2, key=lambda d, j: ("add", d, j),
                                      task=lambda keys: (sum_of, *keys))
        cfg = cfg.replace(placement=PlacementPolicy(max_wait_s=2.0, cache_wait_s=0.5),
                          shardmap=ShardMap.from_urls(["root://a:1", "root://b:1"],
                                                      racks=["A", "B"]))
        expected = sum(len(f"/store/f{i}.root") for i in range(n))
    else:
        dsk, final = tree(n, data.draw(st.integers(2, 3), label="fanin"))
        expected = sum(range(n))
    pool = RandomPool(dsk, [final], cfg, data.draw(st.integers(1, 3), label="cores"), data)
    pool.state.learned.topology.announce("a0", "A", 1)
    return pool, (final, expected)



@settings(max_examples=EXAMPLES, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.data())
def test_the_lifecycle_agrees_with_the_run_state_whatever_the_pool_does(
        data: st.DataObject) -> None:
    pool, (final, expected) = build_run(data)
    pool.state.validate()
    failed = False
    for _ in range(data.draw(st.integers(1, 60), label="events")):
        action = data.draw(st.sampled_from(["tick", "tick", "finish", "finish", "sample",
                                            "sample", "unreadable"]), label="action")
        if action == "tick":
            out = pool.tick(data.draw(st.sampled_from([0.1, 0.5, 1.5])),
                            data.draw(st.sampled_from([None, None, 1])))
        elif action == "sample":
            out = pool.sample()
        elif not pool.out:
            continue
        else:
            call = data.draw(st.sampled_from(sorted(pool.out)), label="call")
            if action == "unreadable":
                if data.draw(st.integers(0, 9)):  # rare: it ends the run
                    continue
                pool.out.pop(call)
                out = pool.step(CallDone.received(call, {"status": "ok"}, WORKERS[0], pool.now))
            else:
                result, worker = pool.outcome(call)
                pool.out.pop(call)
                out = pool.step(CallDone(call, result, worker, pool.now,
                                         "" if result else f"worker {worker} died"))
        if of(Fail, out):
            failed = True
            break
    if not failed:  # the pool heals: every call succeeds from now on
        for _ in range(300):
            if pool.state.finished:
                break
            out = pool.tick(0.5)
            for call in sorted(pool.out):
                if call not in pool.out:  # a backup copy cancelled by an earlier result
                    continue
                out += pool.step(CallDone(call, pool.result(call, WORKERS[1]), WORKERS[1],
                                          pool.now))
            failed = bool(of(Fail, out))
            if failed:
                break
        if not failed:
            assert pool.state.finished
            value = pool.state.results()[final]
            assert (value[0] if hasattr(value, "shape") else value) == expected
    for ins in pool.state.close():
        pool.declared.discard(getattr(ins, "temp", -1))
    for life in pool.state.life.bundles.values():
        for step in life.steps:
            event(f"{step.came_from} -> {step.phase}")
    if pool.state.life.notes:
        event("values lost with a worker, made again")
    pool.state.validate()
    assert not pool.state.inflight
    assert all(life.phase in ENDS for life in pool.state.life.bundles.values())
    ended_well = [life for life in pool.state.life.bundles.values()
                  if life.phase is Phase.DONE]
    assert failed or {k for life in ended_well for k in life.keys} == set(pool.state.graph.nodes)



# --- datavine story ---------------------------------------------------------------------------


def a_run_record(tmp_path: Any) -> Any:
    """A ``datavine run --json``-like record of a run where 'x' was retried after its worker
    died, 'y' failed over from a shard, and 'z' failed."""
    import json

    pool = Pool({"x": (int, 1), "y": (int, 2), "z": (int, 3)}, ["x", "y", "z"],
                CFG.replace(max_retries=1), cores=3)
    by_key = {s.keys[0]: s for s in of(Submit, pool.tick())}
    pool.finish(by_key["x"].call, result=None)
    pool.finish(by_key["y"].call, result=BundleResult(Status.INPUT, server="xc-a",
                                                      message="EIO", worker="w-2"))
    for again in of(Submit, pool.tick()):
        pool.finish(again.call)
    (fail,) = of(Fail, pool.finish(by_key["z"].call, result=BundleResult(
        Status.ERROR, key="z", message="ValueError('bad')", worker="w-3")))
    pool.state.close()
    summary = pool.state.summarize(1.0, 3, 0, 0)
    path = tmp_path / "run.json"
    path.write_text(json.dumps({"events": 3, "summary": summary.to_dict()}, default=str))
    return path, fail.error


def test_datavine_story_prints_failed_bundles_first_then_a_task(
        tmp_path: Any, capsys: pytest.CaptureFixture[str]) -> None:
    from datavine.apps import cli

    path, error = a_run_record(tmp_path)
    assert any("sent -> failed [task error]" in n for n in error.__notes__)
    assert cli.main(["story", str(path)]) == 0
    out = capsys.readouterr().out
    assert out.startswith("5 bundles (2 done, 1 failed, 1 failed-over, 1 retried); "
                          "3 did not go straight through")
    titles = [line.split(" ", 2)[2] for line in out.splitlines() if line.startswith("bundle ")]
    assert titles[0] == "('z'): failed [task error]"  # failed first, then in their order
    assert sorted(titles[1:]) == ["('x'): retried [lost worker]",
                                  "('y'): failed-over [input failure]"]
    assert "2 bundles went straight through (--all shows them)" in out
    assert cli.main(["story", str(path), "y"]) == 0
    out = capsys.readouterr().out.splitlines()
    assert out[0] == "story of y:"
    assert "sent -> failed-over [input failure]: input server failed during a read (xc-a: EIO)" \
        in out[2]
    assert "sent -> done: on " in out[-1]
    assert cli.main(["story", str(path), "'y'"]) == 0  # the key as Python writes it
    assert capsys.readouterr().out.splitlines()[1:] == out[1:]


def test_datavine_story_names_what_it_cannot_tell(tmp_path: Any,
                                                  capsys: pytest.CaptureFixture[str]) -> None:
    from datavine.apps import cli

    path, _ = a_run_record(tmp_path)
    assert cli.main(["story", str(path), "nope"]) == 2
    assert "no task or bundle 'nope' in this run (3 tasks, 5 bundles)" in capsys.readouterr().err
    empty = tmp_path / "empty.json"
    empty.write_text('{"summary": {"tasks": 0}}')
    assert cli.main(["story", str(empty)]) == 2
    assert f"{empty} holds no run stories" in capsys.readouterr().err
    assert cli.main(["story", str(tmp_path / "missing.json")]) == 2
    assert "cannot read the run record" in capsys.readouterr().err


# --- on real workers ----------------------------------------------------------------------------


def fail_calibration() -> None:
    raise ValueError("bad calibration file")


@pytest.mark.taskvine
def test_the_cluster_tells_the_last_runs_story_of_a_task(cluster: Any) -> None:
    import operator

    from dask import delayed

    product = delayed(operator.mul)(6, 7, dask_key_name="product")
    total = delayed(operator.add)(product, 1, dask_key_name="total")
    assert total.compute(scheduler=cluster.get) == 43
    story = cluster.story("total")  # results decoded from real workers on the way
    assert story[0].came_from is Phase.NEW and story[-1].phase is Phase.DONE
    assert story[-1].detail.startswith("on ")
    assert cluster.story(story[-1].bundle) == [s for s in story if s.bundle == story[-1].bundle]
    with pytest.raises(ValueError, match="bad calibration") as info:
        delayed(fail_calibration, pure=False)(dask_key_name="calib").compute(
            scheduler=cluster.get)
    assert any("sent -> failed [task error]" in note or "running -> failed [task error]" in note
               for note in info.value.__notes__)
    assert cluster.story("calib")[-1].phase is Phase.FAILED
    with pytest.raises(KeyError, match="no task or bundle 'total'"):
        cluster.story("total")  # the last run is the failed one
