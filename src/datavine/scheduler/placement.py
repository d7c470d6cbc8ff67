"""Placement: which workers a task should run on, given where its input files live.

Pure decisions, no I/O. A task reads files; each file belongs to one XCache shard, and each
shard sits on a host (the host in its URL) in a rack (see :mod:`datavine.io.shards`). A
worker is *near* a task when, best first,

1. it has already read one of the task's files (its node cache or page cache has it:
   ``CACHED``); when the worker keeps decoded columns (:mod:`datavine.io.column_cache`) and
   the task names its entry range (``TaskInputs.pieces``), only a worker holding that range
   is ``CACHED`` for the file,
2. it runs on the host of the shard that holds a file (the read never leaves the host:
   ``HOST``), or
3. it sits in the rack of that shard (no cross-switch traffic: ``RACK``);

anything else is *far*. Hosts are compared normalised (:mod:`datavine.scheduler.racks`). A
worker whose rack contradicts the shard's (racks simulated on one machine) is not near
through its host or its cache: reads go through the file's shard. :func:`decide` does delay
scheduling: it holds a task for a short while when the near workers are busy, but never
longer than ``policy.max_wait_s``, and never when no near worker is connected at all
(waiting for a worker that does not exist only adds latency). It scores only the workers it
is given: the topology hands it a few that decide as all would (readers of the files, and the
best free workers of each kind on the shards' hosts and in their racks,
:meth:`datavine.scheduler.topology.Topology.candidates`), not every worker. The runtime
turns a :class:`Placement` into TaskVine calls (worker ids, a rack feature); this module does
not know about TaskVine.
"""

from __future__ import annotations

import functools
import operator
from collections import Counter
from collections.abc import Iterable, Mapping, Sequence
from collections.abc import Set as AbstractSet
from dataclasses import dataclass, field
from enum import IntEnum
from typing import Literal

from datavine.io.column_cache import file_of, marker_name
from datavine.io.shards import ShardMap, logical_name
from datavine.scheduler.racks import normal_host, url_host


class Tier(IntEnum):
    """How near a worker is to a task's data; higher is better."""

    FAR = 0
    RACK = 1
    HOST = 2
    CACHED = 3


@dataclass(frozen=True, slots=True)
class WorkerView:
    """What placement knows about one connected worker."""

    id: str
    rack: str | None = None
    free_slots: int = 1
    # the files it read: the topology hands its own set, not a copy (a worker reads more
    # files with every result): read it, do not keep or hash it
    files_read: AbstractSet[str] = field(default=frozenset(), hash=False)
    host: str | None = None  # normalised (datavine.scheduler.racks.normal_host)


@dataclass(frozen=True, slots=True)
class TaskInputs:
    """A task's input files (logical names), and the rack and the host (normalised) of the
    shard holding each.

    ``pieces``: the entry ranges of the files it reads (:mod:`datavine.scheduler.pieces`), if
    known. ``pieces_only``: the workers keep column caches (``RunConfig.column_cache``), so
    a worker holds the task's data of a file only through those pieces; one that read the
    file without caching a piece of it (a task that opened it for its metadata, as coffea's
    preprocessing and the scale test's first step do) holds none of it. Without it, such a
    worker counts as holding the file: the bytes it read may be in its input cache."""

    files: tuple[str, ...]
    racks: Mapping[str, str | None] = field(default_factory=dict)
    hosts: Mapping[str, str | None] = field(default_factory=dict)
    pieces: tuple[str, ...] = ()
    pieces_only: bool = False

    @classmethod
    def from_shardmap(cls, files: Iterable[str], shardmap: ShardMap,
                      here: str = "localhost") -> TaskInputs:
        """Where the files' own shards are (``here``: the host loopback URLs stand for)."""
        lfns = tuple(dict.fromkeys(logical_name(f) for f in files))
        shards = {f: shardmap.shard_for(f) for f in lfns}
        return cls(lfns, {f: s.rack for f, s in shards.items()},
                   {f: shard_host(s.url, here) for f, s in shards.items()})

    def rack_counts(self) -> Counter[str]:
        return Counter(r for f in self.files if (r := self.racks.get(f)) is not None)

    def home_rack(self) -> str | None:
        """The rack holding most of the task's files (ties broken by name)."""
        if len(self.files) == 1:  # most tasks read one file
            return self.racks.get(self.files[0])
        counts = self.rack_counts()
        if not counts:
            return None
        return min(counts, key=lambda r: (-counts[r], r))


@dataclass(frozen=True, order=True, slots=True)
class Score:
    """Preference of one worker for one task; compares best-first with ``max``."""

    tier: Tier
    cached_files: int
    host_files: int
    rack_files: int


@dataclass(frozen=True)
class PlacementPolicy:
    """Delay-scheduling limits, in seconds of the task's time in the ready queue.

    ``cache_wait_s``: how long to hold out for the best worker connected (one that already
    read the files, else one on their shard's host) before settling for one in the right
    rack. ``max_wait_s``: how long to hold out for any near worker before running anywhere;
    it caps ``cache_wait_s`` too.
    """

    max_wait_s: float = 5.0
    cache_wait_s: float = 1.0

    def __post_init__(self) -> None:
        if self.max_wait_s < 0 or self.cache_wait_s < 0:
            raise ValueError("waits must be >= 0")


@dataclass(frozen=True, slots=True)
class Placement:
    """The decision for one task.

    ``action == "run"``: dispatch now, restricted to ``workers`` (the free workers of its
    tier among those :func:`decide` was shown, best first; empty means any worker) and, if
    set, to workers with the rack feature ``rack``.
    ``action == "hold"``: keep the task queued; ask again after ``retry_after_s``.
    """

    action: Literal["run", "hold"]
    tier: Tier
    workers: tuple[str, ...] = ()
    rack: str | None = None
    retry_after_s: float = 0.0
    reason: str = ""

    @property
    def anywhere(self) -> bool:
        return self.action == "run" and not self.workers and self.rack is None


DEFAULT_POLICY = PlacementPolicy()


def shard_host(url: str, here: str = "localhost") -> str | None:
    """The normalised host of a shard at ``url`` (``here``: what loopback stands for)."""
    host = url_host(url)
    return normal_host(host, here) if host else None


def score(task: TaskInputs, worker: WorkerView) -> Score:
    """How near ``worker`` is to ``task``'s data."""
    rack, host, read = worker.rack, worker.host, worker.files_read
    racks, hosts = task.racks, task.hosts
    cached = on_host = in_rack = 0
    for f in task.files:
        shard_rack = racks.get(f)
        # Reads go through the file's shard: a worker outside that shard's rack that read
        # the file before is still far from it (and one on its host too, racks simulated).
        through = shard_rack is None or shard_rack == rack
        if rack is not None and shard_rack == rack:
            in_rack += 1
        if through and read and _holds(task, f, read):
            cached += 1
        if host is not None and (rack is None or through) and hosts.get(f) == host:
            on_host += 1
    tier = (Tier.CACHED if cached else Tier.HOST if on_host else Tier.RACK if in_rack
            else Tier.FAR)
    return _score(tier, cached, on_host, in_rack)


def _holds(task: TaskInputs, lfn: str, read: AbstractSet[str]) -> bool:
    """Whether a worker that read ``read`` holds ``task``'s data of ``lfn``: one of its
    pieces of it where the worker reports pieces of ``lfn`` (its column cache) or the
    workers keep only pieces (``task.pieces_only``), else the file."""
    pieces = task.pieces
    if pieces and (task.pieces_only or marker_name(lfn) in read):
        return any(p in read for p in pieces if file_of(p) == lfn)
    return lfn in read


@functools.lru_cache(maxsize=4096)
def _score(tier: Tier, cached: int, on_host: int, in_rack: int) -> Score:
    """Scores are small and immutable: share them (decisions score every near worker)."""
    return Score(tier, cached, on_host, in_rack)


_first = operator.itemgetter(0)


def rank_workers(task: TaskInputs, workers: Iterable[WorkerView]) -> list[WorkerView]:
    """Workers best first: by score, then by free slots, then by id (deterministic)."""
    by_id = sorted(workers, key=lambda w: w.id)  # the sort below is stable, also reversed
    return sorted(by_id, key=lambda w: (score(task, w), w.free_slots), reverse=True)


def decide(task: TaskInputs, workers: Sequence[WorkerView], waited_s: float,
           policy: PlacementPolicy | None = None) -> Placement:
    """Where ``task`` should run now, or whether to hold it (delay scheduling)."""
    policy = policy or DEFAULT_POLICY
    if not task.files:
        return Placement("run", Tier.FAR, reason="task reads no known input files")
    if not workers:
        return Placement("run", Tier.FAR, reason="no near worker connected")

    # One pass: the best tier connected, whether any worker sits near the files, and the
    # free workers in rank_workers' order (score, free slots, both descending, then id).
    best_connected, near_files = Tier.FAR, False
    free: list[tuple[tuple[int, int, int, int, int, str], Tier, WorkerView]] = []
    for w in workers:
        s = score(task, w)
        best_connected = max(best_connected, s.tier)
        near_files = near_files or bool(s.rack_files or s.host_files)
        if w.free_slots > 0:
            free.append(((-s.tier, -s.cached_files, -s.host_files, -s.rack_files,
                          -w.free_slots, w.id), s.tier, w))
    free.sort(key=_first)
    best_free = free[0][1] if free else None

    # The tier we still insist on, given how long the task has waited.
    cache_wait_s = min(policy.cache_wait_s, policy.max_wait_s)
    if waited_s < cache_wait_s:
        # Only a worker that read the files is worth a short wait. The shard's host is not:
        # its rack's other hosts read the shard over the same switch, and waiting for it
        # would funnel a rack's work onto the one host that runs its shard.
        wanted = best_connected if best_connected == Tier.CACHED else min(best_connected,
                                                                          Tier.RACK)
    elif waited_s < policy.max_wait_s and near_files:
        wanted = min(best_connected, Tier.RACK)  # the rack, or better
    else:  # waited long enough, or no worker sits near its files: none to wait for
        wanted = Tier.FAR

    if best_free is not None and best_free >= wanted:
        return _run([w for _, tier, w in free if tier == best_free], best_free)
    if wanted > Tier.FAR:
        limit = cache_wait_s if wanted > Tier.RACK else policy.max_wait_s
        return Placement("hold", wanted, retry_after_s=max(limit - waited_s, 0.0),
                         reason=f"near workers ({wanted.name.lower()}) are busy; "
                                f"waited {waited_s:.1f} s of {limit:.1f} s")
    return Placement("run", Tier.FAR, reason="no near worker free: any worker")


def _run(candidates: list[WorkerView], tier: Tier) -> Placement:
    """Run on ``candidates`` (free workers of one tier, best first)."""
    if tier == Tier.FAR:
        return Placement("run", tier, reason="no near worker to wait for: any worker")
    if tier == Tier.CACHED:
        return Placement("run", tier, workers=tuple(w.id for w in candidates),
                         reason="workers that already read its files")
    # Files may sit in several racks: take the rack of the best candidate, so that the
    # worker ids and the rack feature say the same thing.
    rack = candidates[0].rack
    ids = tuple(w.id for w in candidates if w.rack == rack)
    if tier == Tier.HOST:
        hosts = ", ".join(sorted({w.host for w in candidates if w.rack == rack and w.host}))
        return Placement("run", tier, workers=ids, rack=rack,
                         reason=f"workers on the shard's host ({hosts})")
    return Placement("run", tier, workers=ids, rack=rack, reason=f"workers in rack {rack}")


def placement_off_reason(policy: PlacementPolicy | None, shardmap: ShardMap | None,
                         worker_racks: Iterable[str | None]) -> str | None:
    """Why placement could not keep reads near although it is on, or None.

    Placement needs racks on both sides: the shards' (the shard map) and the workers'
    (their ``rack:`` feature: local workers' ``racks``, a pool's ``--rack``, the facility
    file's pools; or the facility file's ``[racks]`` map of hosts).
    """
    if policy is None or shardmap is None:
        return None
    if all(s.rack is None for s in shardmap.shards):
        return ("placement is off: the XCache shards have no racks (give each shard a rack "
                "in the facility file)")
    if all(r is None for r in worker_racks):
        return ("placement is off: no worker has a rack (start pools with --rack, name "
                "their racks in the facility file's [[pools]], or map hosts to racks in its "
                "[racks]; local workers take racks=)")
    return None

