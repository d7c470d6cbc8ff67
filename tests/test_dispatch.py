"""The dispatcher: room per slot, delay scheduling towards a busy rack, crashed bundles
anywhere; pure, with the clock passed in."""

from __future__ import annotations

import random
from collections import deque
from dataclasses import dataclass, field
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from datavine.io.shards import NoShardAvailableError, Shard, ShardHealth, ShardMap, logical_name
from datavine.scheduler import graph as graphs
from datavine.scheduler.bundling import Bundle, CostModel, Planner
from datavine.scheduler.dispatch import LOOKAHEAD_FACTOR, Dispatcher, cold_copy_wait
from datavine.scheduler.hit_saving import HitSaving
from datavine.scheduler.placement import Placement, PlacementPolicy, TaskInputs, Tier, decide
from datavine.scheduler.topology import ANYWHERE, Target, Topology


def reader(path: str) -> int:
    return len(path)


def setup(n: int, *, policy: PlacementPolicy | None) -> tuple[Dispatcher, Topology]:
    dsk: dict[Any, Any] = {("read", i): (reader, f"/store/f{i}.root") for i in range(n)}
    graph = graphs.build(dsk, list(dsk))
    from datavine.scheduler.inputs import task_files

    files = {k: task_files(node) for k, node in graph.nodes.items()}
    planner = Planner(graph, files=files.__getitem__, costs=CostModel(), target_s=1.0,
                      max_tasks=1)
    topology = Topology(bundles_per_core=1)
    topology.announce("a0", "A", 1)  # one worker in rack A, none in B
    shardmap = ShardMap.from_urls(["root://a:1", "root://b:1"], racks=["A", "B"])
    return Dispatcher(planner, topology, policy, shardmap, ShardHealth(), 1), topology


def test_fill_uses_only_the_free_room() -> None:
    dispatch, _ = setup(10, policy=None)
    assert len(dispatch.fill(0.0, slots=3, inflight=1)) == 2
    assert dispatch.fill(0.0, slots=3, inflight=3) == []
    assert all(target == ANYWHERE for _, target, _ in dispatch.fill(0.0, slots=8, inflight=0))


def test_a_bundle_for_any_worker_is_counted_on_the_freest_once_one_is_named() -> None:
    """While no bundle sent to a named worker is out, a bundle for any worker goes to any
    worker (TaskVine puts it in a free slot; no count of the manager's is wrong for it).
    Once one is out, it goes to the freest connected worker and is counted there (sent
    anywhere, TaskVine would fill a slot the manager counts free, and the next named bundle
    would wait there behind both); a bundle whose last try crashed still goes anywhere, and
    so does the last one (no bundle follows it that a wrong count would misplace)."""
    dispatch, topology = setup(10, policy=None)
    topology.announce("a1", "A", 1)
    for i, name in enumerate(("a0", "a1")):
        topology.learn(name, "A", f"10.0.0.{i}:9000", ())
    first = dispatch.fill(0.0, slots=2, inflight=0)
    assert [t for _, t, _ in first] == [ANYWHERE, ANYWHERE]
    for _ in first:
        topology.returned(ANYWHERE)
    topology.sent(Target(worker="a0"))  # a bundle near its files, say: a0 is full
    ((_, target, placement),) = dispatch.fill(0.0, slots=2, inflight=1)
    assert target == Target(worker="a1") and placement.tier == Tier.FAR
    topology.returned(target)
    again = dispatch.planner.next_bundles(1)[0]
    dispatch.planner.requeue(again)
    dispatch.anywhere.update(again.keys)
    ((bundle, target, _),) = dispatch.fill(0.0, slots=2, inflight=1)
    assert bundle.keys == again.keys and target == ANYWHERE  # a1 is free: not sent there
    topology.returned(target)
    ((_, target, _),) = dispatch.fill(0.0, slots=2, inflight=1)
    assert target == Target(worker="a1")
    last, _ = setup(1, policy=None)
    last.topology.learn("a0", "A", "10.0.0.0:9000", ())
    last.topology.sent(Target(worker="zz"))  # a named bundle out elsewhere
    assert [t for _, t, _ in last.fill(0.0, slots=2, inflight=1)] == [ANYWHERE]


def test_bundle_for_a_rack_without_room_is_held_then_goes_far() -> None:
    policy = PlacementPolicy(max_wait_s=5.0, cache_wait_s=1.0)
    dispatch, _ = setup(12, policy=policy)
    sent = dispatch.fill(0.0, slots=4, inflight=0)
    racks = {t.rack or t.worker for _, t, _ in sent}
    assert racks <= {"A", "a0", None}  # near rack A, or far for rack B's files (no B worker)
    held = [b.id for b, _ in dispatch.held]
    assert len(held) > 4  # rack A is full: its other files wait (more than the next fill takes)
    later = dispatch.fill(10.0, slots=4, inflight=0)  # past max_wait_s: they go anywhere
    # the bundles held longest go first, anywhere; the rest are still held, in order
    assert [b.id for b, _, _ in later] == held[:4]
    assert all(t == ANYWHERE and p.tier == Tier.FAR and p.anywhere for _, t, p in later), later
    assert [b.id for b, _ in dispatch.held] == held[4:]


def test_crashed_bundle_goes_anywhere() -> None:
    dispatch, _ = setup(2, policy=PlacementPolicy())
    first = dispatch.planner.next_bundles(1)[0]
    dispatch.anywhere.update(first.keys)
    placement, home = dispatch.place(first, now=0.0, since=0.0)
    assert placement.action == "run" and home is None and "anywhere" in placement.reason


def test_a_bundle_goes_to_the_worker_on_its_shards_host() -> None:
    dsk: dict[Any, Any] = {("read", i): (reader, f"/store/f{i}.root") for i in range(8)}
    graph = graphs.build(dsk, list(dsk))
    from datavine.scheduler.inputs import task_files

    files = {k: task_files(node) for k, node in graph.nodes.items()}
    planner = Planner(graph, files=files.__getitem__, costs=CostModel(), target_s=1.0,
                      max_tasks=1)
    topology = Topology(bundles_per_core=4, here="mgr.box")
    topology.see([{"hostname": h, "addrport": f"10.0.0.{i}:9", "cores_total": 1,
                   "features": [f"worker:w-{h}", f"rack:{h[0].upper()}"]}
                  for i, h in enumerate(["a1.box", "a2.box", "b1.box", "b2.box"])])
    shardmap = ShardMap.from_urls(["root://a1.box:1094", "root://B1.box.:1094"],
                                  racks=["A", "B"])
    dispatch = Dispatcher(planner, topology, PlacementPolicy(), shardmap, ShardHealth(), 4)
    sent = dispatch.fill(0.0, slots=4, inflight=0)
    assert len(sent) == 8
    for bundle, target, placement in sent:
        host = shardmap.shard_for(bundle.files[0]).url.split("/")[2].split(":")[0]
        assert target.worker == f"w-{host.lower().rstrip('.')}", (bundle.files, target)
        assert placement.tier.name == "HOST"


def read_by_a0(busy: tuple[str, ...], hit_saving: HitSaving | None = None,
               backlog: Any = None, tasks: int = 1) -> tuple[Dispatcher, Topology]:
    """``tasks`` tasks reading /store/f0.root, a bundle each; workers a0 and a1 in rack A,
    ``busy`` of them full, a0 having read the file (its memory holds the columns);
    ``backlog``: the dispatcher's (how long a worker stays busy)."""
    dsk: dict[Any, Any] = {("read", i): (reader, "/store/f0.root") for i in range(tasks)}
    graph = graphs.build(dsk, list(dsk))
    planner = Planner(graph, files=lambda key: ("/store/f0.root",), costs=CostModel(),
                      target_s=1.0, max_tasks=1)
    topology = Topology(bundles_per_core=1)
    for name in ("a0", "a1"):
        topology.announce(name, "A", 1)
    for name in busy:
        topology.sent(Target(worker=name))
    topology.learn("a0", "A", None, ["/store/f0.root"])
    return Dispatcher(planner, topology, PlacementPolicy(max_wait_s=5.0, cache_wait_s=1.0),
                      ShardMap.from_urls(["root://a:1"], racks=["A"]), ShardHealth(), 1,
                      hit_saving=hit_saving, backlog=backlog), topology


def test_a_bundle_waiting_for_a_reader_that_left_runs_at_once_in_its_rack() -> None:
    """Held for the busy worker that read its file; that worker leaves: the bundle runs on
    the rack's free worker at the next fill, not when its wait for the reader runs out."""
    dispatch, topology = read_by_a0(busy=("a0", "a1"))
    assert dispatch.fill(0.0, slots=4, inflight=2) == []  # held
    topology.returned(Target(worker="a1"))
    assert dispatch.fill(0.1, slots=4, inflight=1) == []  # a1 is free, but a0 read it: wait
    topology.forget("a0")
    ((_, target, placement),) = dispatch.fill(0.2, slots=4, inflight=1)
    assert target == Target(worker="a1") and placement.tier == Tier.RACK


def read_by_a0_saving_40_ms(backlog: Any = None, tasks: int = 1
                            ) -> tuple[Dispatcher, Topology]:
    """``read_by_a0`` with a0 busy and its reading task's costs learned: a hit 10 ms, a
    cold read 50 ms (learned from bundles of one cold read, and of a cold read with 3
    hits)."""
    saving = HitSaving()
    dispatch, topology = read_by_a0(busy=("a0",), hit_saving=saving, backlog=backlog,
                                    tasks=tasks)
    category = dispatch.planner.graph.category(("read", 0))
    for n, seconds in ((1, 0.05), (4, 0.08), (1, 0.05), (4, 0.08)):
        saving.observe(category, n, seconds, decoded=1_000_000, cached=(n - 1) * 1_000_000)
    assert saving.saving_s(category) == pytest.approx(0.04)
    return dispatch, topology


def test_a_bundle_waits_for_the_reader_no_longer_than_a_hit_saves() -> None:
    """Held for the busy worker whose memory holds its columns while another sits free: it
    goes to the free one once it has waited what a hit saves over a cold read (measured),
    not the policy's whole second."""
    dispatch, _ = read_by_a0_saving_40_ms()  # a1 free
    assert dispatch.fill(0.0, slots=2, inflight=1) == []  # held for a0
    assert dispatch.fill(0.03, slots=2, inflight=1) == []  # still worth waiting for
    ((_, target, placement),) = dispatch.fill(0.05, slots=2, inflight=1)
    assert target == Target(worker="a1") and placement.tier == Tier.RACK


def test_a_held_bundle_goes_where_it_would_end_first() -> None:
    """Where the workers' backlogs are known, a bundle held for the busy worker whose
    memory holds its pieces goes at once to a free worker that would end it cold before
    the holder could from memory (the holder busy 200 ms, a cold read 40 ms slower than a
    hit), and waits for a holder that would end it first (busy 20 ms: it ends it at 30 ms,
    the free worker at 50); a holder that runs late loses it once the saving is waited."""
    busy_until = {"a0": 0.2, "a1": 0.0}
    dispatch, _ = read_by_a0_saving_40_ms(lambda w: busy_until[w])
    ((_, target, placement),) = dispatch.fill(0.0, slots=2, inflight=1)
    assert target == Target(worker="a1") and placement.tier == Tier.RACK

    busy_until["a0"] = 0.02
    dispatch, topology = read_by_a0_saving_40_ms(lambda w: busy_until[w])
    assert dispatch.fill(0.0, slots=2, inflight=1) == []
    topology.returned(Target(worker="a0"))
    ((_, target, placement),) = dispatch.fill(0.02, slots=2, inflight=0)
    assert target == Target(worker="a0") and placement.tier == Tier.CACHED

    clock = {"now": 0.0}
    dispatch, _ = read_by_a0_saving_40_ms(
        lambda w: max(0.0, 0.02 - clock["now"]) if w == "a0" else 0.0)
    assert dispatch.fill(0.0, slots=2, inflight=1) == []
    clock["now"] = 0.03  # a0 runs late, the saving not yet waited
    assert dispatch.fill(0.03, slots=2, inflight=1) == []
    clock["now"] = 0.05
    ((_, target, _),) = dispatch.fill(0.05, slots=2, inflight=1)
    assert target == Target(worker="a1")


def test_bundles_held_for_one_worker_queue_behind_each_other() -> None:
    """Two bundles held for the same busy worker (its calls out end in 35 ms): the first
    decided waits for it (it ends there at 45 ms, at 50 on the free worker); the second
    counts the first's hit ahead of it (it would end there at 55 ms) and goes to the free
    worker. Alone, a bundle waits."""
    def busy(w: str) -> float:
        return 0.035 if w == "a0" else 0.0

    alone, _ = read_by_a0_saving_40_ms(busy)
    assert alone.fill(0.0, slots=2, inflight=1) == [] and len(alone.held) == 1
    dispatch, _ = read_by_a0_saving_40_ms(busy, tasks=2)
    ((bundle, target, _),) = dispatch.fill(0.0, slots=2, inflight=1)
    assert target == Target(worker="a1")
    ((waiting, _),) = list(dispatch.held)
    assert {*waiting.keys, *bundle.keys} == {("read", 0), ("read", 1)}


def test_a_held_bundle_waits_for_its_holder_only_when_that_ends_it_first() -> None:
    """``cold_copy_wait`` (pure): no wait where a free worker ends the bundle first; else
    until the holder is expected free, never less than the saving, never past the limit."""
    assert cold_copy_wait(0.2, 0.0, 0.04, 0.0, 1.0) == 0.0
    assert cold_copy_wait(0.2, 0.17, 0.04, 0.0, 1.0) == 0.04  # the free one is busy too
    assert cold_copy_wait(0.01, 0.0, 0.04, 0.0, 1.0) == 0.04  # the saving, at least
    assert cold_copy_wait(0.03, 0.0, 0.04, 0.05, 1.0) == pytest.approx(0.08)
    assert cold_copy_wait(0.03, 0.0, 0.04, 2.0, 1.0) == 1.0


# --- the indexed dispatcher decides as the exhaustive one did ---------------------------------
class Exhaustive:
    """The dispatcher before the indexes (the reference): every held bundle decided again
    at every fill, oldest first, on every near worker (``Topology.near``)."""

    def __init__(self, planner: Planner, topology: Topology, policy: PlacementPolicy,
                 shardmap: ShardMap, health: ShardHealth, bundles_per_slot: int) -> None:
        self.planner, self.topology, self.policy = planner, topology, policy
        self.shardmap, self.health, self.bundles_per_slot = shardmap, health, bundles_per_slot
        self.held: list[tuple[Bundle, float]] = []
        self.last_near: dict[str, float] = {}
        self.anywhere: set[Any] = set()

    def fill(self, now: float, slots: int, inflight: int) -> list[tuple[Bundle, Target,
                                                                     Placement]]:
        slots = max(1, slots)
        room = slots * self.bundles_per_slot - inflight
        if room <= 0:
            return []
        lookahead = LOOKAHEAD_FACTOR * slots * self.bundles_per_slot
        queue, self.held, out = deque(self.held), [], []
        while room > 0:
            if not queue:
                want = min(room, lookahead - len(self.held))
                fresh = self.planner.next_bundles(want) if want > 0 else []
                if not fresh:
                    break
                queue.extend((b, now) for b in fresh)
            bundle, since = queue.popleft()
            placement, home = self.place(bundle, now, since)
            if placement.action == "hold":
                self.held.append((bundle, since))
                continue
            if home is not None and placement.tier > Tier.FAR:
                self.last_near[home] = now
            target = self.topology.target(placement)
            if (target == ANYWHERE and self.topology.named_out and self.planner.n_ready
                    and self.anywhere.isdisjoint(bundle.keys)):
                target = self.freest() or ANYWHERE
            self.topology.sent(target)
            out.append((bundle, target, placement))
            room -= 1
        self.held.extend(queue)
        return out

    def freest(self) -> Target | None:
        """The connected named worker with the most free slots, then the one sent a bundle
        longest ago, then the smallest id, looking at every worker; None when one has no
        name or none has a free slot."""
        workers = list(self.topology.workers.values())
        if any(not w.named for w in workers):
            return None
        last = self.topology._last_sent
        best = min(((-f, last.get(w.id, -1), w.id) for w in workers
                    if w.addrport is not None and (f := self.topology._free(w)) > 0),
                   default=None)
        return Target(worker=best[2]) if best is not None else None

    def place(self, bundle: Bundle, now: float, since: float) -> tuple[Placement, str | None]:
        if not self.anywhere.isdisjoint(bundle.keys):
            return Placement("run", Tier.FAR, reason="its last try crashed: anywhere"), None
        shards: dict[str, Shard | None] = {}
        for f in dict.fromkeys(logical_name(f) for f in bundle.files):
            try:
                shards[f] = self.shardmap.choose(f, self.health, now)
            except NoShardAvailableError:
                shards[f] = None
        task = TaskInputs(tuple(shards), {f: s.rack if s else None for f, s in shards.items()},
                          {f: self.topology.shard_host(s) if s else None
                           for f, s in shards.items()})
        home = task.home_rack()
        waited = now - max(since, self.last_near.get(home, since)) if home else now - since
        return decide(task, self.topology.near(task), waited, self.policy), home


@dataclass
class Side:
    """One dispatcher with its own planner, topology and shard health, and its calls out."""

    dispatch: Any
    planner: Planner
    topology: Topology
    health: ShardHealth
    out: list[tuple[Bundle, Target]] = field(default_factory=list)


@settings(max_examples=80, deadline=None)
@given(seed=st.integers(0, 2**32 - 1))
def test_the_indexed_dispatcher_decides_as_the_exhaustive_one(seed: int) -> None:
    """Workers named or not, in racks or not, joining (connected or only announced),
    leaving, finishing bundles; shards failing; crashed bundles sent anywhere; the clock
    running past the waits: every fill sends the same bundles to the same targets (a bundle
    for any worker to the freest named one), and holds the same ones in the same order."""
    rng = random.Random(seed)
    files = [f"/store/f{i}.root" for i in range(24)]
    reads = {("read", i): tuple(rng.sample(files, rng.choice([1, 1, 1, 2])))
             for i in range(40)}
    keys = list(reads)
    graph = graphs.TaskGraph(dict.fromkeys(keys), {k: frozenset() for k in keys},  # type: ignore[arg-type]
                             {k: set() for k in keys}, {k: i for i, k in enumerate(keys)},
                             set(keys))
    hosts = [f"h{i}.box" for i in range(6)]
    shardmap = ShardMap([Shard(f"root://{rng.choice([*hosts, 'x.box'])}:1094",
                               rng.choice(["A", "B", "C", None]), name=f"s{j}")
                         for j in range(3)])
    policy = PlacementPolicy(max_wait_s=3.0, cache_wait_s=1.0)
    sides = []
    for kind in (Dispatcher, Exhaustive):
        planner = Planner(graph, files=reads.__getitem__, costs=CostModel(), target_s=1.0,
                          max_tasks=1)
        topology, health = Topology(bundles_per_core=1, here="mgr.box"), ShardHealth()
        sides.append(Side(kind(planner, topology, policy, shardmap, health, 1), planner,
                          topology, health))
    workers: dict[str, tuple[bool, str | None, str, str]] = {}  # id -> named, rack, addr, host
    # every worker named (bundles for any worker then go to the freest), or not
    all_named = rng.random() < 0.5

    def join() -> None:
        i = len(workers)
        connects = rng.random() < 0.5
        named, rack = all_named or rng.random() < 0.7, rng.choice(["A", "B", "C", None])
        rack = rack if named else rack or "A"  # one without a name needs a rack
        addr, host, cores = f"10.0.0.{i}:9000", rng.choice(hosts), rng.choice([1, 1, 2])
        wid = f"w{i}" if named else addr
        workers[wid] = (named, rack, addr, host)
        for side in sides:
            if named:
                side.topology.announce(wid, rack, cores, host=host)
                if connects:  # connected now (else when its first result names its address)
                    side.topology.learn(wid, rack, addr, host=host)
            else:
                side.topology.learn(None, rack, addr, host=host)

    for _ in range(rng.randint(2, 9)):
        join()
    now = 0.0
    for _ in range(150):
        event, a = rng.random(), sides[0]
        if event < 0.4:
            cores = sum(w.cores for w in a.topology.workers.values())
            sent = [side.dispatch.fill(now, cores, len(side.out)) for side in sides]
            assert [(b.id, t, p.tier, p.rack) for b, t, p in sent[0]] == [
                (b.id, t, p.tier, p.rack) for b, t, p in sent[1]], (seed, now)
            for side, out in zip(sides, sent, strict=True):
                side.out.extend((b, t) for b, t, _ in out)
            assert [b.id for b, _ in sides[0].dispatch.held] == [
                b.id for b, _ in sides[1].dispatch.held]
        elif event < 0.75 and a.out:  # a bundle finishes where it was sent
            j = rng.randrange(len(a.out))
            target = a.out[j][1]
            ran = ([target.worker] if target.worker else
                   sorted(w for w, spec in workers.items() if spec[1] == target.rack
                          and w in a.topology.workers) if target.rack else
                   sorted(a.topology.workers)) or [None]
            wid = rng.choice(ran)
            for side in sides:
                bundle, _ = side.out.pop(j)
                side.topology.returned(target)
                side.planner.complete(bundle)
                if wid is not None:
                    named, rack, addr, host = workers[wid]
                    side.topology.learn(wid if named else None, rack, addr,
                                        [logical_name(f) for f in bundle.files], host=host)
        elif event < 0.8 and a.out:  # its worker crashed under it: again, anywhere
            j = rng.randrange(len(a.out))
            for side in sides:
                bundle, target = side.out.pop(j)
                side.topology.returned(target)
                side.planner.requeue(bundle)
                side.dispatch.anywhere.update(bundle.keys)
        elif event < 0.86:
            join()
        elif event < 0.9 and a.topology.workers:
            gone = rng.choice(sorted(a.topology.workers))
            for side in sides:
                side.topology.forget(gone)
        elif event < 0.93:
            shard = rng.choice(shardmap.shards)
            for side in sides:
                side.health.mark_failed(shard, now)
        now += rng.choice([0.0, 0.0, 0.2, 0.7, 1.5, 4.0])


def test_what_waits_for_a_worker_is_counted_until_it_is_sent() -> None:
    """``HeldBundles.wait_on``: a held bundle's time on the worker it waits for counts for
    the others (``queued_on``, its own aside) until it waits for another, or for no one,
    or is sent."""
    from datavine.scheduler.held import HeldBundles

    held = HeldBundles()
    first = held.hold(Bundle(0, [("read", 0)], set(), set()), 0.0)
    second = held.hold(Bundle(1, [("read", 1)], set(), set()), 0.0)
    held.wait_on(first, "a0", 0.01)
    held.wait_on(second, "a0", 0.02)
    assert held.queued_on("a0") == pytest.approx(0.03)
    assert held.queued_on("a0", but=second) == pytest.approx(0.01)
    held.wait_on(second, "a1", 0.02)  # decided again: now it waits for a1
    assert held.queued_on("a0") == pytest.approx(0.01)
    assert held.queued_on("a1") == pytest.approx(0.02)
    held.remove(first)  # sent
    held.wait_on(second, None)
    assert held.queued_on("a0") == 0.0 and held.queued_on("a1") == 0.0
    third = held.hold(Bundle(2, [("read", 2)], set(), set()), 0.0)
    for each in (second, third):  # a hit learned at 0 s: they take nothing there
        held.wait_on(each, "a0", 0.0)
    held.wait_on(second, None)
    held.remove(third)
    assert held.queued_on("a0") == 0.0
