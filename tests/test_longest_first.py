"""Longest reads first (scheduler/longest_first.py): the order bundles go out in."""

from __future__ import annotations

from operator import add

from datavine.config import RunConfig
from datavine.scheduler import graph as graphs
from datavine.scheduler.bundling import CostModel, Planner
from datavine.scheduler.inputs import task_files
from datavine.scheduler.learned import Learned
from datavine.scheduler.longest_first import longest_first, size_classes
from datavine.scheduler.pieces import task_entries
from datavine.scheduler.run_state import RunState


def read(chunk: tuple[str, int, int]) -> int:
    return chunk[2] - chunk[1]


# chunks of two files: each file's last chunk is short (100k-event chunks, 250k events)
CHUNKS = [("/store/a.root", 0, 100_000), ("/store/a.root", 100_000, 200_000),
          ("/store/a.root", 200_000, 250_000), ("/store/b.root", 0, 100_000),
          ("/store/b.root", 100_000, 200_000), ("/store/b.root", 200_000, 250_000)]


def analysis_graph(chunks: list[tuple[str, int, int]]) -> graphs.TaskGraph:
    """A read per chunk, summed pairwise in a tree (as dask.bag or coffea reduce)."""
    dsk: dict[str, object] = {f"read-{i}": (read, c) for i, c in enumerate(chunks)}
    level = [f"read-{i}" for i in range(len(chunks))]
    n = 0
    while len(level) > 1:
        nxt = []
        for j in range(0, len(level) - 1, 2):
            dsk[f"sum-{n}"] = (add, level[j], level[j + 1])
            nxt.append(f"sum-{n}")
            n += 1
        if len(level) % 2:
            nxt.append(level[-1])
        level = nxt
    return graphs.build(dsk, [level[0]])


def reads_in_order(planner: Planner) -> list[str]:
    """The read tasks in the order the planner sends them (every bundle completed at once)."""
    order: list[str] = []
    while not planner.finished:
        bundles = planner.next_bundles(1)
        assert bundles, "the planner stalled"
        for b in bundles:
            order.extend(str(k) for k in b.keys if str(k).startswith("read-"))
            planner.complete(b)
    return order


def test_larger_tasks_take_the_earlier_slots_and_others_keep_theirs() -> None:
    priority = {"r1": 0, "s1": 1, "r2": 2, "r3": 3, "s2": 4}
    out = longest_first(priority, {"r1": 50, "r2": 100, "r3": 100})
    assert out == {"r2": 0, "s1": 1, "r3": 2, "r1": 3, "s2": 4}


def test_equal_sizes_or_none_keep_dasks_order() -> None:
    priority = {"a": 2, "b": 0, "c": 1}
    assert longest_first(priority, {"a": 10, "b": 10, "c": 10}) == priority
    assert longest_first(priority, {}) == priority
    assert longest_first(priority, {"zz-not-in-graph": 5, "a": 1}) == priority


def test_chunks_that_differ_by_an_entry_keep_dasks_order() -> None:
    """A file of 250,000 entries in 3 chunks: 83,333, 83,333 and 83,334. Ordered by that one
    entry, the larger chunks of every file (and, in the scale test, of every pass) went
    first; within SAME_SIZE of each other, sizes are equal."""
    priority = {f"c{i}": i for i in range(6)}
    near = {"c0": 83_333, "c1": 83_333, "c2": 83_334, "c3": 83_333, "c4": 83_333,
            "c5": 83_334}
    assert longest_first(priority, near) == priority
    # a short last chunk is still a size of its own
    short = {"c0": 100_000, "c1": 100_000, "c2": 50_000, "c3": 99_999, "c4": 100_000,
             "c5": 50_000}
    assert longest_first(priority, short) == {"c0": 0, "c1": 1, "c3": 2, "c4": 3,
                                              "c2": 4, "c5": 5}


def test_sizes_are_classed_from_the_largest_down() -> None:
    """A class is the sizes within SAME_SIZE of its largest: 100 and 96 are one, 92 (under
    95) starts the next, with 90; 50 is a class of its own."""
    assert size_classes([92, 100, 50, 96, 90]) == {100: 0, 96: 0, 92: 1, 90: 1, 50: 2}
    assert size_classes([]) == {}


def test_a_tasks_entries_come_from_its_chunk() -> None:
    g = analysis_graph(CHUNKS)
    assert task_entries(g.nodes["read-2"]) == 50_000
    assert task_entries(g.nodes["read-0"]) == 100_000
    assert task_entries(g.nodes["sum-0"]) is None


def test_the_short_chunks_go_last_and_everything_still_runs() -> None:
    g = analysis_graph(CHUNKS)
    sizes = {k: n for k, node in g.nodes.items() if (n := task_entries(node)) is not None}
    files = {k: task_files(n) for k, n in g.nodes.items()}
    planner = Planner(g, files=files.__getitem__, costs=CostModel(), target_s=0.1,
                      max_tasks=64, priority=longest_first(g.priority, sizes))
    order = reads_in_order(planner)
    assert sorted(order) == sorted(f"read-{i}" for i in range(len(CHUNKS)))
    assert set(order[-2:]) == {"read-2", "read-5"}, order  # the two 50k chunks
    # dask's own order sends a file's short chunk before the next file's long ones
    plain = Planner(g, files=files.__getitem__, costs=CostModel(), target_s=0.1, max_tasks=64)
    assert set(reads_in_order(plain)[-2:]) != {"read-2", "read-5"}


def test_a_run_orders_by_size_unless_told_not_to() -> None:
    g = analysis_graph(CHUNKS)
    on = RunState(g, RunConfig(), Learned.fresh(RunConfig()), now=0.0)
    off_cfg = RunConfig(longest_first=False)
    off = RunState(g, off_cfg, Learned.fresh(off_cfg), now=0.0)
    assert set(reads_in_order(on.planner)[-2:]) == {"read-2", "read-5"}
    assert reads_in_order(off.planner) == reads_in_order(
        Planner(g, files=lambda k: task_files(g.nodes[k]), costs=CostModel(), target_s=0.25,
                max_tasks=512))
