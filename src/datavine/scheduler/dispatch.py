"""Pure dispatch: which bundles go out now, and where. The clock is an argument; no I/O.

Each time slots are free, :meth:`Dispatcher.fill` takes held bundles first, then fresh ones
from the planner (:mod:`datavine.scheduler.bundling`), and decides each one's placement
(:func:`datavine.scheduler.placement.decide`) from where its files' shards are now (a failed
shard's next in line, :mod:`datavine.io.shards`: its rack and its host) and the free slots,
hosts and files read of the few workers that can take it
(:meth:`datavine.scheduler.topology.Topology.candidates`). As in Spark's delay scheduling, a
bundle that waits for a busy rack is held, counting its wait from the later of its arrival
and the last time its rack got a near bundle; the look-ahead past held bundles is bounded,
so other racks stay busy. Held bundles are looked at again oldest first, and only those
whose decision may have changed (:mod:`datavine.scheduler.held`): the others would be held
again. A bundle whose last try crashed goes anywhere. The run loop
(:mod:`datavine.manager.execution`) and the facility model (:mod:`datavine.apps.sim`) both
dispatch through this class.
"""

from __future__ import annotations

import dataclasses
from collections import deque
from collections.abc import Callable, Hashable

from datavine.io.shards import NoShardAvailableError, Shard, ShardHealth, ShardMap, logical_name
from datavine.scheduler.bundling import Bundle, Planner
from datavine.scheduler.held import Held, HeldBundles
from datavine.scheduler.hit_saving import HitSaving
from datavine.scheduler.pieces import PiecesOf
from datavine.scheduler.placement import (
    Placement,
    PlacementPolicy,
    TaskInputs,
    Tier,
    WorkerView,
    decide,
    score,
)
from datavine.scheduler.topology import ANYWHERE, Target, Topology
from datavine.scheduler.worker_index import FILE

Key = Hashable
LOOKAHEAD_FACTOR = 4  # bundles considered per free slot when the first ones must wait
EARLY_S = 1e-6  # a held bundle is due this much before its wait runs out (float rounding)


def cold_copy_wait(holder_s: float, free_s: float, saving_s: float, waited_s: float,
                   limit_s: float) -> float:
    """How long a bundle held for the busy worker whose memory holds its pieces waits for it
    (pure; seconds since its wait began): the holder is busy ``holder_s`` more, a worker
    with a free slot ``free_s``, and a read from memory saves ``saving_s``. Where the free
    worker would end it cold before the holder could from memory (``holder_s - free_s >
    saving_s``), not at all; else until the holder is expected free, at least the saving
    (the old bound: an estimate that runs late still ends in a cold read), at most
    ``limit_s``."""
    if holder_s - free_s > saving_s:
        return 0.0
    return min(limit_s, max(saving_s, waited_s + holder_s - free_s))


class Dispatcher:
    """Held bundles, racks' last near dispatch, and tasks to place anywhere, for one run.

    ``held`` iterates as ``(bundle, since)``, oldest first; ``newly_held`` are the bundles
    the last fill held for the first time.
    """

    def __init__(self, planner: Planner, topology: Topology, policy: PlacementPolicy | None,
                 shardmap: ShardMap | None, health: ShardHealth, bundles_per_slot: int,
                 pieces_of: PiecesOf | None = None, hit_saving: HitSaving | None = None,
                 pieces_only: bool = False,
                 backlog: Callable[[str], float | None] | None = None) -> None:
        """``hit_saving``: what a read from memory saves per category, the longest a held
        bundle waits for the worker that holds its pieces (None: ``policy``'s wait).
        ``backlog``: how long a worker is expected to stay busy with the calls it has
        (None: not known); with it, a held bundle goes at once to a free worker that would
        end it, read cold, before its holder could end it from memory, and waits on for a
        holder that would end it first (:meth:`_policy_for`).
        ``pieces_only``: the workers keep column caches; a worker near a bundle's data
        through its cache holds the bundle's pieces, not only their files
        (:class:`~datavine.scheduler.placement.TaskInputs`)."""
        self.planner = planner
        self.hit_saving = hit_saving
        self.pieces_only = pieces_only
        self.backlog = backlog
        self.topology = topology
        self.policy = policy
        self.shardmap = shardmap
        self.health = health
        self.bundles_per_slot = bundles_per_slot
        # each task's pieces, found once (the run's, shared with its planner)
        self.pieces_of = pieces_of if pieces_of is not None else PiecesOf(planner.graph.nodes)
        self.held = HeldBundles()
        self.newly_held: list[Bundle] = []
        self.last_near: dict[str, float] = {}  # rack -> when it last got a near bundle
        self.anywhere: set[Key] = set()  # tasks whose last try crashed: placed anywhere next
        self.decisions = 0
        self._gains_read = topology.gains.end
        self._state: tuple[object, ...] = ()  # what every decision depends on (_catch_up)

    def fill(self, now: float, slots: int, inflight: int) -> list[tuple[Bundle, Target,
                                                                     Placement]]:
        """Bundles to send now to fill ``slots`` x ``bundles_per_slot`` with ``inflight``
        already out: (bundle, target, placement) each; the targets are counted as sent."""
        self._catch_up(now)
        self.newly_held = []
        slots = max(1, slots)
        room = slots * self.bundles_per_slot - inflight
        if room <= 0:
            return []
        lookahead = LOOKAHEAD_FACTOR * slots * self.bundles_per_slot
        fresh: deque[Bundle] = deque()
        out = []
        while room > 0:
            held = self.held.next(self.topology.has_room)
            if held is not None:
                bundle, since = held.bundle, held.since
            else:
                if not fresh:
                    want = min(room, lookahead - len(self.held))
                    fresh.extend(self.planner.next_bundles(want, slots) if want > 0 else ())
                    if not fresh:
                        break
                bundle, since = fresh.popleft(), now
            placement, home, task, waits_on = self._place(bundle, now, since, held)
            self.decisions += 1
            if placement.action == "hold":
                assert task is not None  # only a decision on its inputs holds
                if held is None:
                    held = self.held.hold(bundle, since)
                    held.task, held.home, held.built = task, home, self._state[:2]
                    self.newly_held.append(bundle)
                holder, seconds = waits_on or (None, 0.0)
                self.held.wait_on(held, holder, seconds)
                self.held.decided(held, self.topology.wake_keys(task, placement.tier),
                                  now + placement.retry_after_s - EARLY_S,
                                  self._wait_start(since, home))
                continue
            if held is not None:
                self.held.remove(held)
            if home is not None and placement.tier > Tier.FAR:
                self.last_near[home] = now
            target = self.topology.target(placement)
            if (target == ANYWHERE and self.topology.named_out and self.planner.n_ready
                    and self.anywhere.isdisjoint(bundle.keys)):
                # named to the freest worker, so that it counts where it runs while named
                # bundles are out; the last goes anywhere: TaskVine, which sees a slot free
                # before the manager takes the result that freed it, puts it there at once
                target = self.topology.freest() or ANYWHERE
            self.topology.sent(target)
            out.append((bundle, target, placement))
            room -= 1
        for bundle in fresh:  # taken from the planner, not decided: next time
            self.held.due(self.held.hold(bundle, now))
            self.newly_held.append(bundle)
        return out

    def _catch_up(self, now: float) -> None:
        """Tell the held bundles what changed since the last fill: room gained (wakes the
        bundles watching there), waits run out, or a change every decision depends on (a
        worker left or changed, a shard failed or came back, a crash sent tasks anywhere,
        slots per core): then all are due."""
        topology = self.topology
        gains = topology.gains.since(self._gains_read)
        self._gains_read = topology.gains.end
        failed = tuple(self.health.failed(now)) if self.shardmap is not None else ()
        state = (topology.epoch, failed, topology.bundles_per_core, len(self.anywhere))
        if gains:  # pieces now held somewhere: the ready tasks reading them go first
            self.planner.note_held(name for kind, name in gains if kind == FILE)
        if gains is None or state != self._state:
            self._state = state
            self.held.all_due()
        elif gains:
            self.held.wake(gains)
        self.held.expire(now, lambda held: self._wait_start(held.since, held.home))

    def bundle_pieces(self, bundle: Bundle) -> tuple[str, ...]:
        """The pieces (entry ranges, which workers' column caches hold) ``bundle``'s tasks
        read, without duplicates."""
        pieces_of = self.pieces_of
        return tuple(dict.fromkeys(p for k in bundle.keys for p in pieces_of(k)))

    def place(self, bundle: Bundle, now: float, since: float) -> tuple[Placement, str | None]:
        """Where ``bundle`` goes, and the rack holding its files."""
        placement, home, _, _ = self._place(bundle, now, since, None)
        return placement, home

    def _place(self, bundle: Bundle, now: float, since: float, held: Held | None
               ) -> tuple[Placement, str | None, TaskInputs | None, tuple[str, float] | None]:
        """The decision for ``bundle``, its home rack, its inputs, and the busy worker
        holding its pieces that it would wait for with what it would take there (None:
        none)."""
        if not bundle.files or self.policy is None:
            return (Placement("run", Tier.FAR, reason="no input files, or placement is off"),
                    None, None, None)
        if not self.anywhere.isdisjoint(bundle.keys):
            return (Placement("run", Tier.FAR, reason="its last try crashed: anywhere"), None,
                    None, None)
        task, home = self._inputs(bundle, now, held)
        waited = now - self._wait_start(since, home)
        candidates = self.topology.candidates(task)
        policy, waits_on = self._policy_for(bundle, self.policy, task, candidates, waited,
                                            held)
        return decide(task, candidates, waited, policy), home, task, waits_on

    def _policy_for(self, bundle: Bundle, policy: PlacementPolicy, task: TaskInputs,
                    candidates: list[WorkerView], waited: float, held: Held | None = None,
                    ) -> tuple[PlacementPolicy, tuple[str, float] | None]:
        """``policy``, its wait for a worker holding the pieces bounded by what a hit saves
        for the bundle's reading tasks: held longer, the bundle would have been read cold
        elsewhere sooner (a run's end, one worker holding the last pieces, the others idle).
        Where the workers' backlogs are known, the bundle goes where it would end first
        (:func:`cold_copy_wait`); the second value names the holder it then waits for, and
        what it will take there (None: none)."""
        if self.hit_saving is None or not self.hit_saving.told:
            return policy, None
        planner = self.planner
        costs = self.hit_saving.costs(planner.graph.category(planner.reader(bundle)))
        if costs is None:
            return policy, None
        saving = costs.saving_s
        wait, waits_on = min(saving, policy.cache_wait_s), None
        if self.backlog is not None:
            ends = self._busy_ahead(task, candidates, held)
            if ends is not None:
                holder, holder_s, free_s = ends
                wait = cold_copy_wait(holder_s, free_s, saving, waited, policy.cache_wait_s)
                if wait > 0.0:  # it waits for the holder: those held after it queue behind
                    waits_on = (holder, len(bundle.keys) * costs.hit_s)
        if wait < policy.cache_wait_s:
            policy = dataclasses.replace(policy, cache_wait_s=wait)
        return policy, waits_on

    def _busy_ahead(self, task: TaskInputs, candidates: list[WorkerView],
                    held: Held | None = None) -> tuple[str, float, float] | None:
        """The soonest free of the busy workers holding ``task``'s pieces, how long it stays
        busy (its calls out, and the bundles held for it before, ``held`` aside), and how
        long the least busy worker with a free slot does (the freest one, if none of the
        candidates); None when a holder has a free slot, no worker has one, or a backlog
        is not known."""
        assert self.backlog is not None
        holders, free = [], []
        for w in candidates:
            if score(task, w).tier == Tier.CACHED:
                if w.free_slots > 0:
                    return None
                holders.append(w.id)
            elif w.free_slots > 0:
                free.append(w.id)
        if not holders:
            return None
        if not free and (freest := self.topology.freest()) is not None and freest.worker:
            free.append(freest.worker)
        ahead: list[tuple[float, str]] = []
        for wid in holders:
            if (busy := self.backlog(wid)) is None:
                return None
            ahead.append((busy + self.held.queued_on(wid, held), wid))
        free_s: list[float] = []
        for wid in free:
            if (busy := self.backlog(wid)) is None:
                return None
            free_s.append(busy)
        if not free_s:
            return None
        holder_s, holder = min(ahead)
        return holder, holder_s, min(free_s)

    def _wait_start(self, since: float, home: str | None) -> float:
        """A bundle waits from the later of its arrival and its rack's last near bundle."""
        return max(since, self.last_near.get(home, since)) if home else since

    def _inputs(self, bundle: Bundle, now: float,
                held: Held | None) -> tuple[TaskInputs, str | None]:
        """The bundle's files, where their shards are now, and its home rack; a held
        bundle keeps them while the shards' health and the workers' hosts stay as they
        were (:meth:`_catch_up`)."""
        built = self._state[:2]
        if held is not None and held.task is not None and held.built == built:
            return held.task, held.home
        lfns = tuple(dict.fromkeys(logical_name(f) for f in bundle.files))
        shards = {f: self.shard_now(f, now) for f in lfns} if self.shardmap else {}
        task = TaskInputs(lfns, {f: s.rack if s else None for f, s in shards.items()},
                          {f: self.topology.shard_host(s) if s else None
                           for f, s in shards.items()}, self.bundle_pieces(bundle),
                          self.pieces_only)
        home = task.home_rack()
        if held is not None:
            held.task, held.home, held.built = task, home, built
        return task, home

    def shard_now(self, lfn: str, now: float) -> Shard | None:
        """The shard that will serve ``lfn`` now (a failed shard's next in line)."""
        assert self.shardmap is not None
        own = self.shardmap.shard_for(lfn)
        if self.health.is_healthy(own, now):
            return own  # first in line: no need to rank the others
        try:
            return self.shardmap.choose(lfn, self.health, now)
        except NoShardAvailableError:
            return None

    def rack_now(self, lfn: str, now: float) -> str | None:
        """Rack of the shard that will serve ``lfn`` now."""
        shard = self.shard_now(lfn, now)
        return shard.rack if shard is not None else None
