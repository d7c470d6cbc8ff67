"""The workers the manager knows of, and how a placement decision becomes TaskVine features.

Workers are learned three ways, whatever started them:

- at connect, from TaskVine's list of connected workers (:meth:`Topology.see`): each says
  its host (``hostname``), its address (``addrport``), its cores and, where TaskVine passes
  them on, its features: its name (``worker:<id>``) and rack (``rack:<name>``). A worker
  that names no rack gets one from the facility's host-to-rack map
  (:class:`~datavine.scheduler.racks.RackMap`), as Hadoop's rack awareness does;
- datavine's own local and pool workers are announced when they start (name, rack, cores);
- every bundle result says which worker ran it (its name and rack, from
  :mod:`datavine.scheduler.labels`, and its address from TaskVine): the fallback where
  neither of the above said it.

The registry counts the bundles sent to each worker or rack, so that
:func:`datavine.scheduler.placement.decide` sees free slots, and remembers which files each
worker has read (its page cache holds them). Its indexes are kept as workers come, go and
take bundles, so that a decision costs the same with ten workers or a hundred thousand
(:mod:`datavine.scheduler.worker_index`):

- by file: the workers that read it;
- by rack and by host: the workers there, in groups of alike workers (same cores, named or
  not) each ordered by bundles in flight (:class:`~datavine.scheduler.least_busy.LeastBusy`),
  so that a decision is shown the few best free workers of each group of the files' racks
  and hosts, and the readers (:meth:`Topology.candidates`), and decides as it would on every
  near worker (:meth:`Topology.near`);
- where room was gained (a slot returned, a worker joined, a file read:
  :class:`~datavine.scheduler.gains.GainLog`) and whether any decision may have changed otherwise
  (``epoch``: a worker left or changed), so that the dispatcher looks again only at the held
  bundles that may run now (:mod:`datavine.scheduler.held`).

A worker with a name can be targeted exactly (feature ``worker:<id>``); a pool worker
without one only through its rack (feature ``rack:<rack>``).
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any

from datavine.io.column_cache import GENERATION, file_of, marker_name
from datavine.io.shards import Shard
from datavine.scheduler.gains import GainLog, WakeKey
from datavine.scheduler.known_workers import KnownWorker, SeenWorker
from datavine.scheduler.labels import rack_feature, worker_feature
from datavine.scheduler.placement import Placement, TaskInputs, Tier, WorkerView, shard_host
from datavine.scheduler.racks import RackMap, address_of, is_loopback, normal_host
from datavine.scheduler.worker_index import (
    FILE,
    HOST,
    RACK,
    SHARE,
    WORKER,
    Group,
    WorkerIndexes,
    _discard,
)

CANDIDATES_PER_GROUP = 1  # free workers a decision is shown from each group (see candidates)


@dataclass(frozen=True, slots=True)
class Target:
    """Where a bundle was sent: one named worker, a rack, or anywhere (both None)."""

    worker: str | None = None
    rack: str | None = None

    def features(self) -> list[str]:
        if self.worker is not None:
            return [worker_feature(self.worker)]
        if self.rack is not None:
            return [rack_feature(self.rack)]
        return []


ANYWHERE = Target()


class Topology(WorkerIndexes):
    """Known workers, bundles in flight per target, files read per worker; indexes of the
    workers by rack, host and file read.

    ``racks``: the facility's host-to-rack map, for workers that name no rack; ``here``: the
    manager's host, which loopback names and addresses stand for (the runtime passes this
    machine's name; pure code and tests a name of their choice).
    """

    def __init__(self, bundles_per_core: int = 2, racks: RackMap | None = None,
                 here: str = "localhost") -> None:
        self.bundles_per_core = bundles_per_core
        self.racks = racks
        self.here = normal_host(here)
        self.workers: dict[str, KnownWorker] = {}
        self.departed: dict[str, str] = {}  # address -> name of workers that left, unreported
        self.inflight: Counter[Target] = Counter()
        self._per_worker: Counter[str] = Counter()  # in flight to one named worker
        self._per_rack: Counter[str] = Counter()  # in flight to a rack
        self._view_of: dict[str, WorkerView] = {}  # last view per worker, reused if unchanged
        self._init_indexes()  # kept as workers change (rebuilt if ``workers`` was changed)
        self._settled: set[str] = set()  # addresses seen complete in TaskVine's list
        self._shard_hosts: dict[str, str | None] = {}  # shard URL -> normalised host
        self._shard_names: set[str] = set()  # those hosts
        self._targets: dict[tuple[str | None, str | None], Target] = {}
        # What a held bundle waits on: room gained (wake keys, :attr:`gains`) and, for any
        # other change that may let it run (a worker left or changed), the epoch.
        self.epoch = 0
        self.gains = GainLog()
        self.cache_epoch = 0  # bumped by drop_caches: workers empty their column caches
        self._cache_generation: dict[str, str] = {}  # worker -> its column cache's last

    # --- learning -----------------------------------------------------------------------
    def announce(self, worker_id: str, rack: str | None, cores: int,
                 host: str | None = None) -> None:
        """A named worker datavine started itself (it may not be connected yet); ``rack``
        None keeps a rack learned otherwise."""
        known = self.workers.get(worker_id)
        if known is None:
            known = self.workers[worker_id] = KnownWorker(worker_id, rack, cores, True)
        known.rack = rack if rack is not None else known.rack
        known.cores, known.named = cores, True
        if host:
            known.host = normal_host(host, self.here)
        self._reindex(known)

    def see(self, entries: Iterable[Mapping[str, Any]]) -> int:
        """Workers in TaskVine's list of connected workers (``Manager.status("workers")``):
        each one not seen before becomes known with its host, rack, name and cores, before
        any bundle ran on it. Returns how many entries were not complete yet (a worker that
        has not reported its features and resources): look again soon."""
        incomplete = 0
        for entry in entries:
            seen = SeenWorker.from_status(entry) if isinstance(entry, Mapping) else None
            if seen is None or seen.addrport in self._settled:
                continue
            self.connected(seen)
            if seen.complete:
                self._settled.add(seen.addrport)
            else:
                incomplete += 1
        return incomplete

    def connected(self, seen: SeenWorker) -> KnownWorker:
        """One worker TaskVine lists as connected (see :meth:`see`)."""
        known = self._entry(seen.name, seen.addrport)
        if known is None:
            wid = seen.name or seen.addrport
            known = self.workers[wid] = KnownWorker(wid, None, max(seen.cores, 1),
                                                    named=seen.name is not None)
        known.host = self._host(seen.hostname, seen.addrport) or known.host
        known.addrport = seen.addrport
        if seen.cores > 0:
            known.cores = seen.cores
        known.rack = (seen.rack or known.rack
                      or self._mapped_rack(seen.hostname, address_of(seen.addrport)))
        self._reindex(known)
        return known

    def learn(self, worker_id: str | None, rack: str | None, addrport: str | None,
              files: Iterable[str] = (), host: str | None = None) -> KnownWorker | None:
        """A bundle ran on this worker (``host``: the name it gives itself) and read
        ``files``."""
        known = self._entry(worker_id, addrport)
        if known is None:
            wid = worker_id or addrport
            if wid is None:
                return None
            known = self.workers[wid] = KnownWorker(wid, rack, named=worker_id is not None)
        known.rack = rack or known.rack
        known.addrport = addrport or known.addrport
        known.host = known.host or self._host(host, known.addrport)
        if known.rack is None:
            known.rack = self._mapped_rack(host, address_of(known.addrport))
        self._reindex(known)
        self.read(known, files)
        return known

    def _entry(self, name: str | None, addrport: str | None) -> KnownWorker | None:
        """The known worker called ``name`` or connected from ``addrport``: an unnamed one
        known by its address takes the name (a result, or a later look, names it), and one
        known by both is folded into the named one."""
        by_addr = self.workers.get(self._by_addr.get(addrport, "")) if addrport else None
        if name is None:
            return by_addr or (self.workers.get(addrport) if addrport else None)
        known = self.workers.get(name)
        if by_addr is None or by_addr is known or by_addr.named:
            return known
        if known is None:
            return self._rename(by_addr, name)
        self._fold(by_addr, known)
        return known

    def _host(self, hostname: str | None, addrport: str | None) -> str | None:
        """A worker's normalised host: its name, or its address; ``here`` for one connected
        over loopback (it runs here, whatever it calls itself)."""
        address = address_of(addrport)
        if address is not None and is_loopback(address):
            return self.here
        name = hostname or address
        return normal_host(name, self.here) if name else None

    def read(self, known: KnownWorker, files: Iterable[str]) -> None:
        """``known`` read ``files``: its caches hold them."""
        for lfn in files:
            if lfn not in known.files_read:
                known.files_read.add(lfn)
                self._readers[lfn].add(known.id)
                self.gains.add((FILE, lfn))

    def unread(self, known: KnownWorker, files: Iterable[str]) -> None:
        """``known`` no longer holds ``files`` (its column cache dropped them): they stop
        making it "cached" for them."""
        for lfn in files:
            if lfn in known.files_read:
                known.files_read.discard(lfn)
                _discard(self._readers, lfn, known.id)
                self.epoch += 1  # a near set shrank

    def expect(self, worker_id: str, pieces: Iterable[str]) -> tuple[str, ...]:
        """A bundle reading ``pieces`` was sent to ``worker_id``: its column cache will hold
        them, so count them as held there from now on (and their files, which make the
        worker a candidate for their tasks, and the files' markers, which make placement
        match that worker's pieces, not its files), before its result says so. A later copy
        of a piece still in flight (the same chunk in a later pass) then goes to that
        worker, or waits for it, instead of being decoded again elsewhere. (Without the
        files, a worker sent its first chunk of a file was no candidate for the file's
        tasks: the planner grouped the chunk's later passes for that worker, and placement,
        finding no worker near, sent them to another, which decoded the chunk again: 4-9
        chunks of a default scale test once bundles for any worker were sent to the
        freest.) Returns the names that were new there: :meth:`expected_back` confirms or
        takes them back once the bundle's result has come or failed."""
        known = self.workers.get(worker_id)
        if known is None:
            return ()
        pieces = tuple(pieces)
        files = [file_of(p) for p in pieces]
        names = dict.fromkeys((*pieces, *files, *(marker_name(f) for f in files)))
        new = tuple(n for n in names if n not in known.files_read)
        self.read(known, new)
        return new

    def expected_back(self, worker_id: str, expected: Iterable[str],
                      reads: Iterable[Mapping[str, object]] = ()) -> None:
        """The bundle that :meth:`expect` counted ``expected`` for has ended: what its read
        records do not say the worker's cache holds (the cache refused or dropped it, or the
        bundle failed: no records) stops counting as held there."""
        known = self.workers.get(worker_id)
        if known is None:
            return
        reported = {r.get("lfn") for r in reads}
        self.unread(known, [n for n in expected if n not in reported])

    def held(self, known: KnownWorker, reads: Iterable[Mapping[str, object]]) -> int:
        """Apply a bundle's read records' news of its worker's column cache
        (:mod:`datavine.io.column_cache`): pieces and files whose columns were all dropped
        there (``dropped``); a cache generation other than the one it reported before (its
        library or capped child was replaced: a cold cache) drops every piece it held.
        Returns how many pieces the cache dropped that it was known to hold: evictions (a
        cache that holds less than the run reads), not the pieces of a drop the manager
        asked for (:meth:`drop_caches` forgot those already)."""
        dropped = [str(r["lfn"]) for r in reads if r.get("dropped")]
        evicted = sum(1 for name in dropped if "@" in name and name in known.files_read)
        for r in reads:
            name = str(r.get("lfn", ""))
            if r.get("server") == "memory" and name.startswith(GENERATION):
                dropped.append(name)  # a name, not a file
                before = self._cache_generation.get(known.id)
                if before is not None and before != name:
                    dropped.extend(f for f in known.files_read if "@" in f)
                self._cache_generation[known.id] = name
        self.unread(known, dropped)
        return evicted

    def drop_caches(self) -> None:
        """Every worker is to empty its column cache (``cluster.drop_caches()``): the next
        bundles carry the new ``cache_epoch``, and no worker counts as holding a file."""
        self.cache_epoch += 1
        for known in self.workers.values():
            self.unread(known, list(known.files_read))

    def _mapped_rack(self, hostname: str | None, address: str | None) -> str | None:
        if self.racks is None:
            return None
        return self.racks.rack_for(hostname, address)

    def _rename(self, known: KnownWorker, name: str) -> KnownWorker:
        """The unnamed worker ``known`` (known by its address) turns out to be ``name``."""
        self._drop(known.id)
        known.id, known.named = name, True
        self.workers[name] = known
        self._reindex(known)
        for lfn in known.files_read:
            self._readers[lfn].add(name)
        return known

    def _fold(self, other: KnownWorker, into: KnownWorker) -> None:
        """The unnamed worker ``other`` is the named worker ``into``: merge them."""
        self._drop(other.id)
        into.host = into.host or other.host
        into.rack = into.rack or other.rack
        into.addrport = into.addrport or other.addrport
        self._reindex(into)
        self.read(into, other.files_read)

    def forget(self, worker_id: str) -> KnownWorker | None:
        """Drop one worker (it left); returns what was known of it."""
        known = self._drop(worker_id)
        self._cache_generation.pop(worker_id, None)
        if known is not None and known.addrport is not None:
            self._settled.discard(known.addrport)
            self.departed[known.addrport] = known.id  # a report names it once, not twice
        return known

    def who_left(self, addrport: str) -> str:
        """The worker that was at ``addrport`` when it left (its name), else the address;
        asked once per departure."""
        return self.departed.pop(addrport, addrport)

    def _drop(self, worker_id: str) -> KnownWorker | None:
        known = self.workers.pop(worker_id, None)
        if known is None:
            return None
        self._unindex(known)
        for lfn in known.files_read:
            readers = self._readers.get(lfn)
            if readers is not None:
                readers.discard(worker_id)
                if not readers:
                    del self._readers[lfn]
        self._view_of.pop(worker_id, None)
        self.epoch += 1  # a worker left (or took a name): near sets shrank
        return known

    def forget_missing(self, alive_addrports: set[str]) -> list[str]:
        """Drop workers whose address is no longer connected; returns their ids."""
        gone = [w.id for w in self.workers.values()
                if w.addrport is not None and w.addrport not in alive_addrports]
        for wid in gone:
            self.forget(wid)
        self._settled &= alive_addrports
        return gone

    # --- what decisions are told --------------------------------------------------------
    # --- what placement sees ------------------------------------------------------------
    def shard_host(self, shard: Shard) -> str | None:
        """The host a shard runs on, as workers' hosts are named: a shard given by an
        address is on the host of the worker that connected from that address."""
        host = self._shard_hosts.get(shard.url)
        if host is None and shard.url not in self._shard_hosts:
            host = self._shard_hosts[shard.url] = shard_host(shard.url, self.here)
            if host is not None:
                self._shard_names.add(host)
        return self._alias.get(host, host) if host is not None else None

    def holder(self, pieces: Iterable[str]) -> str | None:
        """The worker whose caches hold every one of ``pieces`` (the first by name when
        several do; None when none does, or there are no pieces)."""
        common: set[str] | None = None
        for piece in pieces:
            readers = self._readers.get(piece)
            common = set(readers or ()) if common is None else common & (readers or set())
            if not common:
                return None
        return min(common) if common else None

    def near(self, task: TaskInputs) -> list[WorkerView]:
        """Views of every worker that can be near ``task``'s files: those that read one, and
        those on a host or in a rack of the files' shards. Any other worker is far, and a
        decision need not score it (placement sends far bundles anywhere). A worker with
        neither a name nor a rack is left out too: no feature can send a bundle to it.
        O(workers in those racks): decisions use :meth:`candidates`, a few of these."""
        self._check_index()
        ids: set[str] = set()
        for lfn in task.files:
            ids |= self._readers.get(lfn, set())
        for rack in {r for r in task.racks.values() if r is not None}:
            ids |= self._by_rack.get(rack, set())
        for host in {h for h in task.hosts.values() if h is not None}:
            ids |= self._by_host.get(self._alias.get(host, host), set())
        workers = self.workers
        return [self._view(k) for w in ids
                if (k := workers.get(w)) is not None and (k.named or k.rack is not None)]

    def candidates(self, task: TaskInputs) -> list[WorkerView]:
        """The few near workers (:meth:`near`) that :func:`~datavine.scheduler.placement.decide`
        needs to decide as it would on all of them: every worker that read one of the files,
        and from each group of the files' racks and hosts (workers alike but for their load,
        :class:`LeastBusy`) its ``CANDIDATES_PER_GROUP`` best free workers, or one busy
        worker when none is free (it says that the group exists: a tier worth waiting for).
        The decision is the same (its first workers, its first named worker, its rack, its
        tier, holding or not); it names fewer workers. O(readers + groups x log(workers)).
        """
        self._check_index()
        picked: dict[str, None] = {}
        workers = self.workers
        for lfn in task.files:
            for wid in self._readers.get(lfn, ()):
                known = workers.get(wid)
                if known is not None and (known.named or known.rack is not None):
                    picked[wid] = None
        for rack in set(task.racks.values()):
            for group in self._rack_groups.get(rack, ()) if rack is not None else ():
                self._pick(group, picked)
        for host in set(task.hosts.values()):
            for group in (self._host_groups.get(self._alias.get(host, host), ())
                          if host is not None else ()):
                self._pick(group, picked)
        return [self._view(workers[w]) for w in picked]

    def _pick(self, group: Group, picked: dict[str, None]) -> None:
        members = self._groups[group]
        best = members.best(CANDIDATES_PER_GROUP, self._below(group))
        for wid in best or (members.least(),):
            if wid is not None:
                picked[wid] = None

    def _below(self, group: Group) -> int:
        """Bundles in flight to one worker of ``group`` under which it has a free slot."""
        rack: str | None = group[-3]
        cores: int = group[-2]
        return cores * self.bundles_per_core - self._share(rack, cores)

    def _share(self, rack: str | None, cores: int) -> int:
        """A worker's share of the bundles sent to its rack (any worker there may run them),
        by its cores."""
        if rack is None or self._rack_cores.get(rack, 0) <= 0:
            return 0
        return int(self._per_rack.get(rack, 0) * cores / self._rack_cores[rack] + 0.999)

    def wake_keys(self, task: TaskInputs, waits_for: Tier) -> frozenset[WakeKey]:
        """Where room must be gained (:attr:`gains`) before ``task``, held while it
        waits for a worker of tier ``waits_for`` or better, could run: the workers that read
        its files (and their racks' shares), its files (one more reader), and when it waits
        for its rack, the files' racks and hosts (and the shares of the racks on those
        hosts). Room gained anywhere else leaves it held."""
        self._check_index()
        keys: set[WakeKey] = {(FILE, f) for f in task.files}
        workers = self.workers
        for lfn in task.files:
            for wid in self._readers.get(lfn, ()):
                keys.add((WORKER, wid))
                known = workers.get(wid)
                if known is not None and known.rack is not None:
                    keys.add((SHARE, known.rack))
        if waits_for <= Tier.RACK:
            keys.update((RACK, r) for r in task.racks.values() if r is not None)
            for host in {h for h in task.hosts.values() if h is not None}:
                host = self._alias.get(host, host)
                keys.add((HOST, host))
                keys.update((SHARE, g[2]) for g in self._host_groups.get(host, ())
                            if g[2] is not None)
        return frozenset(keys)

    def has_room(self, key: WakeKey) -> bool:
        """Whether some worker behind a wake key (:meth:`wake_keys`) has a free slot now
        (always, for a file: it says a worker read it)."""
        kind, name = key
        if kind == WORKER:
            known = self.workers.get(name)
            return known is not None and self._free(known) > 0
        if kind == FILE:
            return True
        place = self._host_groups if kind == HOST else self._rack_groups
        return any(self._groups[g].any_below(self._below(g)) for g in place.get(name, ()))

    def views(self) -> list[WorkerView]:
        """What placement sees of every worker: its rack, host, free bundle slots and files
        read (decisions use :meth:`candidates`)."""
        self._check_index()
        return [self._view(w) for w in self.workers.values()]

    def _free(self, w: KnownWorker) -> int:
        busy = self._per_worker.get(w.id, 0) + self._share(w.rack, w.cores)
        return w.cores * self.bundles_per_core - busy

    def _view(self, w: KnownWorker) -> WorkerView:
        free = self._free(w)
        view = self._view_of.get(w.id)
        if view is None or view.free_slots != free or view.rack != w.rack or (
                view.host != w.host or view.files_read is not w.files_read):
            view = self._view_of[w.id] = WorkerView(w.id, w.rack, free, w.files_read, w.host)
        return view

    def target(self, placement: Placement) -> Target:
        """The TaskVine target for a ``run`` decision: the best named worker, else the rack."""
        for wid in placement.workers:
            known = self.workers.get(wid)
            if known is not None and known.named:
                return self._target(wid, None)
        if placement.rack is not None:
            return self._target(None, placement.rack)
        for wid in placement.workers:  # cached tier on unnamed workers: their rack
            known = self.workers.get(wid)
            if known is not None and known.rack is not None:
                return Target(rack=known.rack)
        return ANYWHERE

    @property
    def named_out(self) -> bool:
        """Whether a bundle sent to a named worker is out. While none is, bundles for any
        worker go to any worker (TaskVine puts each in a free slot, and no count of the
        manager's is wrong for it), which costs the manager less than naming one (a named
        worker's counts and orders kept up: 10-25 us of decisions a bundle at 256 workers,
        noisy)."""
        return bool(self._per_worker)

    def freest(self) -> Target | None:
        """The target of the connected named worker with the most free bundle slots (an
        idle one first; then the one sent a bundle longest ago, then the smallest id: among
        equals, not always the same one, whose cache would then hold more of the run than
        the others' and end it last), for a bundle that may run anywhere; None when
        some known worker has no name (only TaskVine can send a bundle there) or none has a
        free slot (a worker datavine started that has not connected yet is not waited for).

        A bundle sent anywhere is counted against no worker: TaskVine puts it in a free
        slot the manager does not know of, and the manager then sends a named bundle to
        that worker as though the slot were free. There it waits behind both, while another
        worker runs out of calls (the default scale test: each worker had one call or none
        out for 0.37-0.47 s of its 3 s, and ~20 calls a run found no next call queued). Sent
        to the freest named worker, every bundle counts where it runs. O(racks x kinds of
        worker x log(workers))."""
        if self._unnamed:
            return None
        best: tuple[int, int, str] | None = None
        for (rack, cores), pool in self._named_pools.items():
            room = cores * self.bundles_per_core - self._share(rack, cores)
            for wid in pool.best(1, room):  # the least busy of workers alike: the freest
                key = (-(room - self._per_worker.get(wid, 0)), self._last_sent.get(wid, -1), wid)
                best = key if best is None or key < best else best
        return self._target(best[2], None) if best is not None else None

    def named(self, worker: str) -> Target:
        """The target of one named worker (a backup copy goes to exactly that worker)."""
        return self._target(worker, None)

    def at(self, addrport: str) -> KnownWorker | None:
        """The worker at TaskVine address ``addrport``, if known."""
        wid = self._by_addr.get(addrport)
        return self.workers.get(wid) if wid is not None else None

    def _target(self, worker: str | None, rack: str | None) -> Target:
        """One Target object per worker or rack (a bundle in flight holds one)."""
        key = (worker, rack)
        target = self._targets.get(key)
        if target is None:
            target = self._targets[key] = Target(worker, rack)
        return target

    def sent(self, target: Target) -> None:
        self.inflight[target] += 1
        if target.worker is not None:
            self._per_worker[target.worker] += 1
            self._sent_seq += 1
            self._last_sent[target.worker] = self._sent_seq
            self._regroup(target.worker)
        elif target.rack is not None:
            self._per_rack[target.rack] += 1

    def returned(self, target: Target) -> None:
        """A bundle sent to ``target`` came back (or was given up): its slot is free, which
        is room gained there (:attr:`gains`)."""
        self.inflight[target] -= 1
        if self.inflight[target] <= 0:
            del self.inflight[target]
        counts, key = ((self._per_worker, target.worker) if target.worker is not None else
                       (self._per_rack, target.rack))
        if key is not None:
            counts[key] -= 1
            if counts[key] <= 0:
                del counts[key]
        if target.worker is not None:
            known = self._regroup(target.worker)
            if known is not None:
                self.gains.add((WORKER, known.id))
                if known.rack is not None:
                    self.gains.add((RACK, known.rack))
                if known.host is not None:
                    self.gains.add((HOST, known.host))
        elif target.rack is not None:
            self.gains.add((RACK, target.rack), (SHARE, target.rack))

def counted_tier(placement: Placement, target: Target) -> str:
    """How the run summary counts a bundle placed so: its tier (``cached``, ``host``,
    ``rack``), ``rack`` when only its rack was targeted (any worker there may run it), or
    ``anywhere``."""
    if target == ANYWHERE or placement.tier == Tier.FAR:
        return "anywhere"
    if target.worker is None and placement.tier > Tier.RACK:
        return "rack"
    return placement.tier.name.lower()
