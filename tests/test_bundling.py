"""The planner forms bundles that respect dependencies, cover every task once, and size well."""

from __future__ import annotations

import operator
import random
from dataclasses import replace
from typing import Any

from hypothesis import given, settings
from hypothesis import strategies as st

from datavine.scheduler import graph
from datavine.scheduler.bundling import (
    HELD_TOGETHER,
    HOLDER_SCAN,
    SHARE_SPLIT,
    Bundle,
    CostModel,
    Planner,
    bundle_size,
    group_size,
)
from datavine.scheduler.hit_saving import TaskCosts
from datavine.scheduler.run_messages import Submit
from tests.test_run_state import CFG, Pool, of


def random_dag(n: int, seed: int, fan_in: int = 3) -> dict:
    rng = random.Random(seed)
    dsk: dict = {}
    for i in range(n):
        deps = rng.sample(range(i), k=min(i, rng.randint(0, fan_in)))
        dsk[f"t-{i}"] = (sum, [f"t-{d}" for d in deps]) if deps else i
    return dsk


def run_planner(g: graph.TaskGraph, *, slots: int, rng: random.Random,
                files=lambda k: ()) -> list:
    planner = Planner(g, files=files, costs=CostModel(), target_s=0.1, max_tasks=64)
    running, finished = [], []
    taken: set = set()
    while not planner.finished:
        running.extend(planner.next_bundles(slots * 2 - len(running)))
        assert running, "planner stalled with work left"
        taken.update(k for b in running for k in b.keys)
        assert planner.n_ready == sum(  # ready, in no bundle yet
            k not in taken and all(d in planner.done for d in g.dependencies[k]) for k in g.nodes)
        b = running.pop(rng.randrange(len(running)))
        planner.complete(b)
        finished.append(b)
    return finished


@settings(max_examples=60, deadline=None)
@given(n=st.integers(1, 120), seed=st.integers(0, 10_000), slots=st.integers(1, 4))
def test_bundles_cover_each_task_once_in_dependency_order(n: int, seed: int, slots: int) -> None:
    dsk = random_dag(n, seed)
    sinks = [k for k in dsk if not any(k in str(v) for v in dsk.values())] or [f"t-{n - 1}"]
    g = graph.build(dsk, sinks)
    bundles = run_planner(g, slots=slots, rng=random.Random(seed))
    seen: list = [k for b in bundles for k in b.keys]
    assert sorted(map(str, seen)) == sorted(map(str, g.nodes)), "every task exactly once"
    done: set = set()
    for b in bundles:
        inside: set = set()
        for key in b.keys:  # execution order inside a bundle respects dependencies
            assert all(d in done or d in inside for d in g.dependencies[key])
            inside.add(key)
        assert b.inputs <= done
        needed_outside = {k for k in b.keys if k in g.outputs or g.dependents[k] - set(b.keys)}
        assert needed_outside == b.outputs
        done |= inside


def test_reduction_subtrees_fuse_into_few_bundles() -> None:
    leaves = [f"leaf-{i}" for i in range(256)]
    dsk: dict = {k: i for i, k in enumerate(leaves)}
    level = leaves
    depth = 0
    while len(level) > 1:
        nxt = []
        for i in range(0, len(level), 2):
            key = f"add{depth}-{i}"
            dsk[key] = (operator.add, level[i], level[i + 1])
            nxt.append(key)
        level, depth = nxt, depth + 1
    g = graph.build(dsk, [level[0]])
    bundles = run_planner(g, slots=2, rng=random.Random(1))
    assert len(g) == 511
    assert len(bundles) <= 12, [len(b.keys) for b in bundles]
    # the frontier travelling back is tiny compared with the tasks run
    assert sum(len(b.outputs) for b in bundles) <= 24


def test_file_reading_tasks_get_their_own_bundle_with_their_chain() -> None:
    dsk: dict = {}
    for i in range(6):
        dsk[f"read-{i}"] = (str, f"/data/file{i}.root")
        dsk[f"sel-{i}"] = (len, f"read-{i}")
    dsk["total"] = (sum, [f"sel-{i}" for i in range(6)])
    g = graph.build(dsk, ["total"])
    files = {k: ((f"/data/file{k.split('-')[1]}.root",) if k.startswith("read") else ())
             for k in g.nodes}
    bundles = run_planner(g, slots=2, rng=random.Random(0), files=files.__getitem__)
    reading = [b for b in bundles if b.files]
    assert len(reading) == 6
    for b in reading:
        assert len(b.files) == 1
        i = b.files[0][len("/data/file"):-len(".root")]
        assert set(map(str, b.keys)) == {f"read-{i}", f"sel-{i}"}


def test_bundle_size_follows_measured_cost() -> None:
    assert bundle_size(None, 1000, 4, target_s=0.25, max_tasks=512) == 250
    assert bundle_size(0.001, 1000, 4, target_s=0.25, max_tasks=512) == 250
    assert bundle_size(0.001, 10_000, 4, target_s=0.25, max_tasks=512) == 250
    assert bundle_size(0.5, 1000, 4, target_s=0.25, max_tasks=512) == 1
    assert bundle_size(None, 3, 8, target_s=0.25, max_tasks=512) == 1
    assert bundle_size(None, 10**6, 1, target_s=0.25, max_tasks=512) == 512


def test_cost_model_moves_towards_new_measurements() -> None:
    costs = CostModel(alpha=0.5)
    costs.observe("f", 10, 1.0)
    assert costs.estimate("f") == 0.1
    costs.observe("f", 1, 0.3)
    assert abs(costs.estimate("f") - 0.2) < 1e-9
    assert costs.estimate("g") is None


def test_requeued_bundle_runs_again_and_completes() -> None:
    dsk = {"a": 1, "b": (operator.add, "a", 1), "c": (operator.add, "b", 1)}
    g = graph.build(dsk, ["c"])
    planner = Planner(g, files=lambda k: (), costs=CostModel(), target_s=0.1, max_tasks=8)
    first = planner.next_bundles(1)
    assert first and planner.next_bundles(1) == []
    planner.requeue(first[0])
    again = planner.next_bundles(1)
    assert again and set(again[0].keys) == set(first[0].keys)
    planner.complete(again[0])
    assert planner.finished


def held_planner(holders: dict[int, str | None], cost_s: float | None = 0.01,
                 target_s: float = 0.04, n: int = 12) -> Planner:
    """``n`` chunk tasks, each reading a piece of its own file, merged by one sum;
    ``holders``: the worker whose cache holds chunk i's piece (None: no one's)."""
    dsk: dict = {("chunk", i): (str, f"/data/f{i}.root") for i in range(n)}
    dsk["total"] = (sum, [("chunk", i) for i in range(n)])
    g = graph.build(dsk, ["total"])
    files = {k: ((f"/data/f{k[1]}.root",) if isinstance(k, tuple) else ()) for k in g.nodes}
    costs = CostModel()
    if cost_s is not None:
        costs.observe(g.category(("chunk", 0)), 1, cost_s)
    return Planner(g, files=files.__getitem__, costs=costs, target_s=target_s, max_tasks=64,
                   holder=lambda k: holders.get(k[1]) if isinstance(k, tuple) else None)


def chunks_of(bundles: list) -> list[list[int]]:
    return [[k[1] for k in b.keys if isinstance(k, tuple)] for b in bundles]


def test_file_tasks_held_by_one_worker_go_together_up_to_the_bundle_size() -> None:
    holders = {i: ("w1" if i % 2 == 0 else "w2") for i in range(10)}  # 10, 11: no one's
    planner, bundles = held_planner(holders, target_s=0.035), []
    while formed := planner.next_bundles(4):  # 4 at a time: a pass's first bundles
        bundles += formed
    chunks = chunks_of(bundles)
    assert sorted(i for c in chunks for i in c) == list(range(12))  # each chunk once
    for c in chunks:
        assert len({holders.get(i) for i in c}) == 1  # one holder per bundle
        assert len(c) <= 3  # target 0.035 s of 0.01 s tasks
        if holders.get(c[0]) is None:
            assert len(c) == 1  # a task no one holds is a seed of its own
    assert max(len(c) for c in chunks) == 3
    for b, c in zip(bundles, chunks, strict=True):  # the bundle names every file it reads
        assert len(b.files) == len(c)


def test_held_tasks_go_together_by_at_most_held_together() -> None:
    n = 3 * HELD_TOGETHER
    bundles = held_planner({i: "w1" for i in range(n)}, target_s=1.0, n=n).next_bundles(1)
    assert [len(c) for c in chunks_of(bundles)] == [HELD_TOGETHER]


def test_held_tasks_go_together_only_as_far_as_the_ready_ones_fill_every_core() -> None:
    """At a run's end the calls get smaller, down to single chunks: no core waits behind
    another's long call."""
    planner = held_planner({i: "w1" for i in range(12)}, target_s=1.0)
    sizes = []
    while formed := planner.next_bundles(1, cores=4):
        sizes += [len(c) for c in chunks_of(formed) if c]
    assert sizes[0] == 2  # ceil(12 ready / (2 x 4 cores)), not the 12 the target would take
    assert sizes == sorted(sizes, reverse=True) and sizes[-3:] == [1, 1, 1]
    assert sum(sizes) == 12


@given(st.integers(1, 100), st.integers(0, 1000), st.integers(0, 64))
def test_group_size(size: int, n_ready: int, cores: int) -> None:
    got = group_size(size, n_ready, cores)
    assert 1 <= got <= max(1, min(size, HELD_TOGETHER))
    # a part of the ready tasks' share of a core (factoring)
    assert got == 1 or got <= -(-n_ready // (SHARE_SPLIT * max(1, cores)))


def test_the_ready_count_leaves_out_tasks_taken_out_of_order() -> None:
    """Held tasks grouped with a seed leave their heap entries behind: the count of ready
    tasks (what sizes the last calls, and lets backup copies start) does not count them."""
    planner = held_planner({i: ("w1" if i % 3 == 0 else None) for i in range(12)},
                           target_s=1.0)
    (first,) = planner.next_bundles(1, cores=1)
    assert sorted(chunks_of([first])[0]) == [0, 3, 6, 9]
    assert planner.n_ready == 8


def test_without_a_known_cost_or_a_holder_each_file_task_is_a_bundle() -> None:
    for holders, cost in (({i: "w1" for i in range(12)}, None), ({}, 0.01)):
        bundles = held_planner(holders, cost).next_bundles(12)
        assert all(len(c) == 1 for c in chunks_of(bundles))


def ordered_planner(held: dict[int, str]) -> Planner:
    """6 chunk tasks in order (chunk i the i-th), each reading a piece (an entry range) of a
    file of its own, and a sum of them; ``held``: the worker whose cache holds chunk i's
    piece (the dict may change: the planner asks it at each look)."""
    dsk: dict = {("chunk", i): (str, f"/data/f{i}.root") for i in range(6)}
    dsk["total"] = (sum, [("chunk", i) for i in range(6)])
    g = graph.build(dsk, ["total"])
    files = {k: ((f"/data/f{k[1]}.root",) if isinstance(k, tuple) else ()) for k in g.nodes}
    pieces = {k: ((f"/data/f{k[1]}.root@0-10",) if isinstance(k, tuple) else ()) for k in g.nodes}
    order = {k: (k[1] if isinstance(k, tuple) else 6) for k in g.nodes}  # chunk i i-th
    return Planner(g, files=files.__getitem__, costs=CostModel(), target_s=1.0, max_tasks=64,
                   priority=order,
                   cached_on=lambda k: held.get(k[1]) if isinstance(k, tuple) else None,
                   pieces=pieces.__getitem__)


def order_of(planner: Planner) -> list[int]:
    out: list[int] = []
    while formed := planner.next_bundles(1):
        out += [i for c in chunks_of(formed) for i in c]
        planner.complete(formed[0])
    return out


def test_ready_tasks_a_cache_holds_go_before_those_no_cache_holds() -> None:
    """The first ready task in order reads a piece no worker's cache holds while chunks 3
    and 5's pieces are held: they go first (a cache may drop them as the reads in order
    fill it), then the order resumes. Nothing held: the order as it is."""
    assert order_of(ordered_planner({})) == [0, 1, 2, 3, 4, 5]
    assert order_of(ordered_planner({3: "w1", 5: "w2"})) == [3, 5, 0, 1, 2, 4]
    assert order_of(ordered_planner({i: "w1" for i in range(6)})) == [0, 1, 2, 3, 4, 5]


def test_a_piece_newly_held_draws_its_ready_readers_ahead() -> None:
    """note_held: a piece a cache now holds (a result said so, or a call reading it was sent
    to that worker) brings the ready tasks reading it before the tasks no cache holds."""
    held: dict[int, str] = {}
    planner = ordered_planner(held)
    (first,) = planner.next_bundles(1)
    assert chunks_of([first]) == [[0]]
    held[4] = "w1"
    planner.note_held(["/data/f4.root@0-10", "/data/elsewhere.root@0-10"])
    assert order_of(planner) == [4, 1, 2, 3, 5]


def test_held_tasks_found_deep_in_the_ready_heap_go_together() -> None:
    """Held first (a later pass over cached files): the first HOLDER_SCAN and more ready
    tasks in order read pieces no cache holds, the held ones come after them. The call a
    held task starts takes the other tasks its worker holds, found among the held ones."""
    n_cold, n_held = HOLDER_SCAN + 44, 8
    n = n_cold + n_held
    dsk: dict = {("chunk", i): (str, f"/data/f{i}.root") for i in range(n)}
    dsk["total"] = (sum, [("chunk", i) for i in range(n)])
    g = graph.build(dsk, ["total"])
    files = {k: ((f"/data/f{k[1]}.root",) if isinstance(k, tuple) else ()) for k in g.nodes}
    pieces = {k: ((f"/data/f{k[1]}.root@0-10",) if isinstance(k, tuple) else ()) for k in g.nodes}
    order = {k: (k[1] if isinstance(k, tuple) else n) for k in g.nodes}
    costs = CostModel()
    costs.observe(g.category(("chunk", 0)), 1, 0.01)

    def held(k: Any) -> str | None:
        return "w1" if isinstance(k, tuple) and k[1] >= n_cold else None

    planner = Planner(g, files=files.__getitem__, costs=costs, target_s=1.0, max_tasks=64,
                      priority=order, holder=held, cached_on=held, pieces=pieces.__getitem__)
    (first,) = planner.next_bundles(1)
    assert sorted(chunks_of([first])[0]) == list(range(n_cold, n))  # one call


def merge_planner(merge_cost: float | None, light: Any = None,
                  max_tasks: int = 64) -> tuple[graph.TaskGraph, Planner]:
    """Four file reads; a merge of the first two, ready (both done) and first in line."""
    dsk: dict = {f"read-{i}": (str, f"/data/f{i}.root") for i in range(4)}
    dsk["merge"] = (operator.add, "read-0", "read-1")
    dsk["total"] = (list, ["merge", "read-2", "read-3"])
    g = graph.build(dsk, ["total"])
    costs = CostModel()
    if merge_cost is not None:
        costs.observe(g.category("merge"), 1, merge_cost)
    priority = {"merge": 0, "read-0": 1, "read-1": 2, "read-2": 3, "read-3": 4, "total": 5}
    planner = Planner(g, files=lambda k: (f"/data/f{k[-1]}.root",) if k.startswith("read")
                      else (), costs=costs, target_s=0.1, max_tasks=max_tasks,
                      priority=priority, light=light)
    for b in planner.next_bundles(2):
        assert b.keys == [f"read-{b.files[0][-6]}"]
        planner.complete(b)
    return g, planner


def test_a_cheap_merge_goes_in_the_next_file_tasks_call() -> None:
    """A merge sent alone would take a slot of a worker's queue: the file task behind it
    would not be there to be read ahead. Cheap (or not measured yet), it goes with it."""
    for cost in (None, 0.005):
        _, planner = merge_planner(cost)
        (b,) = planner.next_bundles(1)
        assert set(b.keys) == {"merge", "read-2"}
        assert b.files == ("/data/f2.root",)  # placed by the file it reads
        assert b.inputs == {"read-0", "read-1"}
        assert b.outputs == {"merge", "read-2"}
        planner.complete(b)
        (last,) = planner.next_bundles(1)
        assert last.keys == ["read-3", "total"]  # the rest as before


def test_a_costly_merge_goes_alone() -> None:
    _, planner = merge_planner(0.05)  # half the bundle target: it would hold the read back
    (b,) = planner.next_bundles(1)
    assert b.keys == ["merge"]
    assert b.files == ()
    assert [x.keys for x in planner.next_bundles(2)] == [["read-2"], ["read-3"]]


def test_a_merge_of_large_inputs_goes_alone() -> None:
    """A file task's call runs under its memory cap: a merge whose inputs stayed on
    workers (large values) is not carried in it."""
    for light, carried in ((lambda key: True, True), (lambda key: False, False)):
        _, planner = merge_planner(None, light)
        (b,) = planner.next_bundles(1)
        assert (set(b.keys) == {"merge", "read-2"}) is carried


def test_a_merge_is_carried_only_within_the_bundle_limit() -> None:
    _, planner = merge_planner(None, max_tasks=1)
    assert [b.keys for b in planner.next_bundles(3)] == [["merge"], ["read-2"], ["read-3"]]


def payload(path: str, nbytes: int) -> bytes:
    return path.encode().ljust(nbytes, b".")


def sizes(parts: list) -> int:
    return sum(len(p) for p in parts)


def test_the_run_carries_a_merge_whose_inputs_came_back_and_not_one_whose_stayed() -> None:
    """Small values come back to the manager: a merge of them is light, and rides in the
    next read's call. Large ones stay on the workers that made them: a merge of those goes
    alone (a file task's call runs under the file task's memory cap)."""
    for nbytes, carried in ((100, True), (4 * CFG.inline_max_bytes, False)):
        dsk: dict = {("read", i): (payload, f"/data/f{i}.root", nbytes) for i in range(6)}
        dsk["merge"] = (operator.add, ("read", 0), ("read", 1))
        dsk["total"] = (sizes, ["merge", *[("read", i) for i in range(2, 6)]])
        pool = Pool(dsk, ["total"], replace(CFG, max_bundle_tasks=8), cores=2)
        sent: list[list] = []
        while not pool.state.finished:
            for ins in of(Submit, pool.tick()):
                sent.append(list(ins.keys))
            for call in list(pool.out):
                pool.finish(call)
        assert pool.state.results() == {"total": 6 * nbytes}
        assert sent[:2] in ([[("read", 1)], [("read", 0)]], [[("read", 0)], [("read", 1)]])
        merged = next(keys for keys in sent if "merge" in keys)
        assert (len(merged) == 2) is carried, sent  # with a read beside it, or alone


def chunks_planner(passes: int, chunks: int = 1, costs: TaskCosts | None = None,
                   target_s: float = 1.0, files: int = 2, cost_s: float | None = 0.05,
                   cores: int = 1, merge_first: bool = False) -> Planner:
    """``files`` files of ``chunks`` chunks, each chunk read by ``passes`` tasks
    (``("chunk", pass, file, chunk)``: the scale test's passes), merged by one sum; the pieces
    are held by no worker yet. ``cost_s``: a task's measured time (None: not yet); ``costs``:
    a task's time from memory and from its file, as learned (None: not yet)."""
    dsk: dict = {("chunk", p, f, c): (str, f"/data/f{f}.root#{c}") for p in range(passes)
                 for f in range(files) for c in range(chunks)}
    if merge_first:  # a merge ready before every read (a pass's tree, measured cheap)
        dsk["start"] = (list,)
    dsk["total"] = (sum, list(dsk))
    g = graph.build(dsk, ["total"])
    reads = {k: ((f"/data/f{k[2]}.root",) if isinstance(k, tuple) else ()) for k in g.nodes}
    pieces = {k: ((f"/data/f{k[2]}.root@{k[3]}",) if isinstance(k, tuple) else ())
              for k in g.nodes}
    model = CostModel()
    if cost_s is not None:
        model.observe(g.category(("chunk", 0, 0, 0)), 1, cost_s)
    # pass-major order, as the scale test's priority: every file's first pass first
    priority = {k: ((k[1] * files + k[2]) * chunks + k[3] if isinstance(k, tuple) else 10**6)
                for k in g.nodes}
    if merge_first:
        priority["start"] = -1
        model.observe(g.category("start"), 1, 1e-5)
    planner = Planner(g, files=reads.__getitem__, costs=model, target_s=target_s, max_tasks=64,
                      priority=priority, holder=lambda k: None, cached_on=lambda k: None,
                      pieces=pieces.__getitem__, task_costs=lambda category: costs)
    planner._cores = cores
    return planner


def test_tasks_reading_the_same_pieces_go_in_one_call_behind_the_first() -> None:
    """A file's later passes go in the call of its first read: they read from the memory it
    fills, and a call of their own would cost a hand-over and wait for that worker."""
    planner = chunks_planner(passes=4, files=4, cost_s=0.01)
    bundles = planner.next_bundles(2, cores=1)
    files_of = [{k[2] for k in b.keys if isinstance(k, tuple)} for b in bundles]
    assert files_of == [{0}, {1}]  # one file each: the same pieces, not the order's next
    assert [sorted(k[1] for k in b.keys if isinstance(k, tuple)) for b in bundles] == [
        [0, 1, 2, 3], [0, 1, 2, 3]]  # every pass of the file, once


def test_a_file_task_behind_a_merge_it_carries_takes_its_pieces_readers_too() -> None:
    """The merge carried in front of a file task does not make the call a merge's: the file
    task still takes its pieces' other readers (before, its 3 later passes went as a call of
    their own, a hand-over more: ~5-11 calls a run of the default scale test)."""
    planner = chunks_planner(passes=4, files=2, costs=TaskCosts(0.01, 0.1), merge_first=True)
    first = planner.next_bundles(1, cores=1)[0]
    assert first.keys[0] == "start"
    assert chunk_groups(first) == [(0, 0, p) for p in range(4)]


def test_tasks_reading_the_same_pieces_go_together_only_with_a_measured_cost() -> None:
    planner = chunks_planner(passes=4, files=2, cost_s=None)
    assert [len(b.keys) for b in planner.next_bundles(2, cores=1)] == [1, 1]


def chunk_groups(bundle: Bundle) -> list[tuple[int, int, int]]:
    """(file, chunk, pass) of each task the bundle reads with, in order."""
    return sorted((k[2], k[3], k[1]) for k in bundle.keys if isinstance(k, tuple))


def test_a_files_chunks_go_in_one_call_once_their_costs_are_known() -> None:
    """Known costs: a cold read 100 ms, a hit 10 ms. A chunk's 4 passes cost 130 ms; the
    target (300 ms) takes two chunks' passes, whole, in the first call, the file's third
    chunk's in the next; each task once."""
    planner = chunks_planner(passes=4, chunks=3, costs=TaskCosts(0.01, 0.1), target_s=0.3)
    first, second = planner.next_bundles(2)
    assert chunk_groups(first) == [(0, c, p) for c in (0, 1) for p in range(4)]
    assert chunk_groups(second) == [(0, 2, p) for p in range(4)]


def test_a_files_chunks_go_apart_while_their_costs_are_unknown() -> None:
    planner = chunks_planner(passes=4, chunks=3, costs=None, target_s=0.3)
    assert [{(f, c) for f, c, _ in chunk_groups(b)} for b in planner.next_bundles(3)] == [
        {(0, 0)}, {(0, 1)}, {(0, 2)}]


@settings(max_examples=40, deadline=None)
@given(passes=st.integers(1, 8), chunks=st.integers(1, 4), files=st.integers(1, 3),
       cores=st.integers(1, 4), hit_ms=st.integers(1, 50), cold_ms=st.integers(1, 200),
       target_ms=st.integers(10, 500))
def test_calls_of_a_files_chunks_take_each_task_once(passes: int, chunks: int, files: int,
                                                      cores: int, hit_ms: int, cold_ms: int,
                                                      target_ms: int) -> None:
    """However the costs and the caps cut a file's chunks and passes into calls, every
    task goes out exactly once."""
    planner = chunks_planner(passes, chunks, TaskCosts(hit_ms / 1e3, cold_ms / 1e3),
                             target_s=target_ms / 1e3, files=files)
    sent: list = []
    while not planner.finished:
        bundles = planner.next_bundles(cores, cores)
        assert bundles
        for b in bundles:
            sent.extend(b.keys)
            planner.complete(b)
    assert sorted(map(str, sent)) == sorted(map(str, planner.graph.nodes))


def test_a_files_chunks_go_together_only_within_the_bundle_limit() -> None:
    """``max_bundle_tasks`` bounds a call however cheap its tasks are known to be."""
    planner = chunks_planner(passes=4, chunks=3, costs=TaskCosts(0.001, 0.002), target_s=1.0)
    planner._max_tasks = 3
    assert [len(b.keys) for b in planner.next_bundles(2)] == [3, 3]
