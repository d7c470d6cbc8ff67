"""Pure dispatch: which bundles go out now, and where. The clock is an argument; no I/O.

Each time slots are free, :meth:`Dispatcher.fill` takes held bundles first, then fresh ones
from the planner (:mod:`datavine.scheduler.bundling`), and decides each one's placement
(:func:`datavine.scheduler.placement.decide`) from where its files' shards are now (a failed
shard's next in line, :mod:`datavine.io.shards`: its rack and its host) and the free slots,
hosts and files read of the workers that can be near them
(:meth:`datavine.scheduler.topology.Topology.near`). As in Spark's delay scheduling, a bundle
that waits for a busy rack is held, counting its wait from the later of its arrival and the
last time its rack got a near bundle; the look-ahead past held bundles is bounded, so other
racks stay busy. A bundle whose last try crashed goes anywhere. The run loop
(:mod:`datavine.manager.execution`) and the facility model (:mod:`datavine.apps.sim`) both
dispatch through this class.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Hashable

from datavine.io.shards import NoShardAvailableError, Shard, ShardHealth, ShardMap, logical_name
from datavine.scheduler.bundling import Bundle, Planner
from datavine.scheduler.placement import Placement, PlacementPolicy, TaskInputs, Tier, decide
from datavine.scheduler.topology import Target, Topology

Key = Hashable
LOOKAHEAD_FACTOR = 4  # bundles considered per free slot when the first ones must wait


class Dispatcher:
    """Held bundles, racks' last near dispatch, and tasks to place anywhere, for one run."""

    def __init__(self, planner: Planner, topology: Topology, policy: PlacementPolicy | None,
                 shardmap: ShardMap | None, health: ShardHealth, bundles_per_slot: int) -> None:
        self.planner = planner
        self.topology = topology
        self.policy = policy
        self.shardmap = shardmap
        self.health = health
        self.bundles_per_slot = bundles_per_slot
        self.held: list[tuple[Bundle, float]] = []
        self.last_near: dict[str, float] = {}  # rack -> when it last got a near bundle
        self.anywhere: set[Key] = set()  # tasks whose last try crashed: placed anywhere next
        self.decisions = 0

    def fill(self, now: float, slots: int, inflight: int) -> list[tuple[Bundle, Target,
                                                                     Placement]]:
        """Bundles to send now to fill ``slots`` x ``bundles_per_slot`` with ``inflight``
        already out: (bundle, target, placement) each; the targets are counted as sent."""
        slots = max(1, slots)
        room = slots * self.bundles_per_slot - inflight
        if room <= 0:
            return []
        lookahead = LOOKAHEAD_FACTOR * slots * self.bundles_per_slot
        queue = deque(self.held)
        self.held = []
        out = []
        while room > 0:
            if not queue:
                want = min(room, lookahead - len(self.held))
                fresh = self.planner.next_bundles(want) if want > 0 else []
                if not fresh:
                    break
                queue.extend((b, now) for b in fresh)
            bundle, since = queue.popleft()
            placement, home = self.place(bundle, now, since)
            self.decisions += 1
            if placement.action == "hold":
                self.held.append((bundle, since))
                continue
            if home is not None and placement.tier > Tier.FAR:
                self.last_near[home] = now
            target = self.topology.target(placement)
            self.topology.sent(target)
            out.append((bundle, target, placement))
            room -= 1
        self.held.extend(queue)
        return out

    def place(self, bundle: Bundle, now: float, since: float) -> tuple[Placement, str | None]:
        """Where ``bundle`` goes, and the rack holding its files."""
        if not bundle.files or self.policy is None:
            return Placement("run", Tier.FAR, reason="no input files, or placement is off"), None
        if not self.anywhere.isdisjoint(bundle.keys):
            return Placement("run", Tier.FAR, reason="its last try crashed: anywhere"), None
        lfns = tuple(dict.fromkeys(logical_name(f) for f in bundle.files))
        shards = {f: self.shard_now(f, now) for f in lfns} if self.shardmap else {}
        task = TaskInputs(lfns, {f: s.rack if s else None for f, s in shards.items()},
                          {f: self.topology.shard_host(s) if s else None
                           for f, s in shards.items()})
        home = task.home_rack()
        waited = now - max(since, self.last_near.get(home, since)) if home else now - since
        return decide(task, self.topology.near(task), waited, self.policy), home

    def shard_now(self, lfn: str, now: float) -> Shard | None:
        """The shard that will serve ``lfn`` now (a failed shard's next in line)."""
        assert self.shardmap is not None
        try:
            return self.shardmap.choose(lfn, self.health, now)
        except NoShardAvailableError:
            return None

    def rack_now(self, lfn: str, now: float) -> str | None:
        """Rack of the shard that will serve ``lfn`` now."""
        shard = self.shard_now(lfn, now)
        return shard.rack if shard is not None else None
