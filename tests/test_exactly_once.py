"""Each task, item and event counted once when a value is made again after a lost worker.

A value kept on a worker that leaves is made again and delivered again (with the consumers
that must be remade too). The results stay right (each merge consumes each value once), but
every count kept per delivery grew past the graph: the run's tasks and progress bar, the
coffea executor's events processed and accumulated, the live view's tasks, events and
files. These tests drive the pure counting (:mod:`datavine.scheduler.once`), the run's state
and loop on a fake port, the coffea progress and the view's fold; the runs with real workers
killed and frozen are in tests/test_event_faults.py.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from datavine.config import RunConfig
from datavine.dashboard import columns as cols
from datavine.dashboard import events as ev
from datavine.dashboard.model import Board
from datavine.manager.execution import GraphRun
from datavine.scheduler import graph as graphs
from datavine.scheduler.once import FirstSeen
from datavine.scheduler.run_messages import CallWithdrawn, Deliver, PoolSample, Submit
from tests.fake_runtime import FakeRuntime
from tests.test_run_state import Pool, of, tree


def test_first_seen_counts_each_key_once() -> None:
    seen: FirstSeen[str] = FirstSeen()
    assert seen.first(["a", "b", "a"]) == ["a", "b"]  # a repeat within one call too
    assert seen.first(["b", "c"]) == ["c"]
    assert seen.count(["a", "d", "d", "e"], size={"d": 10, "e": 5}.__getitem__) == 15
    assert len(seen) == 5 and "d" in seen and "z" not in seen


# --- the run's state and loop -----------------------------------------------------------------
def test_a_value_made_again_is_delivered_again_and_counted_once() -> None:
    dsk, final = tree(4, 4)  # four leaves, one merge that fetches them all
    pool = Pool(dsk, [final], cores=4)
    leaves = of(Submit, pool.tick())
    seen = []
    for n, leaf in enumerate(leaves):
        seen += pool.finish(leaf.call, worker="10.0.0.1:1" if n < 2 else "10.0.0.2:1")
    on_lost = {leaf.keys[0] for leaf in leaves[:2]}
    (merge,) = of(Submit, pool.tick())
    seen += pool.step(PoolSample(pool.now, 1, 1, {merge.call: "READY"},
                                 lost_addr=frozenset({"10.0.0.1:1"})))
    pool.out.pop(merge.call)
    seen += pool.step(CallWithdrawn(merge.call))
    seen += pool.drain(worker="10.0.0.2:1")
    delivered = of(Deliver, seen)
    keys = [k for d in delivered for k in d.keys]
    assert sorted(map(str, keys)) == sorted(map(str, [*dsk, *on_lost]))  # two delivered twice
    assert {k for d in delivered for k in d.again} == on_lost  # ... and said so the 2nd time
    assert not any(d.again for d in delivered[:4])
    summary = pool.state.summary
    assert summary.recomputed == 2
    assert summary.tasks == len(dsk)  # was 7 of 5: each delivery counted
    assert summary.categories["big"].tasks == 4
    assert len(summary.completions) == len(dsk) + 2  # the log keeps every run
    assert "2 tasks made again" in summary.lines()[0]


def losing_a_worker_at_call(call: int) -> tuple[RunConfig, FakeRuntime]:
    """A fake runtime of 2 workers that loses the first at call ``call`` (one task a
    bundle): the values it kept are made again."""
    rt: FakeRuntime

    def lose_one_worker(n: int, spec: dict[str, Any]) -> Any:
        if n == call:
            rt.lose_worker(rt.workers[0])
        return None

    cfg = RunConfig(memory=None, max_bundle_tasks=1, target_bundle_s=1e-6, wait_s=1)
    rt = FakeRuntime(cfg, workers=2, script=lose_one_worker)
    return cfg, rt


def test_the_progress_bar_advances_once_per_task() -> None:
    cfg, rt = losing_a_worker_at_call(10)
    dsk, final = tree(16, 2)
    run = GraphRun(rt, graphs.build(dsk, [final]), cfg)  # type: ignore[arg-type]
    advanced: list[int] = []
    run.progress.advance = advanced.append  # type: ignore[method-assign]
    run.execute()
    assert rt.last_summary.recomputed > 0, rt.last_summary.lines()
    assert sum(advanced) == len(dsk)  # it went past its total: "20/19 tasks" on real workers
    assert rt.last_summary.tasks == len(dsk)


# --- the coffea executor's progress -----------------------------------------------------------
@dataclass(frozen=True)
class Item:
    """A work item as the progress reads it: its entry range."""

    entrystart: int
    entrystop: int


def coffea_graph() -> tuple[dict[Any, Any], list[Item], list[Any], list[Any]]:
    """Four items of 10, 20, 30, 40 events, merged two by two, then the final merge."""
    from datavine.coffea.tasks import merge_partials

    items = [Item(0, 10), Item(10, 30), Item(30, 60), Item(60, 100)]
    keys = [("c-item", "t", i) for i in range(4)]
    merges = [("c-merge", "t", 0, 0), ("c-merge", "t", 0, 1), ("c-merge", "t", 1, 0)]
    graph: dict[Any, Any] = {k: ("run_item", None, items[i], i, None) for i, k in
                             enumerate(keys)}
    graph[merges[0]] = (merge_partials, keys[:2], None)
    graph[merges[1]] = (merge_partials, keys[2:], None)
    graph[merges[2]] = (merge_partials, merges[:2], None)
    return graph, items, keys, merges


def partial(*events: int) -> Any:
    from datavine.coffea.tasks import Partial

    return Partial({"events": sum(events)}, len(events))


def test_coffea_progress_counts_an_item_made_again_once() -> None:
    pytest.importorskip("coffea")
    from datavine.coffea.progress import CallProgress

    graph, items, keys, merges = coffea_graph()
    progress = CallProgress(graph, items, desc="Processing", unit="events", enabled=False,
                            compression=None)
    # items 0 and 1 kept on a worker, merged there; the worker is lost with the merge's
    # value: items 0, 1 and the merge are made again and delivered again
    for key in (keys[0], keys[1], merges[0], keys[2]):
        progress([key], {})
    for key in (keys[0], keys[1], merges[0], keys[3], merges[1]):
        progress([key], {})
    assert (progress.processed, progress.accumulated, progress.items_done) == (100, 100, 4)
    assert progress.line() == ("100 of 100 events processed, 100 accumulated (4 of 4 work "
                               "items)")  # was 130 processed, 130 accumulated, 6 items
    progress([merges[2]], {merges[2]: partial(10, 20, 30, 40)})
    assert progress.finished().value == {"events": 100}


def test_coffea_partial_result_merges_each_item_once_and_says_what_it_holds() -> None:
    pytest.importorskip("coffea")
    from datavine.coffea.progress import CallProgress, disjoint

    graph, items, keys, merges = coffea_graph()
    progress = CallProgress(graph, items, desc="Processing", unit="events", enabled=False,
                            compression=None)
    progress([keys[0], keys[1]], {})  # kept on a worker that is lost before Ctrl-C
    progress([keys[2]], {keys[2]: partial(30)})
    assert progress.held() == {keys[2]}
    assert progress.finished().value == {"events": 30}
    assert "the result holds 1 of them (30 events)" in progress.partial_line()
    # a value and one holding it (never both in the frontier): the larger one is merged
    progress.frontier.update({keys[0]: partial(10), merges[0]: partial(10, 20)})
    assert progress.kept() == [keys[2], merges[0]]
    assert progress.finished().value == {"events": 60}
    covers = {"a": frozenset("1"), "ab": frozenset("12"), "c": frozenset("3"),
              "bc": frozenset("23")}.__getitem__
    assert disjoint(["a", "ab", "c", "bc"], covers) == ["ab", "c"]


# --- the live view --------------------------------------------------------------------------
def test_the_view_counts_a_bundle_made_again_once() -> None:
    board = Board()
    board.apply({"k": "run", "t": 0.0, "run": 1, "tasks": 3, "files": {"f": 2}, "shards": {}})
    for call, again in ((1, 0), (2, 1)):  # the same task (one chunk of f), made again
        board.apply({"k": "sent", "t": call, "call": call, "n": 1, "cap": None, "to": None,
                     "rack": None, "files": ["f"], "ev": 100})
        done: dict[str, Any] = {"k": "done", "t": call + 0.5, "call": call, "n": 1,
                                "status": "ok", "addr": "a:1", "wall": 0.1}
        if again:
            done.update(again=1, again_ev=100)
        board.apply(done)  # type: ignore[arg-type]
    p = cols.progress(board)
    assert (p["tasks_done"], p["events"], p["files_done"]) == (1, 100, 0)  # was 2, 200, 1
    assert p["bundles_done"] == 2  # bundles are runs: both came back


def test_the_sink_says_which_tasks_were_made_again(tmp_path: Path) -> None:
    cfg, rt = losing_a_worker_at_call(10)
    dsk, final = tree(16, 2)
    path = tmp_path / "events.jsonl"
    sink = ev.EventSink(path)
    sink.expect_events({k: 100 for k in dsk if k[0] == "big"})
    GraphRun(rt, graphs.build(dsk, [final]), cfg, sink=sink).execute()  # type: ignore[arg-type]
    sink.close()
    records = list(ev.read_events(path))
    assert rt.last_summary.recomputed > 0
    assert sum(r.get("again", 0) for r in records) == rt.last_summary.recomputed
    p = cols.progress(Board().apply_all(records))
    assert (p["tasks_done"], p["events"]) == (len(dsk), 1600)
