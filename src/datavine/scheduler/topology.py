"""The workers the manager knows of, and how a placement decision becomes TaskVine features.

Workers are learned two ways: datavine's own local workers are announced when they start
(name, rack, cores), and every bundle result says which worker ran it (its name and rack,
from :mod:`datavine.scheduler.labels`, and its address from TaskVine). The registry counts the
bundles sent to each worker or rack, so that :func:`datavine.scheduler.placement.decide` sees free
slots, and remembers which files each worker has read (its page cache holds them).

A worker with a name can be targeted exactly (feature ``worker:<id>``); a pool worker
without one only through its rack (feature ``rack:<rack>``).
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterable
from dataclasses import dataclass, field

from datavine.scheduler.labels import rack_feature, worker_feature
from datavine.scheduler.placement import Placement, WorkerView


@dataclass
class KnownWorker:
    """One worker: ``id`` is its datavine name, else its TaskVine address."""

    id: str
    rack: str | None
    cores: int = 1
    named: bool = False  # has the feature worker:<id>
    addrport: str | None = None
    files_read: set[str] = field(default_factory=set)
    # views() hands placement a frozenset per worker per decision; copy the set only when
    # it changed (learn), not for every decision (O(workers) instead of O(files read)).
    frozen: frozenset[str] = field(default_factory=frozenset, repr=False)


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
    """Known workers, bundles in flight per target, files read per worker."""

    def __init__(self, bundles_per_core: int = 2) -> None:
        self.bundles_per_core = bundles_per_core
        self.workers: dict[str, KnownWorker] = {}
        self.inflight: Counter[Target] = Counter()
        self._views: list[WorkerView] | None = None  # until a worker or a count changes
        self._view_of: dict[str, WorkerView] = {}  # last view per worker, reused if unchanged

    def announce(self, worker_id: str, rack: str | None, cores: int) -> None:
        """A named worker datavine started itself (it may not be connected yet)."""
        known = self.workers.setdefault(worker_id, KnownWorker(worker_id, rack, cores, True))
        known.rack, known.cores, known.named = rack, cores, True
        self._views = None

    def learn(self, worker_id: str | None, rack: str | None, addrport: str | None,
              files: Iterable[str] = ()) -> KnownWorker | None:
        """A bundle ran on this worker and read ``files``."""
        wid = worker_id or addrport
        if wid is None:
            return None
        self._views = None
        known = self.workers.get(wid)
        if known is None:
            known = self.workers[wid] = KnownWorker(wid, rack, named=worker_id is not None)
        known.rack = rack or known.rack
        known.addrport = addrport or known.addrport
        before = len(known.files_read)
        known.files_read.update(files)
        if len(known.files_read) != before:
            known.frozen = frozenset(known.files_read)
        return known

    def forget_missing(self, alive_addrports: set[str]) -> list[str]:
        """Drop workers whose address is no longer connected; returns their ids."""
        gone = [w.id for w in self.workers.values()
                if w.addrport is not None and w.addrport not in alive_addrports]
        for wid in gone:
            del self.workers[wid]
        if gone:
            self._views = None
        return gone

    def views(self) -> list[WorkerView]:
        """What placement sees: each worker's rack, free bundle slots and files read.

        Kept until a worker or an in-flight count changes: a loop that holds many bundles
        in a row asks for the same views each time."""
        if self._views is not None and len(self._views) == len(self.workers):
            return self._views  # (a worker deleted from ``workers`` directly changes len)
        rack_cores: Counter[str | None] = Counter()
        for w in self.workers.values():
            rack_cores[w.rack] += w.cores
        # in-flight counts per worker and per rack, read once (not a Target per worker)
        per_worker = {t.worker: n for t, n in self.inflight.items() if t.worker is not None}
        per_rack = {t.rack: n for t, n in self.inflight.items()
                    if t.worker is None and t.rack is not None}
        out = []
        for w in self.workers.values():
            busy = per_worker.get(w.id, 0)
            if w.rack is not None and rack_cores[w.rack]:
                share = per_rack.get(w.rack, 0) * w.cores / rack_cores[w.rack]
                busy += int(share + 0.999)
            free = w.cores * self.bundles_per_core - busy
            view = self._view_of.get(w.id)
            if view is None or (view.rack, view.free_slots, view.files_read) != (
                    w.rack, free, w.frozen):
                view = self._view_of[w.id] = WorkerView(w.id, w.rack, free, w.frozen)
            out.append(view)
        self._views = out
        return out

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
        self._views = None

    def returned(self, target: Target) -> None:
        self._views = None
        self.inflight[target] -= 1
        if self.inflight[target] <= 0:
            del self.inflight[target]
