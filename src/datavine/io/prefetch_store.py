"""Byte ranges read ahead for a queued bundle: a bounded store in the memory of the process
that will run it.

While one bundle computes, :mod:`datavine.worker.prefetch` fetches the baskets the next
bundle of the worker will read (the bundle waiting behind it in the library, TaskVine patch
0018) and puts them here; when that bundle runs, its ``root://`` opens read through a
:class:`~datavine.io.source.prefetched.PrefetchedSource`, which takes each range it finds here
(the range leaves the store: its memory is the bundle's from then on) and asks the server for
the rest. A range is kept under the file's *identity* (its ROOT header,
:func:`datavine.io.source.disk.header_identity`), which the bundle reads from the server
itself, so a file that changed in between is never served from here.

Each range belongs to an *owner* (the queued call's sandbox): :meth:`PrefetchStore.drop`
frees what an owner left unread (its bundle ended, or it was cancelled). The store never
holds more than ``max_bytes``: a range that does not fit is refused, and the prefetch stops
there (the bundle reads the rest itself). Thread-safe: ranges arrive on the XRootD client's
threads. Standard library only: imported on workers.
"""

from __future__ import annotations

import threading
from dataclasses import dataclass, field

MB = 2**20
Range = tuple[bytes, int, int]  # (identity, start, stop)


@dataclass
class PrefetchStats:
    """What the store did in this process: bytes fetched ahead and kept, served to a bundle,
    refused (over the bound) and dropped unread."""

    stored_bytes: int = 0
    served_bytes: int = 0
    served_ranges: int = 0
    refused_bytes: int = 0
    dropped_bytes: int = 0


@dataclass
class PrefetchStore:
    """Ranges by (identity, start, stop), each with its owner, within ``max_bytes``."""

    max_bytes: int = 0
    serving: str | None = None  # the owner whose bundle runs now: only its ranges are taken
    stats: PrefetchStats = field(default_factory=PrefetchStats)
    _ranges: dict[Range, tuple[str, bytes]] = field(default_factory=dict)
    _held: int = 0
    _lock: threading.Lock = field(default_factory=threading.Lock)

    @property
    def held_bytes(self) -> int:
        return self._held

    def owners(self) -> set[str]:
        with self._lock:
            return {owner for owner, _ in self._ranges.values()}

    def put(self, owner: str, identity: bytes, start: int, stop: int,
            data: bytes | memoryview) -> bool:
        """Keep ``data`` (the bytes ``[start, stop)`` of the file ``identity``) for
        ``owner``; False when it would take the store over its bound (refused)."""
        start, stop = int(start), int(stop)  # uproot's ranges may be numpy integers
        size = stop - start
        if len(data) != size:
            return False
        with self._lock:
            key = (identity, start, stop)
            if key in self._ranges:
                return True
            if self._held + size > self.max_bytes:
                self.stats.refused_bytes += size
                return False
            self._ranges[key] = (owner, bytes(data))
            self._held += size
            self.stats.stored_bytes += size
            return True

    def take(self, identity: bytes, start: int, stop: int,
             owner: str | None = None) -> bytes | None:
        """The bytes ``[start, stop)`` of the file ``identity`` fetched for ``owner``
        (None: for anyone), removed from the store, or None when they are not here."""
        with self._lock:
            key = (identity, int(start), int(stop))
            entry = self._ranges.get(key)
            if entry is None or (owner is not None and entry[0] != owner):
                return None
            del self._ranges[key]
            self._held -= stop - start
            self.stats.served_bytes += stop - start
            self.stats.served_ranges += 1
            return entry[1]

    def drop(self, owner: str) -> int:
        """Forget what ``owner`` left unread; returns the bytes freed."""
        with self._lock:
            gone = [k for k, (o, _) in self._ranges.items() if o == owner]
            freed = 0
            for key in gone:
                freed += key[2] - key[1]
                del self._ranges[key]
            self._held -= freed
            self.stats.dropped_bytes += freed
            return freed

    def resize(self, max_bytes: int) -> None:
        """Bound the store at ``max_bytes`` from now on (what it holds stays: it was
        fetched for a bundle already queued, and leaves when that bundle ends)."""
        self.max_bytes = max(0, max_bytes)

    def writer(self, owner: str) -> StoreWriter:
        return StoreWriter(self, owner)

    def reader(self) -> StoreReader:
        """The read side for the bundle running now (:attr:`serving`)."""
        return StoreReader(self, self.serving)

    def serves(self) -> bool:
        """Whether the bundle running now has ranges here."""
        owner = self.serving
        with self._lock:
            return owner is not None and any(o == owner for o, _ in self._ranges.values())


@dataclass(frozen=True)
class StoreWriter:
    """The store as the prefetch's source sees it (the interface of
    :class:`datavine.io.disk_cache.DiskCache` that :class:`datavine.io.source.disk.DiskCachedSource`
    uses): nothing is served from it, every range fetched is put in it for ``owner``."""

    store: PrefetchStore
    owner: str

    def get(self, identity: bytes, start: int, stop: int) -> None:
        return None

    def put(self, identity: bytes, start: int, stop: int, data: bytes | memoryview) -> bool:
        return self.store.put(self.owner, identity, start, stop, data)

    def name(self, identity: bytes, lfn: str) -> None:
        return None


@dataclass(frozen=True)
class StoreReader:
    """The store as a bundle's source sees it: ``owner``'s ranges are taken from it,
    nothing is put."""

    store: PrefetchStore
    owner: str | None

    def get(self, identity: bytes, start: int, stop: int) -> bytes | None:
        return self.store.take(identity, start, stop, self.owner)

    def put(self, identity: bytes, start: int, stop: int, data: bytes | memoryview) -> bool:
        return False

    def name(self, identity: bytes, lfn: str) -> None:
        return None


_store = PrefetchStore()  # one per process: the process that runs the bundles


def store() -> PrefetchStore:
    """This process's store."""
    return _store
