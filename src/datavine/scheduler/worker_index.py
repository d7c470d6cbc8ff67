"""The indexes of the workers the manager knows (a part of
:class:`~datavine.scheduler.topology.Topology`): by rack, host, TaskVine address and file
read, and the groups of alike workers ordered by bundles in flight, kept as workers come, go
and take bundles, so that a decision costs the same with ten workers or a hundred thousand
(see :mod:`datavine.scheduler.topology`).

Any change of a worker goes through :meth:`WorkerIndexes._reindex`; a worker deleted from
``workers`` directly is noticed by :meth:`WorkerIndexes._check_index`, which rebuilds them.
"""

from __future__ import annotations

from collections import Counter, defaultdict
from typing import Any, TypeVar

from datavine.scheduler.gains import GainLog
from datavine.scheduler.known_workers import KnownWorker
from datavine.scheduler.least_busy import LeastBusy
from datavine.scheduler.racks import address_of, is_loopback, normal_host

# Wake keys (Topology.wake_keys): where room can be gained, as (kind, name).
WORKER, RACK, SHARE, HOST, FILE = "worker", "rack", "share", "host", "file"
# A group of workers ordered by load (LeastBusy): (RACK, rack, cores, named) or
# (HOST, host, rack, cores, named).
Group = tuple[Any, ...]


class WorkerIndexes:
    """The index part of the topology's state; the rest is :class:`Topology`'s."""

    workers: dict[str, KnownWorker]
    here: str
    epoch: int
    gains: GainLog
    _per_worker: Counter[str]
    _shard_names: set[str]

    def _init_indexes(self) -> None:
        self._by_rack: defaultdict[str, set[str]] = defaultdict(set)
        self._rack_cores: Counter[str] = Counter()
        self._by_host: defaultdict[str, set[str]] = defaultdict(set)
        self._readers: defaultdict[str, set[str]] = defaultdict(set)
        self._by_addr: dict[str, str] = {}  # TaskVine address -> worker id
        self._alias: dict[str, str] = {}  # a worker's address -> its host name
        self._indexed: dict[str, tuple[str | None, str | None, int, str | None, bool]] = {}
        # the workers of each group (rack or host, cores, named) by bundles in flight
        self._groups: dict[Group, LeastBusy] = {}
        self._rack_groups: defaultdict[str, set[Group]] = defaultdict(set)
        self._host_groups: defaultdict[str, set[Group]] = defaultdict(set)
        # the named workers connected (TaskVine gave their address), by rack and cores
        # (alike but for their load), least busy first: a bundle for any worker goes to the
        # freest (Topology.freest); and how many known workers have no name
        self._named_pools: dict[tuple[str | None, int], LeastBusy] = {}
        self._unnamed = 0
        self._sent_seq = 0  # counts bundles sent to a named worker
        self._last_sent: dict[str, int] = {}  # worker -> when it last got one (that count)

    def _reindex(self, known: KnownWorker) -> None:
        """Bring the indexes in line with ``known`` after a change (or none: then nothing
        is done, as for most results). A new worker is room gained where it sits; a known
        one that changed (rack, host, cores, name) may change any decision: ``epoch``."""
        entry = (known.rack, known.host, known.cores, known.addrport, known.named)
        before = self._indexed.get(known.id)
        if before == entry:
            return
        if before is not None:
            self._unindex(known)
            self.epoch += 1
        self._index(known)
        if before is None:
            self.gains.add((WORKER, known.id))
            if known.rack is not None:  # its rack's share of rack-wide bundles is spread thinner
                self.gains.add((RACK, known.rack), (SHARE, known.rack))
            if known.host is not None:
                self.gains.add((HOST, known.host))

    def _index(self, known: KnownWorker) -> None:
        wid = known.id
        self._indexed[wid] = (known.rack, known.host, known.cores, known.addrport, known.named)
        if known.rack is not None:
            self._by_rack[known.rack].add(wid)
            self._rack_cores[known.rack] += known.cores
        if known.host is not None:
            self._by_host[known.host].add(wid)
        if known.addrport is not None:
            self._by_addr[known.addrport] = wid
            address = address_of(known.addrport)
            if known.host is not None and address is not None and not is_loopback(address):
                alias = normal_host(address, self.here)
                if self._alias.get(alias) != known.host:
                    self._alias[alias] = known.host
                    if alias in self._shard_names:  # that shard's host is now this one's
                        self.epoch += 1
        busy = self._per_worker.get(wid, 0)
        for group in self._groups_of(known.rack, known.host, known.cores, known.named):
            members = self._groups.get(group)
            if members is None:
                members = self._groups[group] = LeastBusy()
                place = self._rack_groups if group[0] == RACK else self._host_groups
                place[group[1]].add(group)
                if group[0] == HOST and any(self._alias.get(n, n) == group[1]
                                            for n in self._shard_names):
                    self.epoch += 1  # a shard's host in a new rack: wake keys change
            members.put(wid, busy)
        if known.named and known.addrport is not None:
            self._named_pools.setdefault((known.rack, known.cores), LeastBusy())
            self._put_named(wid, known.rack, known.cores, busy)
        elif not known.named:
            self._unnamed += 1

    def _unindex(self, known: KnownWorker) -> None:
        entry = self._indexed.pop(known.id, None)
        if entry is None:
            return
        rack, host, cores, addrport, named = entry
        if named and addrport is not None:
            pool = self._named_pools.get((rack, cores))
            if pool is not None:
                pool.remove(known.id)
                if not pool:
                    del self._named_pools[(rack, cores)]
        elif not named:
            self._unnamed -= 1
        if rack is not None:
            _discard(self._by_rack, rack, known.id)
            self._rack_cores[rack] -= cores
            if self._rack_cores[rack] <= 0:
                del self._rack_cores[rack]
        if host is not None:
            _discard(self._by_host, host, known.id)
        if addrport is not None and self._by_addr.get(addrport) == known.id:
            del self._by_addr[addrport]
        for group in self._groups_of(rack, host, cores, named):
            members = self._groups.get(group)
            if members is not None:
                members.remove(known.id)
                if not members:
                    del self._groups[group]
                    place = self._rack_groups if group[0] == RACK else self._host_groups
                    _discard(place, group[1], group)

    @staticmethod
    def _groups_of(rack: str | None, host: str | None, cores: int,
                   named: bool) -> list[Group]:
        """The groups a worker is ordered in (:class:`LeastBusy`): its rack's and its
        host's, split by cores and naming. A worker with neither a name nor a rack is in
        none: no feature can send a bundle to it."""
        if not named and rack is None:
            return []
        groups: list[Group] = []
        if rack is not None:
            groups.append((RACK, rack, cores, named))
        if host is not None:
            groups.append((HOST, host, rack, cores, named))
        return groups

    def _check_index(self) -> None:
        """Rebuild the indexes when ``workers`` was changed behind the topology's back (a
        worker deleted directly changes its length; anything else goes through here)."""
        if len(self._indexed) == len(self.workers):
            return
        for index in (self._indexed, self._by_rack, self._rack_cores, self._by_host,
                      self._by_addr, self._readers, self._groups, self._rack_groups,
                      self._host_groups, self._named_pools):
            index.clear()
        self._unnamed = 0
        for known in self.workers.values():
            self._index(known)
            for lfn in known.files_read:
                self._readers[lfn].add(known.id)
        self.epoch += 1


    def _regroup(self, wid: str) -> KnownWorker | None:
        """``wid``'s bundles in flight changed: its place in its groups too."""
        entry = self._indexed.get(wid)
        if entry is None:
            return None
        busy = self._per_worker.get(wid, 0)
        for group in self._groups_of(*entry[:3], entry[4]):
            self._groups[group].put(wid, busy)
        if entry[4] and entry[3] is not None:
            self._put_named(wid, entry[0], entry[2], busy)
        return self.workers.get(wid)

    def _put_named(self, wid: str, rack: str | None, cores: int, busy: int) -> None:
        """A connected named worker's place among the workers alike, by ``busy`` and then
        by when it last got a bundle (:meth:`Topology.freest`)."""
        self._named_pools[(rack, cores)].put(wid, busy, self._last_sent.get(wid, -1))


T = TypeVar("T")


def _discard(index: defaultdict[str, set[T]], key: str, member: T) -> None:
    members = index.get(key)
    if members is not None:
        members.discard(member)
        if not members:
            del index[key]
