"""The worker's disk in front of a remote file: an uproot source that keeps the ranges it fetched.

:class:`DiskCachedSource` wraps the uproot source of a ``root://`` file (uproot's
``XRootDSource``, :mod:`datavine.io.source.handles`) and serves each byte range uproot asks
for from the worker's :class:`~datavine.io.disk_cache.DiskCache` when it is there; the ranges
that are not are fetched by the wrapped source, handed to uproot as they arrive (its
pipelining is kept: a chunk is stored in the thread that filled it, then passed on) and
kept. :mod:`datavine.io.reading` puts it in front of every ``root://`` open of a bundle that
has a cache (``RunConfig.input_cache_mb``).

Which file: the file's *identity*, read from its header (:func:`header_identity`: its ROOT
UUID, its length and the rest of the header's fields, which a rewrite in place moves). The
header itself (the first range uproot reads, bytes 0 to 403) always comes from the server:
a changed or replaced file has another identity, so nothing of the old one is served for
it. Until the header is read (a source used without ``uproot.open``) every range goes to
the server, uncached.

Counts: ``num_requested_bytes`` is what the server was asked for (what the run summary
counts near or far, :func:`datavine.io.source.base.bytes_requested`), ``num_disk_bytes`` what
the disk served (:func:`~datavine.io.source.base.bytes_from_disk`). Imported on workers, and
only where a file is opened through the cache (it imports uproot).
"""

from __future__ import annotations

import contextlib
import hashlib
import struct

import uproot

from datavine.io.disk_cache import IDENTITY_BYTES, DiskCache
from datavine.io.source.wrapped import Chunk, Notifications, WrappedSource

# the ROOT file header, as uproot reads it (uproot.reading): small (32-bit) and big pointers
_SMALL = struct.Struct(">4siiiiiiiBiiiH16s")
_BIG = struct.Struct(">4siiqqiiiBiqiH16s")
BIG_VERSION = 1000000  # fVersion at and above which the header's pointers are 64-bit


def header_identity(header: bytes | memoryview) -> bytes | None:
    """16 bytes naming one version of a ROOT file, from its first bytes: a digest of its
    header (magic, version, fBEGIN, fEND, fSeekFree, fNbytesFree, nfree, fNbytesName, fUnits,
    fCompress, fSeekInfo, fNbytesInfo, UUID); None when they are not a ROOT header."""
    data = bytes(header[:_BIG.size])
    if len(data) < _SMALL.size or data[:4] != b"root":
        return None
    layout = _SMALL
    if _SMALL.unpack_from(data)[1] >= BIG_VERSION:
        if len(data) < _BIG.size:
            return None
        layout = _BIG
    return hashlib.blake2b(data[:layout.size], digest_size=IDENTITY_BYTES).digest()


class DiskCachedSource(WrappedSource):
    """``inner`` (an open uproot source of a remote file) with ``cache`` in front of it."""

    def __init__(self, inner: uproot.source.chunk.Source, cache: DiskCache,
                 name: str | None = None) -> None:
        super().__init__(inner)
        self._cache = cache
        self._name = name  # the file's logical name, noted beside its ranges
        self._identity: bytes | None = None
        self._num_disk_bytes = 0

    # --- what uproot asks -------------------------------------------------------------------
    def chunk(self, start: int, stop: int) -> uproot.source.chunk.Chunk:
        if self._identity is not None:
            kept = self._cache.get(self._identity, start, stop)
            if kept is not None:
                self._num_disk_bytes += len(kept)
                return Chunk(self, start, stop, uproot.source.futures.TrivialFuture(kept))
        chunk = self._inner.chunk(start, stop)
        if self._identity is None and start == 0:  # the header: which file this is
            data = _filled(chunk)
            if data is not None:
                self._identity = header_identity(data)
            if self._identity is not None and self._name is not None:
                self._cache.name(self._identity, self._name)
            return chunk
        self._keep(chunk)
        return chunk

    def chunks(self, ranges: list[tuple[int, int]], notifications: Notifications,
               ) -> list[uproot.source.chunk.Chunk]:
        if self._identity is None:
            return list(self._inner.chunks(ranges, notifications))
        served: dict[tuple[int, int], uproot.source.chunk.Chunk] = {}
        for start, stop in dict.fromkeys(ranges):
            data = self._cache.get(self._identity, start, stop)
            if data is not None:
                self._num_disk_bytes += len(data)
                served[start, stop] = Chunk(self, start, stop,
                                            uproot.source.futures.TrivialFuture(data))
        missing = [r for r in ranges if r not in served]
        fetched = iter(self._inner.chunks(missing, _Keeper(self, notifications))
                       if missing else ())
        out = []
        for r in ranges:
            if r in served:
                out.append(served[r])
                notifications.put(served[r])
            else:
                out.append(next(fetched))
        return out

    def _keep(self, chunk: uproot.source.chunk.Chunk) -> None:
        """Store a filled chunk's bytes (all of them, or nothing)."""
        identity = self._identity
        if identity is None:
            return
        data = _filled(chunk)
        if data is not None:
            self._cache.put(identity, chunk.start, chunk.stop, data)

    @property
    def num_disk_bytes(self) -> int:
        """Bytes served from the disk so far."""
        return self._num_disk_bytes


class _Keeper:
    """Stands in for uproot's notification queue in front of the wrapped source: each chunk
    it fills is stored, then passed on to uproot's queue."""

    def __init__(self, source: DiskCachedSource, notifications: Notifications) -> None:
        self._source = source
        self._notifications = notifications

    def put(self, chunk: uproot.source.chunk.Chunk) -> None:
        with contextlib.suppress(Exception):  # never in uproot's way: the chunk goes on
            self._source._keep(chunk)
        self._notifications.put(chunk)


def _filled(chunk: uproot.source.chunk.Chunk) -> bytes | memoryview | None:
    """A filled chunk's bytes when it holds all of its range; None when it is short or its
    read failed (uproot raises that where it reads the chunk)."""
    try:
        data = chunk.raw_data
    except Exception:  # a failed read: uproot raises it where it reads the chunk
        return None
    return memoryview(data).cast("B") if len(data) == chunk.stop - chunk.start else None
