"""Bundles held by delay scheduling, in the order they were first held, and what could let
each one run.

The dispatcher (:mod:`datavine.scheduler.dispatch`) holds a bundle whose near workers are
busy, and at each fill goes through the held bundles, oldest first, for those that can run
now. Deciding every held bundle again at every fill costs a decision per held bundle per
fill, and the bundles held grow with the slots (the look-ahead is a few per slot): at
thousands of workers, hundreds of decisions per bundle sent. A held bundle's decision can
only change when

- room was gained at one of its *wake keys* since its last decision (a worker that read
  its files, its files' racks and hosts, one more reader of a file:
  :meth:`~datavine.scheduler.topology.Topology.wake_keys`), and some worker there still
  has a free slot;
- its wait ran out (the ``retry_after_s`` of its last hold);
- or something any decision depends on changed (a worker left or changed, a shard failed
  or came back, tasks were sent anywhere after a crash): then every held bundle is due.

So :meth:`HeldBundles.next` yields, oldest first, only the held bundles for which one of
these holds; the others would be held again, and skipping them changes no decision, only
how many are made. Each wake key keeps its watchers in a heap (those not looked at since
the key last gained room) and a list (those looked at since): a gain moves the list back
into the heap, so the work is proportional to the decisions it may change.
"""

from __future__ import annotations

import heapq
from collections.abc import Callable, Iterator
from dataclasses import dataclass

from datavine.scheduler.bundling import Bundle
from datavine.scheduler.gains import WakeKey
from datavine.scheduler.placement import TaskInputs


@dataclass(eq=False, slots=True)
class Held:
    """One held bundle: ``seq`` orders it (first held, first looked at); ``task``/``home``
    are its inputs as last decided, under ``built`` (what they depend on); ``keys`` where
    room would wake it; ``decided`` the stamp of its last decision, ``deadline`` when its
    wait runs out, counted from ``wait_start`` (its arrival, or its rack's last near
    bundle, when last decided); ``waits_on`` the busy worker holding its pieces that it
    waits for, and ``waits_s`` what it will take there (:meth:`HeldBundles.wait_on`)."""

    seq: int
    bundle: Bundle
    since: float
    task: TaskInputs | None = None
    home: str | None = None
    built: object = None
    keys: frozenset[WakeKey] = frozenset()
    decided: int = -1
    deadline: float = 0.0
    wait_start: float = 0.0
    waits_on: str | None = None
    waits_s: float = 0.0


class _Watchers:
    """The held bundles a wake key would wake: ``members`` (True: in ``heap``, not looked
    at since ``gained``; False: in ``seen``); entries of former members are skipped."""

    __slots__ = ("gained", "heap", "members", "seen")

    def __init__(self) -> None:  # one per held bundle's file: kept cheap
        self.members: dict[int, bool] = {}
        self.heap: list[int] = []
        self.seen: list[int] = []
        self.gained = -1


class HeldBundles:
    """The held bundles, oldest first; iterating gives ``(bundle, since)``."""

    def __init__(self) -> None:
        self.clear()

    def clear(self) -> None:
        """Forget every held bundle (the run ended)."""
        self._held: dict[int, Held] = {}  # by seq: insertion order is seq order
        self._next_seq = 0
        self._stamp = 0  # orders decisions and gains
        self._watch: dict[WakeKey, _Watchers] = {}
        self._woken: set[WakeKey] = set()  # keys whose heap may hold bundles to look at
        self._due: list[int] = []  # seqs to decide again whatever their keys say
        self._due_set: set[int] = set()
        self._deadlines: list[tuple[float, int, int]] = []  # (when, seq, decision stamp)
        self._queued_on: dict[str, float] = {}  # worker -> what the bundles waiting for it take

    def __iter__(self) -> Iterator[tuple[Bundle, float]]:
        return iter([(h.bundle, h.since) for h in self._held.values()])

    def __len__(self) -> int:
        return len(self._held)

    # --- holding and letting go ---------------------------------------------------------
    def hold(self, bundle: Bundle, since: float) -> Held:
        """A bundle held for the first time (decide it at once, or mark it :meth:`due`)."""
        held = Held(self._next_seq, bundle, since)
        self._next_seq += 1
        self._held[held.seq] = held
        return held

    def decided(self, held: Held, keys: frozenset[WakeKey], deadline: float,
                wait_start: float) -> None:
        """``held`` was decided (again) and stays held: wake it when room is gained at
        ``keys``, or at ``deadline`` (when its wait, counted from ``wait_start``, runs
        out)."""
        held.decided = self._tick()
        held.deadline, held.wait_start = deadline, wait_start
        self._due_set.discard(held.seq)
        for key in held.keys - keys:
            self._unwatch(key, held.seq)
        for key in keys - held.keys:
            watchers = self._watch.get(key)
            if watchers is None:
                watchers = self._watch[key] = _Watchers()
            watchers.members[held.seq] = False
            watchers.seen.append(held.seq)
            if len(watchers.seen) > 2 * len(watchers.members) + 16:
                watchers.seen = [s for s, pending in watchers.members.items() if not pending]
        held.keys = keys
        heapq.heappush(self._deadlines, (deadline, held.seq, held.decided))

    def wait_on(self, held: Held, worker: str | None, seconds: float = 0.0) -> None:
        """``held`` waits for ``worker`` (None: for no one in particular), where it will take
        ``seconds``: the other bundles held for that worker queue behind what it has out
        (:meth:`queued_on`)."""
        if held.waits_on is not None:  # a hit learned at 0 s adds nothing, so may be gone
            left = self._queued_on.get(held.waits_on, 0.0) - held.waits_s
            if left > 1e-9:
                self._queued_on[held.waits_on] = left
            else:
                self._queued_on.pop(held.waits_on, None)
        held.waits_on, held.waits_s = worker, seconds if worker is not None else 0.0
        if worker is not None:
            self._queued_on[worker] = self._queued_on.get(worker, 0.0) + seconds

    def queued_on(self, worker: str, but: Held | None = None) -> float:
        """What the held bundles waiting for ``worker`` will take there, ``but``'s aside."""
        queued = self._queued_on.get(worker, 0.0)
        if but is not None and but.waits_on == worker:
            queued -= but.waits_s
        return max(0.0, queued)

    def remove(self, held: Held) -> None:
        """``held`` was sent."""
        self.wait_on(held, None)
        del self._held[held.seq]
        self._due_set.discard(held.seq)
        for key in held.keys:
            self._unwatch(key, held.seq)

    def _unwatch(self, key: WakeKey, seq: int) -> None:
        watchers = self._watch[key]
        del watchers.members[seq]
        if not watchers.members:
            del self._watch[key]
            self._woken.discard(key)

    # --- what may let them run ----------------------------------------------------------
    def wake(self, keys: list[WakeKey]) -> None:
        """Room was gained at ``keys``: their watchers are worth a look (oldest first)."""
        stamp = self._tick()
        for key in keys:
            watchers = self._watch.get(key)
            if watchers is None:
                continue
            watchers.gained = stamp
            members, heap = watchers.members, watchers.heap
            for seq in watchers.seen:
                if members.get(seq) is False:
                    members[seq] = True
                    heapq.heappush(heap, seq)
            watchers.seen = []
            if len(heap) > 2 * len(members) + 16:  # entries of former members: drop them
                heap[:] = sorted(seq for seq, pending in members.items() if pending)
            self._woken.add(key)

    def due(self, held: Held) -> None:
        if held.seq not in self._due_set:
            self._due_set.add(held.seq)
            heapq.heappush(self._due, held.seq)

    def all_due(self) -> None:
        """Something every decision depends on changed: decide them all again."""
        for held in self._held.values():
            self.due(held)

    def expire(self, now: float, wait_start: Callable[[Held], float]) -> None:
        """Bundles whose wait ran out by ``now`` are due. A wait counts from
        ``wait_start(held)``, which moves later when the bundle's rack gets a near bundle:
        such a wait runs out later by as much (nothing else changed since its decision)."""
        deadlines, held = self._deadlines, self._held
        while deadlines and deadlines[0][0] <= now:
            _, seq, stamp = heapq.heappop(deadlines)
            entry = held.get(seq)
            if entry is None or entry.decided != stamp:
                continue  # sent, or decided again since
            later = wait_start(entry) - entry.wait_start
            if later > 0 and entry.deadline + later > now:
                entry.deadline += later
                entry.wait_start += later
                heapq.heappush(deadlines, (entry.deadline, seq, stamp))
            else:
                self.due(entry)

    def next(self, has_room: Callable[[WakeKey], bool]) -> Held | None:
        """The oldest held bundle that may run now (due, or woken at a key that still has
        room), taken off the due list and its key's heap; None when there is none."""
        due = self._due
        if not due and not self._woken:
            return None
        while due and due[0] not in self._due_set:
            heapq.heappop(due)
        best = due[0] if due else None
        source: _Watchers | None = None
        for key in list(self._woken):
            watchers = self._watch.get(key)
            seq = self._first(watchers) if watchers is not None and has_room(key) else None
            if seq is None:  # looked at all, or no room there: asleep until its next gain
                self._woken.discard(key)
            elif best is None or seq < best:
                best, source = seq, watchers
        if best is None:
            return None
        if source is None:
            heapq.heappop(due)
            self._due_set.discard(best)
        else:
            heapq.heappop(source.heap)
            source.members[best] = False
            source.seen.append(best)
        return self._held[best]

    def _first(self, watchers: _Watchers) -> int | None:
        """The oldest watcher not looked at since the key's gain (others move to seen)."""
        heap, members, held = watchers.heap, watchers.members, self._held
        while heap:
            seq = heap[0]
            if members.get(seq) is not True:  # a former member, or a second entry
                heapq.heappop(heap)
                continue
            if held[seq].decided > watchers.gained:  # decided since: nothing new here
                heapq.heappop(heap)
                members[seq] = False
                watchers.seen.append(seq)
                continue
            return seq
        return None

    def _tick(self) -> int:
        self._stamp += 1
        return self._stamp
