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
:func:`datavine.scheduler.placement.decide` sees free slots, remembers which files each worker
has read (its page cache holds them), and indexes workers by rack, host and file read, so that
a decision scores only the workers that can be near a bundle's files (:meth:`Topology.near`),
not every worker.

A worker with a name can be targeted exactly (feature ``worker:<id>``); a pool worker
without one only through its rack (feature ``rack:<rack>``).
"""

from __future__ import annotations

from collections import Counter, defaultdict
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

from datavine.io.shards import Shard
from datavine.scheduler.labels import labels_of, rack_feature, worker_feature
from datavine.scheduler.placement import Placement, TaskInputs, Tier, WorkerView, shard_host
from datavine.scheduler.racks import RackMap, address_of, is_loopback, normal_host


@dataclass
class KnownWorker:
    """One worker: ``id`` is its datavine name, else its TaskVine address; ``host`` its
    normalised host name."""

    id: str
    rack: str | None
    cores: int = 1
    named: bool = False  # has the feature worker:<id>
    addrport: str | None = None
    files_read: set[str] = field(default_factory=set)
    # views() hands placement a frozenset per worker per decision; copy the set only when
    # it changed (learn), not for every decision (O(workers) instead of O(files read)).
    frozen: frozenset[str] = field(default_factory=frozenset, repr=False)
    host: str | None = None


@dataclass(frozen=True)
class SeenWorker:
    """One entry of TaskVine's list of connected workers, as placement needs it.

    ``complete``: the worker reported its resources, which it does after its features (one
    ordered stream): its name and rack, if it has any, are known."""

    addrport: str
    hostname: str | None
    cores: int
    name: str | None = None
    rack: str | None = None
    complete: bool = True

    @classmethod
    def from_status(cls, entry: Mapping[str, Any]) -> SeenWorker | None:
        """From an entry of ``Manager.status("workers")``; None when it names no address.
        Its ``features`` (a list, from a TaskVine that lists them) may be missing."""
        addrport = entry.get("addrport")
        if not isinstance(addrport, str) or not addrport:
            return None
        hostname = entry.get("hostname")
        hostname = hostname if isinstance(hostname, str) and hostname != "unknown" else None
        cores = entry.get("cores_total", entry.get("ncpus", 0))
        cores = cores if isinstance(cores, int) and not isinstance(cores, bool) else 0
        features = entry.get("features")
        name, rack = labels_of(f for f in features if isinstance(f, str)) if isinstance(
            features, list) else (None, None)
        return cls(addrport, hostname, max(cores, 0), name, rack, complete=cores > 0)


@dataclass(frozen=True)
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


class Topology:
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
        # indexes, kept as workers change (rebuilt if ``workers`` was changed directly)
        self._by_rack: defaultdict[str, set[str]] = defaultdict(set)
        self._rack_cores: Counter[str] = Counter()
        self._by_host: defaultdict[str, set[str]] = defaultdict(set)
        self._readers: defaultdict[str, set[str]] = defaultdict(set)
        self._by_addr: dict[str, str] = {}  # TaskVine address -> worker id
        self._alias: dict[str, str] = {}  # a worker's address -> its host name
        self._indexed: dict[str, tuple[str | None, str | None, int, str | None]] = {}
        self._settled: set[str] = set()  # addresses seen complete in TaskVine's list
        self._shard_hosts: dict[str, str | None] = {}  # shard URL -> normalised host

    # --- learning -----------------------------------------------------------------------
    def announce(self, worker_id: str, rack: str | None, cores: int,
                 host: str | None = None) -> None:
        """A named worker datavine started itself (it may not be connected yet); ``rack``
        None keeps a rack learned otherwise."""
        known = self.workers.get(worker_id)
        if known is None:
            known = self.workers[worker_id] = KnownWorker(worker_id, rack, cores, True)
        self._unindex(known)
        known.rack = rack if rack is not None else known.rack
        known.cores, known.named = cores, True
        if host:
            known.host = normal_host(host, self.here)
        self._index(known)

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
        self._unindex(known)
        known.host = self._host(seen.hostname, seen.addrport) or known.host
        known.addrport = seen.addrport
        if seen.cores > 0:
            known.cores = seen.cores
        known.rack = (seen.rack or known.rack
                      or self._mapped_rack(seen.hostname, address_of(seen.addrport)))
        self._index(known)
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
        self._unindex(known)
        known.rack = rack or known.rack
        known.addrport = addrport or known.addrport
        known.host = known.host or self._host(host, known.addrport)
        if known.rack is None:
            known.rack = self._mapped_rack(host, address_of(known.addrport))
        self._index(known)
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
        before = len(known.files_read)
        for lfn in files:
            if lfn not in known.files_read:
                known.files_read.add(lfn)
                self._readers[lfn].add(known.id)
        if len(known.files_read) != before:
            known.frozen = frozenset(known.files_read)

    def _mapped_rack(self, hostname: str | None, address: str | None) -> str | None:
        if self.racks is None:
            return None
        return self.racks.rack_for(hostname, address)

    def _rename(self, known: KnownWorker, name: str) -> KnownWorker:
        """The unnamed worker ``known`` (known by its address) turns out to be ``name``."""
        self._drop(known.id)
        known.id, known.named = name, True
        self.workers[name] = known
        self._index(known)
        for lfn in known.files_read:
            self._readers[lfn].add(name)
        return known

    def _fold(self, other: KnownWorker, into: KnownWorker) -> None:
        """The unnamed worker ``other`` is the named worker ``into``: merge them."""
        self._drop(other.id)
        self._unindex(into)
        into.host = into.host or other.host
        into.rack = into.rack or other.rack
        into.addrport = into.addrport or other.addrport
        self._index(into)
        self.read(into, other.files_read)

    def forget(self, worker_id: str) -> KnownWorker | None:
        """Drop one worker (it left); returns what was known of it."""
        known = self._drop(worker_id)
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
        return known

    def forget_missing(self, alive_addrports: set[str]) -> list[str]:
        """Drop workers whose address is no longer connected; returns their ids."""
        gone = [w.id for w in self.workers.values()
                if w.addrport is not None and w.addrport not in alive_addrports]
        for wid in gone:
            self.forget(wid)
        self._settled &= alive_addrports
        return gone

    # --- indexes ------------------------------------------------------------------------
    def _index(self, known: KnownWorker) -> None:
        wid = known.id
        self._indexed[wid] = (known.rack, known.host, known.cores, known.addrport)
        if known.rack is not None:
            self._by_rack[known.rack].add(wid)
            self._rack_cores[known.rack] += known.cores
        if known.host is not None:
            self._by_host[known.host].add(wid)
        if known.addrport is not None:
            self._by_addr[known.addrport] = wid
            address = address_of(known.addrport)
            if known.host is not None and address is not None and not is_loopback(address):
                self._alias[normal_host(address, self.here)] = known.host

    def _unindex(self, known: KnownWorker) -> None:
        entry = self._indexed.pop(known.id, None)
        if entry is None:
            return
        rack, host, cores, addrport = entry
        if rack is not None:
            _discard(self._by_rack, rack, known.id)
            self._rack_cores[rack] -= cores
            if self._rack_cores[rack] <= 0:
                del self._rack_cores[rack]
        if host is not None:
            _discard(self._by_host, host, known.id)
        if addrport is not None and self._by_addr.get(addrport) == known.id:
            del self._by_addr[addrport]

    def _check_index(self) -> None:
        """Rebuild the indexes when ``workers`` was changed behind the topology's back (a
        worker deleted directly changes its length; anything else goes through here)."""
        if len(self._indexed) == len(self.workers):
            return
        for index in (self._indexed, self._by_rack, self._rack_cores, self._by_host,
                      self._by_addr, self._readers):
            index.clear()
        for known in self.workers.values():
            self._index(known)
            for lfn in known.files_read:
                self._readers[lfn].add(known.id)

    # --- what placement sees ------------------------------------------------------------
    def shard_host(self, shard: Shard) -> str | None:
        """The host a shard runs on, as workers' hosts are named: a shard given by an
        address is on the host of the worker that connected from that address."""
        host = self._shard_hosts.get(shard.url)
        if host is None and shard.url not in self._shard_hosts:
            host = self._shard_hosts[shard.url] = shard_host(shard.url, self.here)
        return self._alias.get(host, host) if host is not None else None

    def near(self, task: TaskInputs) -> list[WorkerView]:
        """Views of the workers that can be near ``task``'s files: those that read one, and
        those on a host or in a rack of the files' shards. Any other worker is far, and a
        decision need not score it (placement sends far bundles anywhere). A worker with
        neither a name nor a rack is left out too: no feature can send a bundle to it."""
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

    def views(self) -> list[WorkerView]:
        """What placement sees of every worker: its rack, host, free bundle slots and files
        read (decisions use :meth:`near`)."""
        self._check_index()
        return [self._view(w) for w in self.workers.values()]

    def _view(self, w: KnownWorker) -> WorkerView:
        busy = self._per_worker.get(w.id, 0)
        rack = w.rack
        if rack is not None and self._rack_cores.get(rack, 0) > 0:
            share = self._per_rack.get(rack, 0) * w.cores / self._rack_cores[rack]
            busy += int(share + 0.999)
        free = w.cores * self.bundles_per_core - busy
        view = self._view_of.get(w.id)
        if view is None or (view.rack, view.free_slots, view.files_read, view.host) != (
                w.rack, free, w.frozen, w.host):
            view = self._view_of[w.id] = WorkerView(w.id, w.rack, free, w.frozen, w.host)
        return view

    def target(self, placement: Placement) -> Target:
        """The TaskVine target for a ``run`` decision: the best named worker, else the rack."""
        for wid in placement.workers:
            known = self.workers.get(wid)
            if known is not None and known.named:
                return Target(worker=wid)
        if placement.rack is not None:
            return Target(rack=placement.rack)
        for wid in placement.workers:  # cached tier on unnamed workers: their rack
            known = self.workers.get(wid)
            if known is not None and known.rack is not None:
                return Target(rack=known.rack)
        return ANYWHERE

    def sent(self, target: Target) -> None:
        self.inflight[target] += 1
        if target.worker is not None:
            self._per_worker[target.worker] += 1
        elif target.rack is not None:
            self._per_rack[target.rack] += 1

    def returned(self, target: Target) -> None:
        self.inflight[target] -= 1
        if self.inflight[target] <= 0:
            del self.inflight[target]
        counts, key = ((self._per_worker, target.worker) if target.worker is not None else
                       (self._per_rack, target.rack))
        if key is not None:
            counts[key] -= 1
            if counts[key] <= 0:
                del counts[key]


def counted_tier(placement: Placement, target: Target) -> str:
    """How the run summary counts a bundle placed so: its tier (``cached``, ``host``,
    ``rack``), ``rack`` when only its rack was targeted (any worker there may run it), or
    ``anywhere``."""
    if target == ANYWHERE or placement.tier == Tier.FAR:
        return "anywhere"
    if target.worker is None and placement.tier > Tier.RACK:
        return "rack"
    return placement.tier.name.lower()


def _discard(index: defaultdict[str, set[str]], key: str, wid: str) -> None:
    members = index.get(key)
    if members is not None:
        members.discard(wid)
        if not members:
            del index[key]
