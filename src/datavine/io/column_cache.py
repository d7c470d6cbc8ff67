"""Decoded columns kept in the process that decoded them: a byte-bounded LRU, per process.

A rerun of an analysis over the same files decompresses every basket again (LZMA: ~75% of
the analysis' time). This module keeps the arrays a read decoded, so that the next read of
the same columns of the same file -- in a later bundle, or a later run of the same cluster --
is a dictionary look-up. It holds the *data*; :mod:`datavine.io.cached_arrays` is the read
path that consults it (the AGC chunks, coffea's source), and the scheduler's placement
(``Topology.files_read``, the "cached" tier) learns from the read records which worker holds
which file's columns.

Where it lives: one :class:`ColumnCache` per process (:func:`cache`). datavine runs capped
bundles one after another in a long-lived child per library
(:mod:`datavine.worker.capped_child`), so the cache there persists across bundles and runs;
a child replaced after an overrun or a crash starts cold, which is safe. Uncapped bundles run
in the library process and use its cache.

Keys (:class:`ColumnKey`) name the file's *identity* (:func:`file_identity`: a local file's
device, inode, size and modification time, a URL's ROOT UUID, so a file rewritten at the
same path is never served from the cache), the tree, the branch, its interpretation and the
entry range. The bound is set per bundle by the manager (``BundleSpec.cache_mb``: a share
of the bundle's memory cap, :meth:`datavine.config.RunConfig.column_cache_budget_mb`), so the
cache is counted inside the cap: a bundle whose budget shrank evicts first. When a bundle's
reads are done, :func:`settle` holds the process under the RSS bound its next cap allows
(``BundleSpec.cache_rss_mb``), mostly by keeping less from then on (``ColumnCache.room``):
the memory the columns leave stays with the process, where the next reads reuse it. It is
handed back to the system (``malloc_trim``) only when the RSS nears the share of the cap at
which a capped child is replaced: fresh pages cost the next reads as much as decoding ZSTD
does (a page fault per 4 KiB, ~0.75 ms per MB kept on the 2-core VM, measured), and
trimming after every bundle made a run whose working set exceeds the cache ~40% slower in
CPU than one without the cache. A newer ``cache_epoch`` (``cluster.drop_caches()``)
empties it; its pages stay with the process too, so that a cold run after the drop reads
into memory already there (a new process's first fill pays for its pages once).

What a bundle did with the cache (bytes served, bytes decoded, the entry ranges it holds and
those it dropped) is noted in its read context (:class:`datavine.io.reading.ReadContext`)
and travels back in the bundle's read records. Standard library only at import: imported on
workers.
"""

from __future__ import annotations

import contextlib
import ctypes
import ctypes.util
import os
import time
from collections import OrderedDict, defaultdict
from collections.abc import Hashable
from dataclasses import dataclass, field
from typing import NamedTuple

MB = 2**20
GENERATION = "@cache/"  # the prefix of a cache's generation, as read records name it
# settle hands freed memory back to the system only past this multiple of its RSS bound: a
# capped child is replaced when it idles over 0.8 of its cap, and the bound is 0.7 of it
# (worker.capped_child.RECYCLE_FRACTION over config.CACHE_RSS_SHARE: 1.14)
TRIM_OVER = 1.1


class ColumnKey(NamedTuple):
    """One decoded column: which file (its identity), tree, branch, interpretation, entries."""

    identity: Hashable
    tree: str
    branch: str
    interpretation: str
    entry_start: int | None
    entry_stop: int | None


class _Entry(NamedTuple):
    value: object
    nbytes: int
    piece: str


def piece_name(lfn: str, entry_start: int | None, entry_stop: int | None) -> str:
    """The name of a file's entry range as workers report it and placement matches it
    (``/store/x.root@0-100000``; the scheduler finds the same in a task's arguments,
    :func:`datavine.scheduler.inputs.task_pieces`)."""
    return f"{lfn}@{'' if entry_start is None else entry_start}-" \
           f"{'' if entry_stop is None else entry_stop}"


def marker_name(lfn: str) -> str:
    """The name that says a worker holds pieces of ``lfn`` (so a piece it lacks is a miss
    there, not a hit by the file's name)."""
    return f"{lfn}@*"


def file_of(piece: str) -> str:
    """The logical file name of a piece (or marker) name."""
    return piece.rsplit("@", 1)[0]


@dataclass
class CacheStats:
    """Counters of one cache since it was made (or since :meth:`ColumnCache.clear`)."""

    hits: int = 0
    misses: int = 0
    hit_bytes: int = 0
    miss_bytes: int = 0  # decoded bytes of the columns that were read because they were absent
    evicted_bytes: int = 0
    evictions: int = 0


@dataclass
class ColumnCache:
    """A byte-bounded LRU of decoded columns (see the module's docstring).

    ``max_bytes`` 0 keeps nothing (every ``put`` is dropped at once). ``get`` and ``put`` are
    the whole interface of the read path; ``resize`` applies a bundle's budget, ``clear`` a
    drop. ``held`` is how many bytes each piece (:func:`piece_name`: a file's entry range)
    has here, ``pieces`` how many pieces of each file; ``dropped`` the pieces, and markers
    (:func:`marker_name`) of files, that left since :meth:`take_dropped`. ``room``: the
    bytes the process' RSS bound leaves the cache, learned by :func:`settle` (None: not
    bound by it yet); :func:`configure` bounds the cache at the smaller of it and a
    bundle's budget.
    """

    max_bytes: int = 0
    entries: OrderedDict[ColumnKey, _Entry] = field(default_factory=OrderedDict)
    bytes: int = 0
    held: defaultdict[str, int] = field(default_factory=lambda: defaultdict(int))
    pieces: defaultdict[str, int] = field(default_factory=lambda: defaultdict(int))
    stats: CacheStats = field(default_factory=CacheStats)
    epoch: int = 0
    dropped: set[str] = field(default_factory=set)  # pieces and markers that left, since asked
    room: int | None = None
    pid: int = field(default_factory=os.getpid)
    # names this cache among the caches a worker ever had: a worker whose generation
    # changed (its library or capped child was replaced) holds nothing it reported before
    generation: str = field(default_factory=lambda: f"{GENERATION}{os.getpid()}/{time.time_ns()}")

    def get(self, key: ColumnKey) -> object | None:
        """The column under ``key`` (now the most recently used), or None."""
        entry = self.entries.get(key)
        if entry is None:
            return None
        self.entries.move_to_end(key)
        self.stats.hits += 1
        self.stats.hit_bytes += entry.nbytes
        return entry.value

    def missed(self, nbytes: int) -> None:
        """A column was absent and was read (``nbytes`` decoded)."""
        self.stats.misses += 1
        self.stats.miss_bytes += nbytes

    def put(self, key: ColumnKey, value: object, nbytes: int, piece: str) -> bool:
        """Keep ``value`` (``nbytes`` of memory) under ``key``, evicting the least recently
        used columns to stay within ``max_bytes``; False when it does not fit at all."""
        if nbytes > self.max_bytes:
            return False
        old = self.entries.pop(key, None)
        if old is not None:
            self._forget(old)
        self.evict_to(self.max_bytes - nbytes)
        self.entries[key] = _Entry(value, nbytes, piece)
        self.bytes += nbytes
        if piece not in self.held:
            lfn = file_of(piece)
            self.pieces[lfn] += 1
            self.dropped.discard(marker_name(lfn))
        self.held[piece] += nbytes
        self.dropped.discard(piece)
        return True

    def holds(self, piece: str) -> bool:
        """Whether any column of ``piece`` is here."""
        return piece in self.held

    def resize(self, max_bytes: int) -> int:
        """Bound the cache at ``max_bytes`` from now on; returns the bytes evicted (their
        memory stays with the process, for the next reads: :func:`settle` hands it back when
        the RSS asks for it)."""
        self.max_bytes = max(0, int(max_bytes))
        return self.evict_to(self.max_bytes)

    def clear(self) -> None:
        """Drop every column (a cold cache; the counters start again). Their memory stays
        with the process, where the next reads reuse it (see the module's docstring)."""
        self.dropped.update(self.held)
        self.dropped.update(marker_name(lfn) for lfn in self.pieces)
        self.entries.clear()
        self.held.clear()
        self.pieces.clear()
        self.bytes = 0
        self.stats = CacheStats()

    def take_dropped(self) -> set[str]:
        """Files whose columns all left since the last call (evicted or cleared)."""
        out, self.dropped = self.dropped, set()
        return out

    def evict_to(self, bound: int) -> int:
        """Evict the least recently used columns until at most ``bound`` bytes are held
        (the bound itself stays); returns the bytes evicted."""
        freed = 0
        while self.bytes > bound and self.entries:
            _, entry = self.entries.popitem(last=False)
            self._forget(entry)
            freed += entry.nbytes
            self.stats.evictions += 1
        self.stats.evicted_bytes += freed
        return freed

    def _forget(self, entry: _Entry) -> None:
        self.bytes -= entry.nbytes
        piece = entry.piece
        self.held[piece] -= entry.nbytes
        if self.held[piece] <= 0:
            del self.held[piece]
            self.dropped.add(piece)
            lfn = file_of(piece)
            self.pieces[lfn] -= 1
            if self.pieces[lfn] <= 0:
                del self.pieces[lfn]
                self.dropped.add(marker_name(lfn))


_cache = ColumnCache()


def cache() -> ColumnCache:
    """This process's cache (one per process: the capped child's, or the library's; a
    process forked from one that had a cache starts with a new, empty one)."""
    global _cache
    if _cache.pid != os.getpid():
        _cache = ColumnCache()
    return _cache


def configure(max_bytes: int, epoch: int = 0) -> ColumnCache:
    """Apply a bundle's budget and the cluster's cache epoch to this process's cache: an
    epoch newer than the cache's empties it first (``cluster.drop_caches()``)."""
    own = cache()
    if epoch > own.epoch:
        own.clear()
        own.epoch = epoch
    if max_bytes > 0:
        keep_heap()
    own.resize(max_bytes if own.room is None else min(max_bytes, own.room))
    return own


def rss_bytes() -> int:
    """This process's resident memory (``/proc/self/statm``; 0 where there is none)."""
    try:
        with open("/proc/self/statm", "rb") as f:
            return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")
    except (OSError, IndexError, ValueError):
        return 0


def settle(cache: ColumnCache, rss_limit: int) -> int:
    """Hold this process under ``rss_limit`` bytes of RSS once a bundle's reads are done;
    returns the bytes evicted. The process then idles under the share of its next cap at
    which a capped child would be replaced (its cache with it).

    The memory in use (the RSS less what the heap holds free, :func:`heap_free_bytes`) is
    what the cache controls: over the bound, the cache keeps that much less from now on
    (``cache.room``) and evicts it, the memory staying with the process for the next reads;
    under it, a cache held back by its room may grow into half of what is left. Only an RSS
    over ``TRIM_OVER`` x the bound is handed back to the system (``malloc_trim``), evicting
    until under the bound, as the cap needs."""
    rss = rss_bytes()
    if rss > TRIM_OVER * rss_limit:
        return _hand_back(cache, rss, rss_limit)
    room = cache.room
    held_back = room is not None and cache.bytes >= room
    if rss <= rss_limit and not held_back:
        return 0  # in use <= RSS <= the bound, and no room to give: no need to ask the heap
    used = rss - heap_free_bytes()  # mallinfo2 walks the heap's free lists: ~0.1 ms a call
    if used > rss_limit:
        cache.room = max(0, cache.bytes - (used - rss_limit))
        return cache.evict_to(cache.room)
    if held_back and room is not None:
        cache.room = room + (rss_limit - used) // 2
    return 0


def make_room(limit_mb: float) -> int:
    """Bring this process under ``limit_mb`` MB of RSS by handing back freed heap memory and
    evicting the least recently used columns; returns the bytes evicted. A capped child runs
    it before a call whose cap it idles too close to (``CappedChild(make_room=...)``):
    replaced, it would lose every column and take ~0.3 s to start again, where what it held
    over the bound is only the columns that a bundle under a larger cap kept."""
    return _hand_back(cache(), rss_bytes(), int(limit_mb * MB))


def _hand_back(cache: ColumnCache, rss: int, rss_limit: int) -> int:
    """Trim what the heap holds free, then evict the least recently used columns (and trim
    again) until the RSS is at most ``rss_limit`` or the cache is empty; the cache's room is
    what is left."""
    evicted = 0
    trim()
    rss = rss_bytes()
    while rss > rss_limit and cache.entries:
        # evict what the excess asks for (at least a tenth of the cache), then look again
        step = max(rss - rss_limit, cache.bytes // 10, 1)
        evicted += cache.evict_to(max(0, cache.bytes - step))
        trim()
        rss = rss_bytes()
    cache.room = cache.bytes
    return evicted


class _MallInfo2(ctypes.Structure):
    _fields_ = [(name, ctypes.c_size_t) for name in (
        "arena", "ordblks", "smblks", "hblks", "hblkhd", "usmblks", "fsmblks", "uordblks",
        "fordblks", "keepcost")]


def heap_free_bytes() -> int:
    """The bytes glibc's main heap holds free (``mallinfo2().fordblks``: freed, still
    resident, reused by the next allocations); 0 where it cannot be asked."""
    libc = _lib()
    if libc is None:
        return 0
    try:
        mallinfo2 = libc.mallinfo2
    except AttributeError:  # not glibc, or older than 2.33
        return 0
    mallinfo2.restype = _MallInfo2
    return int(mallinfo2().fordblks)


def file_identity(path: str, uuid: object = None) -> Hashable:
    """What names one version of a file: a local path's device, inode, size and modification
    time (read without opening it: a hit opens nothing); a URL's ``uuid`` (its ROOT UUID,
    and its length: a copy keeps the UUID). None (its columns are not cached): a local file
    that is gone, a URL whose UUID is not known."""
    if "://" in path and not path.startswith("file://"):
        return None if uuid is None else ("url", path, str(uuid))
    local = path[len("file://"):] if path.startswith("file://") else path
    try:
        st = os.stat(local)
    except OSError:
        return None
    return ("local", st.st_dev, st.st_ino, st.st_size, st.st_mtime_ns)


_libc: ctypes.CDLL | None = None
_no_libc = False


def _lib() -> ctypes.CDLL | None:
    """The C library (None where it cannot be loaded)."""
    global _libc, _no_libc
    if _libc is None and not _no_libc:
        try:
            _libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6")
        except OSError:
            _no_libc = True
    return _libc


M_TRIM_THRESHOLD, M_MMAP_THRESHOLD = -1, -3  # glibc's mallopt parameters
_HEAP_KEPT = False


def keep_heap() -> None:
    """Have glibc serve decoded arrays from its heap and keep what they free there, in this
    process, once: a kept column is never freed, so glibc's dynamic threshold (which rises
    as large blocks are freed) stayed at 128 KiB, and every array over it was a fresh
    ``mmap`` whose pages faulted in one by one, each time (~0.75 ms per MB on the 2-core VM;
    the same reads without the cache reuse the memory the last chunk freed). Large blocks
    (up to 32 MiB, glibc's most) now come from the heap, freed memory stays there for the
    next reads, and :func:`settle` hands it back when the RSS asks for it (:func:`trim`)."""
    global _HEAP_KEPT
    libc = _lib()
    if _HEAP_KEPT or libc is None:
        return
    with contextlib.suppress(AttributeError):
        libc.mallopt(M_MMAP_THRESHOLD, 32 * MB)
        libc.mallopt(M_TRIM_THRESHOLD, 2**31 - 1)
    _HEAP_KEPT = True


def trim() -> None:
    """Hand freed heap memory back to the system (glibc ``malloc_trim``), so the RSS the
    memory cap watches falls when columns are evicted; a no-op elsewhere."""
    libc = _lib()
    with contextlib.suppress(AttributeError):
        if libc is not None:
            libc.malloc_trim(0)
