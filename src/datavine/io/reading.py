"""Reading input files: the one entry point, choosing the way to each file and accounting it.

Every read of an input goes through :func:`open_served` (after ``uproot.reading``, which
picks an ``uproot.source``): :func:`source_for` picks the way to the file
(:mod:`datavine.io.source`: a local path as it is, a ``root://`` URL on its XCache shard with
fast failover when there is a shard map, else as given), the way opens it with an opener
(:mod:`datavine.io.source.handles`), and the open is recorded in the bundle's
:class:`ReadContext`. Its callers:

- :func:`open_input` (``datavine.open_input``): task code, an uproot file;
- :func:`open_source`: an uproot source, for :class:`datavine.coffea.DatavineSource`;
- :mod:`datavine.apps.analysis.sources`, which also reports who served each chunk.

Inside a datavine bundle the runtime has installed a :class:`ReadContext` (:func:`reading`:
the run's shard map and this process's shard health, which persists across bundles). Each
open is recorded with the bytes its handle requested; the bundle's result carries these
:class:`ReadRecord` back, and the run summary counts them near (a local file, or a shard in
the worker's rack) or far (another rack's shard, the origin, a direct URL). A read that
fails after its open is failed over by the caller (:meth:`ReadContext.fail_shards_since`).
With a bound on the worker's disk cache (``RunConfig.input_cache_mb``,
:mod:`datavine.io.disk_cache`) every ``root://`` file opened with this module's openers
reads through :class:`~datavine.io.source.disk.DiskCachedSource`: the ranges kept on the
worker's disk come from there (a record's ``disk`` bytes), the rest from the server (its
``bytes``), and are kept.
Outside a bundle (on the client, in a plain loop) nothing is recorded and, without a
``shardmap``, files are opened as given.

Imported on workers: uproot and XRootD are imported only when a file is opened.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterable, Iterator, Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, NamedTuple

from datavine.io import column_cache, disk_cache, prefetch_store
from datavine.io.shards import ShardHealth, ShardMap, logical_name
from datavine.io.source.base import (
    UNSHARDED,
    H,
    Opener,
    OpenRecord,
    Source,
    bytes_from_disk,
    bytes_prefetched,
    bytes_requested,
    is_input_error,
    raised_in_xrootd_client,
    seconds_reading,
)
from datavine.io.source.handles import is_xrootd, make_source, open_file
from datavine.io.source.local import LocalSource
from datavine.protocol import ReadRecordDict

if TYPE_CHECKING:  # uproot ships no types: to mypy these are Any
    import uproot

MEMORY = "memory"  # a read record's server for columns served by the column cache alone

__all__ = [
    "Opened", "ReadContext", "ReadRecord", "current", "is_input_error", "open_input",
    "open_served", "open_source", "raised_in_xrootd_client", "reading", "shard_health",
    "source_for",
]


@dataclass(frozen=True)
class ReadRecord:
    """One input opened by a task: where from, how many bytes, after how many failovers.

    What a bundle's result carries back (as a dict); the run summary, the dashboard and the
    network findings read these fields."""

    lfn: str
    server: str  # shard name, "origin", "local" or "direct"
    rack: str | None  # rack of that server (None: origin, local file or direct URL)
    bytes: int  # asked of the server (not those the worker's disk served)
    failovers: int = 0
    errors: tuple[tuple[str, str], ...] = ()
    # the column cache (datavine.io.column_cache): decoded bytes served from this process's
    # memory and decoded from the file; the file's columns all left the cache
    cached: int = 0
    decoded: int = 0
    dropped: bool = False
    disk: int = 0  # bytes the worker's disk served (datavine.io.disk_cache)
    prefetched: int = 0  # of ``bytes``, those read ahead of the bundle (worker/prefetch.py)
    # seconds the server took for the rest of ``bytes``, requests outstanding
    # (datavine.io.source.timed: root:// files; 0 for the others)
    read_s: float = 0.0

    def as_dict(self) -> ReadRecordDict:
        """The record as a bundle's result carries it (``dataclasses.asdict``, typed)."""
        return ReadRecordDict(lfn=self.lfn, server=self.server, rack=self.rack,
                              bytes=self.bytes, failovers=self.failovers, errors=self.errors,
                              cached=self.cached, decoded=self.decoded, dropped=self.dropped,
                              disk=self.disk, prefetched=self.prefetched,
                              read_s=self.read_s)


class Opened(NamedTuple):
    """One open in a :class:`ReadContext`: the handle (its bytes are read at the end) and
    where it came from."""

    handle: object
    lfn: str
    server: str
    rack: str | None
    failovers: int
    errors: tuple[tuple[str, str], ...]


@dataclass
class ReadContext:
    """What tasks in this process read through; installed by the runtime per bundle."""

    shardmap: ShardMap | None = None
    health: ShardHealth = field(default_factory=ShardHealth)
    opened: list[Opened] = field(default_factory=list)
    avoid: frozenset[str] = frozenset()  # shards this bundle reads around (BundleSpec.avoid)
    # column cache use by logical file name: [decoded bytes served from it, decoded from files]
    cache_use: dict[str, list[int]] = field(default_factory=dict)
    pieces: set[str] = field(default_factory=set)  # entry ranges read through the cache
    disk: disk_cache.DiskCache | None = None  # the worker's disk cache (None: off)

    def add(self, handle: object, record: OpenRecord) -> None:
        self.opened.append(Opened(handle, record.lfn, record.server, record.rack,
                                  record.failovers, record.errors))

    def note_cache(self, lfn: str, cached: int, decoded: int, piece: str | None = None) -> None:
        """A read of ``lfn`` (of its entry range ``piece``,
        :func:`datavine.io.column_cache.piece_name`) took ``cached`` decoded bytes from the
        column cache and decoded ``decoded`` bytes from the file."""
        use = self.cache_use.setdefault(lfn, [0, 0])
        use[0] += cached
        use[1] += decoded
        if piece is not None:
            self.pieces.add(piece)

    def records(self) -> list[ReadRecord]:
        """The reads so far, with the bytes each file's source was asked for; the column
        cache's use is on each file's first open, and a file read from the cache alone has
        a record of server ``"memory"``. So has each entry range read through the cache that
        this process now holds (its ``lfn`` the piece's name,
        :func:`datavine.io.column_cache.piece_name`, and a marker of its file's,
        :func:`~datavine.io.column_cache.marker_name`: what placement learns a worker holds),
        each piece or marker whose columns all left the cache (``dropped``), the cache's
        generation (``@cache/PID/TIME``: a new one on a worker holds nothing reported before),
        and, in this process's first bundle, each file whose bytes the worker's disk holds
        (:func:`datavine.io.disk_cache.take_held_names`)."""
        out, noted = [], set()
        for o in self.opened:
            cached, decoded = (self.cache_use.get(o.lfn, (0, 0)) if o.lfn not in noted
                               else (0, 0))
            noted.add(o.lfn)
            out.append(ReadRecord(o.lfn, o.server, o.rack, bytes_requested(o.handle),
                                  o.failovers, o.errors, cached, decoded,
                                  disk=bytes_from_disk(o.handle),
                                  prefetched=bytes_prefetched(o.handle),
                                  read_s=seconds_reading(o.handle)))
        out.extend(ReadRecord(lfn, MEMORY, None, 0, cached=use[0], decoded=use[1])
                   for lfn, use in self.cache_use.items() if lfn not in noted)
        cache = column_cache.cache()
        held = sorted(p for p in self.pieces if cache.holds(p))
        markers = {column_cache.marker_name(column_cache.file_of(p)) for p in held}
        out.extend(ReadRecord(name, MEMORY, None, 0) for name in (*held, *sorted(markers)))
        out.extend(ReadRecord(name, MEMORY, None, 0, dropped=True)
                   for name in sorted(cache.take_dropped()))
        if cache.max_bytes or cache.entries:  # which cache this is (a replaced one is cold)
            out.append(ReadRecord(cache.generation, MEMORY, None, 0))
        # the files whose bytes the worker's disk holds, once per process (placement's
        # "cached" tier for them, in a new manager's run too)
        out.extend(ReadRecord(lfn, MEMORY, None, 0) for lfn in disk_cache.take_held_names())
        return out

    def shards_since(self, start: int = 0) -> list[str]:
        """Shards (not local files, direct URLs or the origin) opened after the first
        ``start`` opens."""
        return [o.server for o in self.opened[start:] if o.server not in UNSHARDED]

    def fail_shards_since(self, start: int, message: str, now: float) -> None:
        """A read failed after the first ``start`` opens: the shards opened since cool down
        in this process's health, and each of those opens notes ``message`` as a failover
        (the run summary counts it; the library learns the shard)."""
        for i in range(start, len(self.opened)):
            o = self.opened[i]
            if o.server in UNSHARDED:
                continue
            self.health.mark_failed(o.server, now)
            self.opened[i] = o._replace(errors=(*o.errors, (o.server, message)))


_context: ReadContext | None = None
_health = ShardHealth()  # one per process: a failed shard stays cooled down across bundles


def current() -> ReadContext | None:
    """The read context of the bundle running in this process, or None outside a bundle."""
    return _context


def shard_health() -> ShardHealth:
    """This process's shard health (shared by all its bundles)."""
    return _health


@contextlib.contextmanager
def reading(shardmap: ShardMap | None, avoid: Iterable[str] = (), cache_mb: float = 0.0,
            cache_epoch: int = 0, cache_rss_mb: float = 0.0,
            input_cache_mb: float = 0.0) -> Iterator[ReadContext]:
    """Install a read context for the duration of one bundle; its opens try the shards
    named in ``avoid`` last. ``cache_mb``, ``cache_epoch``: the bundle's bound on this
    process's column cache and the cluster's cache epoch
    (:func:`datavine.io.column_cache.configure`); ``cache_rss_mb``: the process's RSS the
    cache leaves at most when the bundle's reads are done
    (:func:`~datavine.io.column_cache.settle`); ``input_cache_mb``: the bound on the
    worker's disk cache of input bytes (0: off; :func:`datavine.io.disk_cache.configure`,
    which the cache epoch empties too)."""
    global _context
    cache = column_cache.configure(int(cache_mb * column_cache.MB), cache_epoch)
    disk = disk_cache.configure(input_cache_mb, cache_epoch)
    previous = _context
    _context = ReadContext(shardmap, _health, avoid=frozenset(avoid), disk=disk)
    try:
        yield _context
    finally:
        _context = previous
        if cache_rss_mb > 0:
            column_cache.settle(cache, int(cache_rss_mb * column_cache.MB))


def source_for(url: str, shardmap: ShardMap | None) -> Source:
    """The way to ``url``: a local path as it is; a URL through ``shardmap``'s XCache shards
    (with this process's shard health) when there is one, else as given."""
    if "://" not in url:
        return LocalSource()
    # Imported here: importing them sets the XRootD client's environment, which only
    # processes that open URLs need.
    if shardmap is None:
        from datavine.io.source.xrootd import DirectSource

        return DirectSource()
    from datavine.io.source.xcache import ShardedSource

    avoid = _context.avoid if _context is not None else frozenset()
    return ShardedSource(shardmap, _health, avoid=avoid)


def open_served(url: str, *, shardmap: ShardMap | None = None,
                opener: Opener[H] = open_file, **options: object) -> tuple[H, OpenRecord]:
    """Open ``url`` the way :func:`source_for` picks, with ``opener(target, **options)``
    (default: ``uproot.open``); returns the handle and how it was opened, recorded in the
    bundle's read context. ``shardmap`` overrides the run's (``RunConfig.shardmap``)."""
    return _open_served(url, shardmap, opener, options)


def _open_served(url: str, shardmap: ShardMap | None, opener: Opener[H],
                 options: Mapping[str, object]) -> tuple[H, OpenRecord]:
    ctx = _context
    shards = shardmap if shardmap is not None else (ctx.shardmap if ctx is not None else None)
    if ctx is not None and is_xrootd(url) and opener in (open_file, make_source):
        options = {**options, "wrap": _wraps(ctx, logical_name(url), options.get("wrap"))}
    handle, record = source_for(url, shards).open(url, opener, **options)
    if ctx is not None:
        ctx.add(handle, record)
    return handle, record


def _wraps(ctx: ReadContext, lfn: str, given: object) -> Callable[[object], object]:
    """What a bundle's ``root://`` source of the file ``lfn`` reads through, from the server
    out (uproot imported here): ``given`` (the caller's wrap, if any); the read clock
    (:class:`~datavine.io.source.timed.TimedSource`: the server's time, for the shards'
    pace); the worker's disk when it has a cache; the ranges read ahead
    (:mod:`datavine.io.prefetch_store`) when the store serves this bundle."""
    from datavine.io.source.timed import TimedSource

    layers: list[Callable[[object], object]] = [given] if callable(given) else []
    layers.append(TimedSource)
    if ctx.disk is not None:
        from datavine.io.source.disk import DiskCachedSource

        cache = ctx.disk
        layers.append(lambda source: DiskCachedSource(source, cache, lfn))
    if prefetch_store.store().serves():
        from datavine.io.source.prefetched import PrefetchedSource

        layers.append(lambda source: PrefetchedSource(source, prefetch_store.store(), lfn))

    def wrap(source: object) -> object:
        for layer in layers:
            source = layer(source)
        return source

    return wrap


def open_input(url: str, *, shardmap: ShardMap | None = None,
               **options: object) -> uproot.ReadOnlyDirectory:
    """Open an input file with uproot: on its XCache shard inside a datavine run.

    ``shardmap`` overrides the run's (``RunConfig.shardmap``); reads are accounted either way.
    """
    return _open_served(url, shardmap, open_file, options)[0]


def open_source(url: str, **options: object) -> uproot.source.chunk.Source:
    """The uproot source of ``url`` (on its shard when the bundle has a shard map), recorded
    in the bundle's read context: the source counts every byte uproot asks of it."""
    return _open_served(url, None, make_source, options)[0]
