"""Input bytes kept on the worker's disk: byte ranges of remote files, bounded, per worker.

A rerun whose decoded columns are not in memory (another process, the column cache too
small or off, a capped child replaced, a new manager) would fetch every basket from XCache
again. This module keeps the byte ranges a worker fetched from a ``root://`` server on that
worker's local disk, so that such a rerun crosses no network but for each file's header. It
holds the *bytes*; :mod:`datavine.io.source.disk` is the uproot source that consults it, and
:mod:`datavine.io.reading` puts that source in front of every ``root://`` open of a bundle
when ``RunConfig.input_cache_mb`` is set (``BundleSpec.input_cache_mb``).

Where: ``<workspace>/cache/datavine-inputs`` of the ``vine_worker`` the process runs under
(:func:`worker_directory`; the worker exports its workspace's ``temp`` folder as
``WORKER_TMPDIR`` to the processes it starts). TaskVine counts what is in its cache folder
as the worker's disk in use, and deletes it with the workspace when the worker exits (a
worker restarted starts cold). Each time the worker connects to a manager it trashes the
entries of that folder that have no metadata of level "forever", so the folder gets such a
metadata file (:func:`keep_across_managers`, ``datavine-inputs.meta``): a new ``datavine
run`` (a new manager) finds the bytes the last one left, and the manager learns of one more
item from a previous run (TaskVine's own words), which it only counts.

Layout: one folder per file identity (16 bytes from its ROOT header,
:func:`datavine.io.source.disk.header_identity`: its UUID, its length and the rest of the
header), one file per byte range, named ``START-STOP``, holding a header (magic, identity,
range, CRC-32 of the payload) and the payload, and a file ``NAME`` with the file's logical
name: a process tells the manager once which files its worker's disk holds
(:func:`take_held_names`, in its first bundle's read records, the library's warm-up call),
so that placement sends their chunks back to this worker in a run of a new manager too.
Every process of the worker (the library, its capped child) shares the folder: files are
written under a temporary name and renamed into place (a reader sees all of a file or
none), and a file that is not what its name says (short, corrupt, another identity or
range) is a miss and is removed, never an error.

The bound (bytes): the least recently used ranges (a hit touches its file) are evicted to
90% of it whenever a process's count of the folder passes it; a process counts the folder
again after writing a tenth of the bound, so the processes of a worker together overshoot
by at most a tenth of the bound each. The bound is also never more than half of what the
folder's filesystem has free (with what the cache holds): a full scratch disk fails the
batch slot's other jobs. Standard library only: imported on workers.
"""

from __future__ import annotations

import contextlib
import functools
import os
import shutil
import struct
import threading
import zlib
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path

MB = 2**20
FOLDER = "datavine-inputs"  # inside TaskVine's cache folder, <workspace>/cache
MARKER = "EPOCH"  # the library and the cache epoch that last emptied the folder
MAGIC = b"DVRANGE1"
_HEAD = struct.Struct(">8s16sQQI")  # magic, identity, start, stop, CRC-32 of the payload
IDENTITY_BYTES = 16
NAME = "NAME"  # in an identity's folder: the file's logical name
MAX_NAMES = 10_000  # files a process reports its worker's disk holds, at most
FREE_SHARE = 0.5  # of the filesystem's free space (and what the cache holds), at most
RESCAN_SHARE = 0.1  # a process counts the folder again after writing this share of the bound
EVICT_TO = 0.9  # eviction goes down to this share of the bound


def worker_directory(environ: Mapping[str, str] = os.environ) -> Path | None:
    """The cache's folder for the ``vine_worker`` this process runs under
    (``<workspace>/cache/datavine-inputs``, from ``WORKER_TMPDIR`` = ``<workspace>/temp``);
    None outside a worker."""
    temp = environ.get("WORKER_TMPDIR")
    return _folder_for(temp) if temp else None


@functools.lru_cache(maxsize=8)
def _folder_for(temp: str) -> Path:
    """The cache's folder for a worker's ``temp`` folder (asked at every bundle, twice)."""
    return Path(temp).parent / "cache" / FOLDER


@dataclass
class DiskStats:
    """Counters of one process's use of the cache."""

    hits: int = 0
    hit_bytes: int = 0
    misses: int = 0
    stored: int = 0
    stored_bytes: int = 0
    bad: int = 0  # files that were not what their name said (a miss each)
    evicted_bytes: int = 0


@dataclass
class DiskCache:
    """Byte ranges of files, by identity, in ``root``, within ``max_bytes`` (see the module
    docstring). ``get`` and ``put`` are thread-safe (uproot fills chunks in other threads)."""

    root: Path
    max_bytes: int
    stats: DiskStats = field(default_factory=DiskStats)
    _known: int | None = None  # bytes in the folder at the last count, plus own writes since
    _since_count: int = 0
    _lock: threading.Lock = field(default_factory=threading.Lock)

    # --- reading and writing ------------------------------------------------------------------
    def path(self, identity: bytes, start: int, stop: int) -> Path:
        return self.root / identity.hex() / f"{start}-{stop}"

    def get(self, identity: bytes, start: int, stop: int) -> memoryview | None:
        """The bytes ``[start, stop)`` of the file ``identity``, or None (absent, or a file
        that is not what it should be: then it is removed)."""
        path = self.path(identity, start, stop)
        try:
            with open(path, "rb") as f:
                data = f.read()
        except OSError:
            with self._lock:
                self.stats.misses += 1
            return None
        payload = _payload(data, identity, start, stop)
        with self._lock:
            if payload is None:
                self.stats.bad += 1
                self.stats.misses += 1
            else:
                self.stats.hits += 1
                self.stats.hit_bytes += len(payload)
        if payload is None:
            with contextlib.suppress(OSError):
                path.unlink()
            return None
        with contextlib.suppress(OSError):  # the least recently used go first
            os.utime(path)
        return payload

    def put(self, identity: bytes, start: int, stop: int, data: bytes | memoryview) -> bool:
        """Keep ``data`` as the bytes ``[start, stop)`` of the file ``identity``; False when
        it is not that long, does not fit the bound, or could not be written."""
        size = _HEAD.size + len(data)
        if len(data) != stop - start or size > self.bound():
            return False
        path = self.path(identity, start, stop)
        tmp = path.with_name(f".{path.name}.{os.getpid()}.{threading.get_ident()}")
        head = _HEAD.pack(MAGIC, identity, start, stop, zlib.crc32(data))
        try:
            path.parent.mkdir(parents=True, exist_ok=True)
            with open(tmp, "wb") as f:
                f.write(head)
                f.write(data)
            os.replace(tmp, path)
        except OSError:  # a full disk, a folder evicted under us: a miss next time
            with contextlib.suppress(OSError):
                tmp.unlink()
            return False
        with self._lock:
            self.stats.stored += 1
            self.stats.stored_bytes += len(data)
            self._since_count += size
            if self._known is not None:
                self._known += size
            over = (self._known is None or self._known > self.max_bytes
                    or self._since_count > RESCAN_SHARE * self.max_bytes)
        if over:
            self.enforce()
        return True

    def name(self, identity: bytes, lfn: str) -> None:
        """Note that ``identity`` is (a version of) the file of logical name ``lfn``."""
        path = self.root / identity.hex() / NAME
        if path.exists():
            return
        with contextlib.suppress(OSError):
            path.parent.mkdir(parents=True, exist_ok=True)
            tmp = path.with_name(f".{NAME}.{os.getpid()}.{threading.get_ident()}")
            tmp.write_text(lfn)
            os.replace(tmp, path)

    # --- the bound -----------------------------------------------------------------------------
    def bound(self) -> int:
        """``max_bytes``, or half of the filesystem's free space and what the cache holds
        when that is less."""
        try:
            st = os.statvfs(self.root if self.root.exists() else self.root.parent)
            free = st.f_bavail * st.f_frsize
        except OSError:
            return self.max_bytes
        return min(self.max_bytes, int(FREE_SHARE * (free + (self._known or 0))))

    def entries(self) -> list[tuple[float, int, Path]]:
        """(last use, bytes, path) of every file in the folder (temporary ones too)."""
        out = []
        with contextlib.suppress(OSError):
            for folder in os.scandir(self.root):
                if not folder.is_dir(follow_symlinks=False):
                    continue
                with contextlib.suppress(OSError):
                    for entry in os.scandir(folder.path):
                        if entry.name == NAME:  # goes with the folder's last range
                            continue
                        with contextlib.suppress(OSError):
                            st = entry.stat(follow_symlinks=False)
                            out.append((st.st_mtime, st.st_size, Path(entry.path)))
        return out

    def enforce(self) -> int:
        """Count the folder; over the bound, evict the least recently used files down to
        90% of it. Returns the bytes evicted."""
        files = self.entries()
        held = sum(size for _, size, _ in files)
        with self._lock:
            self._known = held
        bound = self.bound()
        freed = 0
        if held > bound:
            target = int(EVICT_TO * bound)
            for _, size, path in sorted(files, key=lambda e: e[0]):
                if held - freed <= target:
                    break
                with contextlib.suppress(OSError):
                    path.unlink()
                    freed += size
            for folder in {p.parent for _, _, p in files}:
                with contextlib.suppress(OSError):
                    if [p.name for p in folder.iterdir()] == [NAME]:  # no range left
                        (folder / NAME).unlink()
                        folder.rmdir()
        with self._lock:
            self._known = held - freed
            self._since_count = 0
            self.stats.evicted_bytes += freed
        return freed

    def held_bytes(self) -> int:
        """Bytes in the folder now (every process's)."""
        return sum(size for _, size, _ in self.entries())

    def clear(self) -> None:
        """Remove every range (every process's)."""
        with contextlib.suppress(OSError):
            for folder in os.scandir(self.root):
                if folder.is_dir(follow_symlinks=False):
                    shutil.rmtree(folder.path, ignore_errors=True)
        with self._lock:
            self._known, self._since_count = 0, 0


def _payload(data: bytes, identity: bytes, start: int, stop: int) -> memoryview | None:
    """The payload of a cache file's contents when they are what its name says, else None."""
    if len(data) != _HEAD.size + (stop - start):
        return None
    magic, ident, first, last, crc = _HEAD.unpack_from(data)
    payload = memoryview(data)[_HEAD.size:]
    if (magic, ident, first, last) != (MAGIC, identity, start, stop) or \
            zlib.crc32(payload) != crc:
        return None
    return payload


# --- this process's cache ----------------------------------------------------------------------
_cache: DiskCache | None = None


def configure(max_mb: float, epoch: int = 0, root: Path | None = None) -> DiskCache | None:
    """This process's cache with a bundle's bound (``max_mb``; 0: off) in ``root`` (default
    :func:`worker_directory`); None when off or outside a worker. A cache ``epoch`` newer
    than the one that last emptied the folder for this worker's library empties it first
    (``cluster.drop_caches()``; see :func:`_take_epoch`)."""
    global _cache
    if max_mb <= 0:
        return None
    root = root if root is not None else worker_directory()
    if root is None:
        return None
    if _cache is None or _cache.root != root:
        _cache = DiskCache(root, int(max_mb * MB))
        keep_across_managers(root)
    else:
        _cache.max_bytes = int(max_mb * MB)
    if _take_epoch(root, epoch):
        _cache.clear()
    return _cache


def held_names(root: Path, limit: int = MAX_NAMES) -> list[str]:
    """Logical names of the files of which ``root`` holds byte ranges (at most ``limit``,
    the most recently used first)."""
    found = []
    with contextlib.suppress(OSError):
        for folder in os.scandir(root):
            with contextlib.suppress(OSError):
                if folder.is_dir(follow_symlinks=False):
                    found.append((folder.stat().st_mtime, Path(folder.path, NAME).read_text()))
    return list(dict.fromkeys(name for _, name in sorted(found, reverse=True)))[:limit]


_reported: tuple[int, Path] | None = None  # (process, folder) that reported its names


def take_held_names(root: Path | None = None) -> list[str]:
    """:func:`held_names` of this worker's folder, the first time this process asks (a new
    library or capped child reports them once); [] after, or outside a worker."""
    global _reported
    root = root if root is not None else worker_directory()
    if root is None or _reported == (os.getpid(), root):
        return []
    _reported = (os.getpid(), root)
    return held_names(root)


def keep_across_managers(root: Path) -> None:
    """Give ``root`` (in TaskVine's cache folder) the metadata of a cached item of level
    "forever" (``VINE_CACHE_LEVEL_FOREVER``, 3), without which the worker trashes it when it
    next connects to a manager; it still goes with the workspace when the worker exits."""
    meta = root.with_name(root.name + ".meta")
    if meta.exists():
        return
    with contextlib.suppress(OSError):
        root.mkdir(parents=True, exist_ok=True)
        tmp = root.with_name(f".{root.name}.meta.{os.getpid()}")
        tmp.write_text(f"type 1\ncache_level 3\nmode 040755\nsize 0\n"
                       f"mtime {int(root.stat().st_mtime)}\ntransfer_time 0\n"
                       "transfer_start 0\n")
        os.replace(tmp, meta)


def _take_epoch(root: Path, epoch: int) -> bool:
    """Whether the folder must be emptied for ``epoch``: it was emptied last for an older
    epoch of this library, or for another library's (another manager's: epochs start at 0
    with each) and ``epoch`` is not 0 (the cluster dropped its caches). Records ``epoch``.
    (A library replaced within a run that dropped its caches empties the folder once more:
    a cold start, never a stale one.)"""
    library = library_token()
    marker = root / MARKER
    try:
        seen_library, seen = marker.read_text().split()
        seen_epoch = int(seen)
    except (OSError, ValueError):
        seen_library, seen_epoch = "", 0
    if seen_library == library and seen_epoch >= epoch:
        return False
    drop = epoch > 0 and (seen_library != library or seen_epoch < epoch)
    with contextlib.suppress(OSError):
        root.mkdir(parents=True, exist_ok=True)
        tmp = root / f".{MARKER}.{os.getpid()}"
        tmp.write_text(f"{library} {epoch}\n")
        os.replace(tmp, marker)
    return drop


def library_token(pid: int | None = None) -> str:
    """Names the worker's library this process belongs to (its PID and start time): the
    process whose parent is ``vine_worker``, this one or an ancestor (a capped child's
    library is its parent); this process itself where there is none."""
    pid = os.getpid() if pid is None else pid
    here = pid
    for _ in range(8):
        parent, start = _parent_and_start(here)
        if parent is None:
            break
        if _comm(parent) == "vine_worker":
            return f"{here}:{start}"
        here = parent
    return f"{pid}:{_parent_and_start(pid)[1]}"


def _parent_and_start(pid: int) -> tuple[int | None, str]:
    try:
        with open(f"/proc/{pid}/stat") as f:
            fields = f.read().rsplit(")", 1)[1].split()
        return int(fields[1]), fields[19]
    except (OSError, IndexError, ValueError):
        return None, ""


def _comm(pid: int) -> str:
    try:
        with open(f"/proc/{pid}/comm") as f:
            return f.read().strip()
    except OSError:
        return ""
