"""Pure planning: which ready dask tasks go to a worker together, as one function call.

A TaskVine function call costs a few milliseconds of manager and network time, while a
trivial dask task costs microseconds. The planner therefore sends *bundles*: some ready
tasks (seeds) plus every task whose dependencies all lie inside the bundle or are already
computed (the closure), so a subtree of a reduction runs in one process and only its
frontier values travel. Bundle size follows measured task durations per category
(``target_bundle_s``); unknown categories are spread evenly over the free slots. A task
that reads an input file is a seed of its own, so it can be placed near its data and
retried alone; cheap merges ready before it go in its call (:meth:`Planner._carried`), so
they do not take the slot in a worker's queue that lets it read the file ahead. A ready file
task whose pieces a worker's column cache holds goes before the first in order when that one
reads pieces no cache holds (:meth:`Planner._seed`): a cache keeps what the order of reads
leaves it, and a held piece read later may be gone by then. A file task's call takes the
ready tasks its worker's cache holds, or, when no cache holds its pieces yet, those that read
only its pieces (:meth:`Planner._same_pieces`: they read from the memory its read fills),
and, once a hit's and a cold read's times are learned, its file's next chunks with theirs
(:meth:`Planner._same_files`: a call fewer is a hand-over fewer), as many as the bundle's
target time takes, up to half a core's share of the ready file tasks, so the calls shrink
towards a run's end and the cores finish together (:func:`group_size`, factoring).

No I/O here: the runtime feeds results in and asks for bundles out.
"""

from __future__ import annotations

import heapq
import itertools
import math
from collections import defaultdict
from collections.abc import Callable, Hashable, Iterable, Mapping
from dataclasses import dataclass, field

from datavine.scheduler.graph import TaskGraph
from datavine.scheduler.hit_saving import TaskCosts

Key = Hashable


@dataclass(slots=True)
class Bundle:
    """Tasks sent together. ``keys`` is in execution order."""

    id: int
    keys: list[Key]
    inputs: set[Key]
    outputs: set[Key]
    files: tuple[str, ...] = ()
    attempts: int = 0


@dataclass
class CostModel:
    """Exponential moving average of task durations per category."""

    alpha: float = 0.3
    seconds: dict[str, float] = field(default_factory=dict)

    def observe(self, category: str, count: int, total_s: float) -> None:
        if count <= 0:
            return
        per_task = total_s / count
        old = self.seconds.get(category)
        self.seconds[category] = per_task if old is None else old + self.alpha * (per_task - old)

    def estimate(self, category: str) -> float | None:
        return self.seconds.get(category)


HOLDER_SCAN = 256  # ready tasks looked at for ones held by the same worker (the heap's first)
HELD_TOGETHER = 16  # the most file tasks held by one worker that go in one bundle
# a call groups at most this fraction of a core's share of the ready file tasks: the calls
# shrink as the run nears its end (factoring), so the cores finish together
SHARE_SPLIT = 2
CARRIED_SHARE = 0.1  # merges this cheap (of the bundle target) go in a file task's call


def bundle_size(estimate_s: float | None, n_ready: int, n_bundles: int, *,
                target_s: float, max_tasks: int) -> int:
    """How many seeds to put in the next bundle.

    Known cost: enough tasks for ``target_s`` of work. Unknown cost: the ready tasks spread
    evenly over the bundles that can be submitted now. Always within [1, max_tasks].
    """
    if estimate_s is not None and estimate_s > 0:
        size = math.floor(target_s / estimate_s)
        # never starve free slots of work when many tasks are ready
        size = min(size, math.ceil(n_ready / max(1, n_bundles)))
    else:
        size = math.ceil(n_ready / max(1, n_bundles))
    return max(1, min(max_tasks, size))


def group_size(size: int, n_ready: int, cores: int) -> int:
    """How many held file tasks go in one call (:meth:`Planner._group`): ``size`` (from
    their measured cost), at most :data:`HELD_TOGETHER`, and at most the ready tasks' share
    of each of the ``cores`` running at once, so that the ready work still spreads over
    every core (pure)."""
    return max(1, min(size, HELD_TOGETHER, math.ceil(n_ready / (SHARE_SPLIT * max(1, cores)))))


class Planner:
    """Tracks which tasks are ready, running and done, and forms bundles."""

    def __init__(self, graph: TaskGraph, *, files: Callable[[Key], tuple[str, ...]],
                 costs: CostModel, target_s: float, max_tasks: int,
                 priority: Mapping[Key, int] | None = None,
                 holder: Callable[[Key], str | None] | None = None,
                 light: Callable[[Key], bool] | None = None,
                 cached_on: Callable[[Key], str | None] | None = None,
                 pieces: Callable[[Key], tuple[str, ...]] | None = None,
                 task_costs: Callable[[str], TaskCosts | None] | None = None) -> None:
        """``priority``: the order ready tasks are taken in (lower first; default dask's,
        ``graph.priority``; :func:`datavine.scheduler.longest_first.longest_first` gives
        one where larger reads go first). ``light``: whether a task that reads no file
        needs little memory (its inputs are small), so it may go in a file task's call
        (:meth:`_carried`; None: every such task). ``holder``: the worker whose cache holds
        a task's pieces, for grouping them (:meth:`_held_with`); ``cached_on``: the same,
        for the order (:meth:`_seed`), with ``pieces`` (a task's pieces) and
        :meth:`note_held` (None: dask's order, or ``priority``). ``task_costs``: a
        category's task time from memory and from its file, for how many of a file's
        chunks go in one call (:meth:`_same_files`; None: each chunk's call apart)."""
        self.graph = graph
        self._holder = holder
        self._cached_on = cached_on if pieces is not None else None
        self._pieces = pieces
        self._task_costs = task_costs
        # piece -> the ready file tasks that read it (a list: most pieces have one reader);
        # the ready file tasks a worker's cache held when last looked at, by priority (both
        # kept lazily: see _waiting)
        self._readers: defaultdict[str, list[Key]] = defaultdict(list)
        self._by_files: defaultdict[tuple[str, ...], list[Key]] = defaultdict(list)
        self._cached: list[tuple[int, Key]] = []
        # the same held tasks by the worker that held them then (entries of tasks taken
        # since are dropped at the next look): what a held task's call groups is looked
        # for there (_held_with), not in the first entries of both heaps
        self._held_by: defaultdict[str, list[tuple[int, Key]]] = defaultdict(list)
        self._light = light
        self._priority = graph.priority if priority is None else priority
        self._files = files
        self.costs = costs
        self._target_s = target_s
        self._max_tasks = max_tasks
        self._ids = itertools.count()
        self._missing = {k: len(d) for k, d in graph.dependencies.items()}
        self._ready: list[tuple[int, Key]] = []
        # the ready tasks not yet in a bundle: the heap keeps entries of tasks taken out of
        # order (held ones, grouped ones) until they come to its top, so its length is not
        # their number
        self._live: set[Key] = set()
        self._live_reads: set[Key] = set()  # those of them that read files
        self._scheduled: set[Key] = set()
        self._cores = 1  # bundles running at once (next_bundles)
        self.done: set[Key] = set()
        for key, n in self._missing.items():
            if n == 0:
                self._push(key)

    def _push(self, key: Key) -> None:
        """``key`` is ready: into the ready heap, and, a file task with pieces, among the
        readers of its pieces (and the held ones when a cache holds them)."""
        heapq.heappush(self._ready, (self._priority[key], key))
        self._live.add(key)
        if not self._files(key):
            return
        self._live_reads.add(key)
        if self._cached_on is None or self._pieces is None:
            return
        pieces = self._pieces(key)
        for piece in pieces:
            self._readers[piece].append(key)
        if pieces and self._task_costs is not None:  # only _same_files reads it
            self._by_files[self._files(key)].append(key)
        if pieces and (holder := self._cached_on(key)) is not None:
            self._note_cached(key, holder)

    def _note_cached(self, key: Key, holder: str) -> None:
        """``key``, ready, reads pieces that ``holder``'s cache holds."""
        entry = (self._priority[key], key)
        heapq.heappush(self._cached, entry)
        self._held_by[holder].append(entry)

    def _waiting(self, key: Key) -> bool:
        """Whether ``key`` is ready and not yet in a bundle."""
        return key in self._live

    def note_held(self, names: Iterable[str]) -> None:
        """A worker's column cache now holds ``names`` (pieces, among other names), or will:
        a call reading them was sent there. The ready tasks reading them that some cache
        now holds whole go first (:meth:`_seed`)."""
        cached_on = self._cached_on
        if cached_on is None:
            return
        for name in names:
            readers = self._readers.get(name)
            if not readers:
                continue
            live = [key for key in dict.fromkeys(readers) if self._waiting(key)]
            if live:
                self._readers[name] = live
            else:
                del self._readers[name]
            for key in live:
                if (holder := cached_on(key)) is not None:
                    self._note_cached(key, holder)

    @property
    def finished(self) -> bool:
        return len(self.done) == len(self.graph)

    @property
    def n_ready(self) -> int:
        """How many tasks are ready and in no bundle yet."""
        return len(self._live)

    def next_bundles(self, n_bundles: int, cores: int = 1) -> list[Bundle]:
        """Up to ``n_bundles`` bundles from the ready tasks, highest priority first;
        ``cores``: how many bundles run at once in the pool (held file tasks go together
        only as far as the ready ones still fill every core: :meth:`_group`)."""
        self._cores = max(1, cores)
        bundles: list[Bundle] = []
        while len(bundles) < n_bundles:
            while self._drop_stale():
                pass
            if not self._ready:
                break
            bundles.append(self._form(n_bundles - len(bundles)))
        return bundles

    def reader(self, bundle: Bundle) -> Key:
        """The bundle's first task that reads a file (its first task when none does): whose
        category an uncapped bundle's time, and what a hit saves, are counted under, merges
        carried beside it (:meth:`_carried`) or not."""
        if bundle.files and len(bundle.keys) > 1:
            return next((k for k in bundle.keys if self._files(k)), bundle.keys[0])
        return bundle.keys[0]

    def _seed(self) -> Key:
        """The task the next bundle starts with: the first ready task in order, unless it
        reads pieces that no worker's column cache holds while some ready file task's pieces
        are all held by one: then the first of those (the held pieces are read while they
        are there; the order's next read would make a cache drop some of them)."""
        first = self._ready[0][1]
        cached_on = self._cached_on
        if not self._cached or cached_on is None or self._pieces is None:
            return first
        if not self._files(first) or not self._pieces(first) or cached_on(first) is not None:
            return first
        while self._cached:
            key = self._cached[0][1]
            if self._waiting(key) and cached_on(key) is not None:
                return key
            heapq.heappop(self._cached)
        return first

    def _form(self, n_bundles: int) -> Bundle:
        seed = self._seed()
        category = self.graph.category(seed)
        size = self._size(category, n_bundles)
        members: list[Key] = []
        files: list[str] = []
        if seed != self._ready[0][1]:  # out of order: its heap entry goes stale (_drop_stale)
            members.append(seed)
            files.extend(self._files(seed))
            self._group(seed, category, size, members, files)
        else:
            while self._ready:
                if self._drop_stale():
                    continue
                key = self._ready[0][1]
                key_files = self._files(key)
                if members and not (self._carried(members) if key_files
                                    else len(members) < size):
                    break  # a file-reading task starts its own bundle, unless it carries these
                heapq.heappop(self._ready)
                members.append(key)
                files.extend(key_files)
                if key_files:
                    if key != seed:  # behind merges it carries: grouped as what it is
                        category = self.graph.category(key)
                        size = self._size(category, n_bundles)
                    self._group(key, category, size, members, files)
                    break
        self._scheduled.update(members)
        self._live.difference_update(members)
        self._live_reads.difference_update(members)
        members = self._closure(members)
        graph = self.graph
        if len(members) == 1:  # most bundles (a file's task): the same sets, made directly
            key = members[0]
            return Bundle(next(self._ids), members, set(graph.dependencies[key]),
                          {key} if key in graph.outputs or graph.dependents[key] else set(),
                          tuple(files))
        member_set = set(members)
        members.sort(key=graph.priority.__getitem__)
        inputs = {d for k in members for d in graph.dependencies[k] if d not in member_set}
        outputs = {
            k for k in members
            if k in graph.outputs or any(d not in member_set for d in graph.dependents[k])
        }
        return Bundle(next(self._ids), members, inputs, outputs, tuple(files))

    def _size(self, category: str, n_bundles: int) -> int:
        """How many seeds of ``category`` a bundle takes now (:func:`bundle_size`)."""
        return bundle_size(self.costs.estimate(category), len(self._live), n_bundles,
                           target_s=self._target_s, max_tasks=self._max_tasks)

    def _group(self, key: Key, category: str, size: int, members: list[Key],
               files: list[str]) -> None:
        """A file task that starts a bundle (``members``: it, behind the merges it carries,
        :meth:`_carried`) takes the ready tasks whose pieces the same worker holds with it
        (:meth:`_held_with`), or, none held, the ones that read its pieces and its file's
        other chunks with theirs (:meth:`_same_pieces`, :meth:`_same_files`): ``size`` of
        them (from the category's measured cost), or, once a hit's and a cold read's times
        are known (``task_costs``), as many as fit the bundle's target time; at most
        :data:`HELD_TOGETHER`, within ``max_tasks``, and no more than the ready tasks' share
        of a core (:func:`group_size`): at a run's end the last calls are single chunks, so
        no core idles behind another's long call."""
        if self.costs.estimate(category) is None:
            return
        cap = min(group_size(HELD_TOGETHER, len(self._live_reads), self._cores),
                  self._max_tasks - len(members) + 1)
        if cap <= 1:
            return
        costs = self._task_costs(category) if self._task_costs is not None else None
        if costs is None and size <= 1:
            return
        held = self._held_with(key, category, cap - 1)
        if costs is None:
            size = min(size, cap)
        elif held:  # hits, as many as the target's time takes
            size = min(cap, 1 + math.floor(self._target_s / max(costs.hit_s, 1e-6)))
        else:  # its own pieces' readers whole (they read the memory its read fills, and
            size = cap  # would wait for its worker anyway), its file's next as time allows
        if held:
            others = held[:size - 1]
        else:
            others = self._same_pieces(key, category, size - 1)
            if costs is not None:
                others += self._same_files(key, category, others, costs,
                                           size - 1 - len(others))
        for other in others:
            members.append(other)
            files.extend(self._files(other))

    def _carried(self, members: list[Key]) -> bool:
        """Whether a file task may go in one call behind ``members`` (tasks that read no
        file: merges): when their measured cost is at most :data:`CARRIED_SHARE` of a
        bundle's target (unknown: yes). A merge sent alone takes a slot of a worker's queue,
        so the file task behind it is not there to be read ahead while the current call
        computes; carried, it is, and the merge runs where it would have waited anyway.
        Only light merges (``light``): the call runs under the file task's memory cap; and
        within ``max_tasks``."""
        if len(members) >= self._max_tasks:
            return False
        if self._light is not None and not all(self._light(key) for key in members):
            return False
        cost = sum(self.costs.estimate(self.graph.category(key)) or 0.0 for key in members)
        return cost <= CARRIED_SHARE * self._target_s

    def _held_with(self, seed: Key, category: str, n: int) -> list[Key]:
        """Up to ``n`` more ready file tasks of ``category`` whose pieces the worker holding
        ``seed``'s holds too, highest priority first; none when no worker holds ``seed``'s.
        Looked for among the tasks noted as held by that worker when they became ready or
        held (:meth:`_note_cached`), or, without pieces (no ``cached_on``), among the first
        :data:`HOLDER_SCAN` entries of the held heap, then of the ready heap. (A scan of the
        ready heap alone found the held tasks of a later pass deeper than it looks: the
        default scale test, 143 of 157 calls one chunk; the scan of both heaps took ~150 us
        of the manager's thread per call there, ~9% of it, against ~20 us now.)"""
        holder = self._holder
        if holder is None or (home := holder(seed)) is None:
            return []
        found: dict[Key, int] = {}
        live = self._live
        if self._cached_on is not None:  # the tasks noted as held by ``home``, the live ones
            entries = [e for e in self._held_by.get(home, ()) if e[1] in live]
            self._held_by[home] = entries  # those taken since are dropped
        else:
            entries = list(itertools.chain(itertools.islice(self._cached, HOLDER_SCAN),
                                           itertools.islice(self._ready, HOLDER_SCAN)))
        for priority, key in entries:
            if (key in found or key not in live or key == seed
                    or self.graph.category(key) != category or not self._files(key)):
                continue
            if holder(key) == home:
                found[key] = priority
        return heapq.nsmallest(n, found, key=found.__getitem__)

    def _same_pieces(self, seed: Key, category: str, n: int) -> list[Key]:
        """Up to ``n`` more ready file tasks of ``category`` that read no piece ``seed``
        does not, highest priority first (none without pieces): after ``seed`` in its call
        they read from the memory its reads fill. Sent as calls of their own they would
        wait for its worker (held) or read the same bytes again elsewhere, and each call
        costs a hand-over (the default scale test, a file's 8 passes: 40 calls fewer of
        ~115)."""
        pieces_of = self._pieces
        if pieces_of is None or self._cached_on is None or not (pieces := pieces_of(seed)):
            return []
        mine = frozenset(pieces)
        found: dict[Key, int] = {}
        live, category_of = self._live, self.graph.category
        for piece in pieces:
            for key in self._readers.get(piece, ()):
                if (key != seed and key not in found and key in live
                        and category_of(key) == category and mine.issuperset(pieces_of(key))):
                    found[key] = self._priority[key]
        return heapq.nsmallest(n, found, key=found.__getitem__)

    def _same_files(self, seed: Key, category: str, taken: list[Key], costs: TaskCosts,
                    room: int) -> list[Key]:
        """More ready file tasks of ``category`` that read ``seed``'s files, pieces no cache
        holds, each with the ready tasks that read only its pieces (:meth:`_same_pieces`),
        whole groups in order while the call stays within the bundle's target time (a cold
        read a group, a hit each task beside it: ``costs``) and its ``room`` (more tasks it
        may take): a file's chunks go in one call once their costs are known
        (their reads near the same shard), and each call fewer is a hand-over fewer on its
        worker (the default scale test: ~70 calls a run, each ~1.8 ms of its worker's core).
        Only chunks read more than once in the run (``seed``'s, ``taken``, and each taken
        here, with their passes): a chunk read once keeps a call of its own, so that the
        run's reads, and the columns the workers' caches keep for the next run, spread
        evenly (grouped, a rerun of 20 chunks found one worker holding 12, and read 2-4
        of them cold elsewhere while that worker was busy). ``taken``: already in the call
        beside ``seed``."""
        keys = self._by_files.get(self._files(seed))
        if not keys or not taken or room <= 0 or self._cached_on is None:
            return []
        budget = self._target_s - costs.cold_s - len(taken) * costs.hit_s
        live, cached_on, category_of = self._live, self._cached_on, self.graph.category
        keys[:] = [k for k in dict.fromkeys(keys) if k in live]
        seen = {seed, *taken}
        out: list[Key] = []
        for key in sorted(keys, key=self._priority.__getitem__):
            if key in seen or category_of(key) != category or cached_on(key) is not None:
                continue
            group = [key, *(k for k in self._same_pieces(key, category, room) if k not in seen)]
            if len(group) < 2:  # read once in the run: a call of its own
                continue
            cost = costs.cold_s + (len(group) - 1) * costs.hit_s
            if len(out) + len(group) > room or cost > budget:
                break
            out.extend(group)
            seen.update(group)
            budget -= cost
        return out

    def _drop_stale(self) -> bool:
        """Pop a ready entry already taken by another bundle's closure, or waiting again for
        a dependency that must be recomputed (:meth:`undo`): lazy deletion."""
        if self._ready and self._ready[0][1] not in self._live:
            heapq.heappop(self._ready)
            return True
        return False

    def _closure(self, members: list[Key]) -> list[Key]:
        """Add every dependent whose dependencies are all in the bundle or done."""
        inside = set(members)
        queue = list(members)
        while queue:
            key = queue.pop()
            for dep in self.graph.dependents[key]:
                if dep in inside or dep in self._scheduled or self._files(dep):
                    continue
                # its dependencies not done must all be inside: no need to look at them
                # when there are more of them than tasks inside (a wide merge)
                if self._missing[dep] > len(inside):
                    continue
                if all(d in inside or d in self.done for d in self.graph.dependencies[dep]):
                    inside.add(dep)
                    self._scheduled.add(dep)
                    self._live.discard(dep)
                    members.append(dep)
                    queue.append(dep)
        return members

    def complete(self, bundle: Bundle) -> None:
        """Mark a bundle's tasks done and release their dependents."""
        members = set(bundle.keys)
        self.done.update(members)
        for key in bundle.keys:
            for dep in self.graph.dependents[key]:
                if dep in members:
                    continue
                self._missing[dep] -= 1
                if self._missing[dep] == 0 and dep not in self._scheduled:
                    self._push(dep)

    def requeue(self, bundle: Bundle) -> None:
        """Put a failed bundle's tasks back: they are ready again (their inputs are kept)."""
        self._scheduled.difference_update(bundle.keys)
        for key in bundle.keys:
            if self._missing[key] == 0:
                self._push(key)

    def undo(self, lost: Iterable[Key], available: Callable[[Key], bool]) -> set[Key]:
        """Done tasks whose values were lost (the worker holding them left) must run again,
        with every done task they need whose value is gone too (consumed and dropped),
        back to values still held or to the graph's sources. Returns the tasks undone; those
        whose dependencies are all done and available are ready again."""
        undone: set[Key] = set()
        todo = [k for k in lost if k in self.done]
        while todo:
            key = todo.pop()
            if key in undone:
                continue
            undone.add(key)
            todo.extend(d for d in self.graph.dependencies[key]
                        if d in self.done and d not in undone and not available(d))
        self.done.difference_update(undone)
        self._scheduled.difference_update(undone)
        for key in undone:
            self._missing[key] = sum(d not in self.done for d in self.graph.dependencies[key])
            for dep in self.graph.dependents[key]:
                if dep not in undone and dep not in self.done:
                    self._missing[dep] += 1
                    self._live.discard(dep)
                    self._live_reads.discard(dep)
            if self._missing[key] == 0:
                self._push(key)
        return undone
