"""Local input files kept open in a worker process across the reads of its bundles.

Opening a file costs more than its bytes: uproot reads its header and directory, and a
tree's metadata (every branch's model) when the tree is first looked up: ~4 ms for the
generated 25-branch files, ~175 ms for a CMS NanoAOD file of 1,499 branches, and the models
are left in reference cycles for the garbage collector when the file is closed (~1,400
objects for the first, ~68,000 for the second). A worker reads a file's chunks one after
another (placement sends a chunk where its file's pieces are; a call takes a file's chunks
together), so :func:`tree` keeps the trees of the last :data:`HELD_FILES` files a process
read, open: a later chunk of the same file finds its tree there.

- Only local paths, inside a bundle (a read context is installed): a ``root://`` URL is
  opened per read, through its shard and the bundle's read layers
  (:mod:`datavine.io.reading`), and so is any file outside a bundle.
- A file is known by its ``stat`` identity (:func:`datavine.io.column_cache.file_identity`):
  one replaced under the same path is opened again.
- Each bundle that reads a held file records it in its read context once, as an open of its
  own whose bytes count from when the bundle first took it (:class:`_Since`).
- A held file's memory map gives its pages back after each read (``MADV_DONTNEED``): the
  process's resident memory (what memory caps watch) holds no more of a file between reads
  than when each read opened and closed it; the page cache keeps them.
- A read that raises drops the file (closed): the next read opens it again.
- A capped child that makes room before a call whose cap it idles too close to closes them
  all (:func:`datavine.worker.remote.make_room`).

Imported on workers: uproot is imported when a file is opened.
"""

from __future__ import annotations

import contextlib
import mmap
import threading
import weakref
from collections import OrderedDict
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, NamedTuple

from datavine.io import column_cache, reading
from datavine.io.source.base import LOCAL, SOURCE_COUNTERS, served_by

if TYPE_CHECKING:  # uproot ships no types: to mypy these are Any
    import uproot

HELD_FILES = 4  # files a process keeps open (their trees' metadata: ~15 MB for NanoAOD's)


class Taken(NamedTuple):
    """A tree for one read, and its file's count of requested bytes before the read (0 for
    a file opened for this read: the open's own bytes count in the difference with the
    count when this read ends)."""

    tree: uproot.TTree
    bytes_before: int


@dataclass
class _Held:
    directory: uproot.ReadOnlyDirectory
    identity: object
    trees: dict[str, uproot.TTree] = field(default_factory=dict)
    recorded_in: weakref.ref[reading.ReadContext] | None = None  # the last context it is in


class OpenFiles:
    """The files one process keeps open, the most recently read last."""

    def __init__(self, max_files: int = HELD_FILES) -> None:
        self.max_files = max_files
        self._held: OrderedDict[str, _Held] = OrderedDict()
        self._lock = threading.Lock()

    def __len__(self) -> int:
        return len(self._held)

    @contextlib.contextmanager
    def tree(self, path: str, name: str) -> Iterator[Taken]:
        """``path``'s tree ``name`` for one read: held open when the file is local and a
        bundle reads it, else opened for this read and closed after it (see the module)."""
        ctx = reading.current()
        if ctx is None or "://" in path or self.max_files <= 0:
            with reading.open_input(path, object_cache=None, array_cache=None) as directory:
                yield Taken(directory[name], 0)
            return
        held, opened = self._take(path, ctx)
        before = 0 if opened else getattr(held.directory.file.source, "num_requested_bytes", 0)
        try:
            ttree = held.trees.get(name)
            if ttree is None:
                ttree = held.trees[name] = held.directory[name]
            yield Taken(ttree, before)
        except BaseException:
            self.drop(path)
            raise
        finally:
            _give_pages_back(held.directory)

    def drop(self, path: str) -> None:
        """Close ``path`` if it is held."""
        with self._lock:
            held = self._held.pop(path, None)
        if held is not None:
            _close(held)

    def close(self) -> None:
        """Close every held file."""
        with self._lock:
            held, self._held = list(self._held.values()), OrderedDict()
        for h in held:
            _close(h)

    def _take(self, path: str, ctx: reading.ReadContext) -> tuple[_Held, bool]:
        """The held file of ``path`` (opened, and held, when it is not, or when the file at
        ``path`` is no longer the one held), recorded in ``ctx`` once; and whether it was
        opened now."""
        identity = column_cache.file_identity(path)
        with self._lock:
            held = self._held.get(path)
            if held is not None and held.identity == identity and identity is not None:
                self._held.move_to_end(path)
            else:
                held = None
        if held is None:
            self.drop(path)  # a file replaced under its path
            directory = reading.open_input(path, object_cache=None, array_cache=None)
            # the open recorded itself in ctx
            held = _Held(directory, identity, recorded_in=weakref.ref(ctx))
            with self._lock:
                self._held[path] = held
                evicted = [self._held.popitem(last=False)[1]
                           for _ in range(len(self._held) - self.max_files)]
            for old in evicted:
                _close(old)
            return held, True
        if held.recorded_in is None or held.recorded_in() is not ctx:
            held.recorded_in = weakref.ref(ctx)
            ctx.add(_Since(held.directory.file.source), served_by(LOCAL, path))
        return held, False


class _Since:
    """A held file's source as one bundle sees it: its counters less what they were when the
    bundle took it; anything else as the source has it."""

    def __init__(self, source: object) -> None:
        self._source = source
        self._base = {name: getattr(source, name) for name in SOURCE_COUNTERS
                      if hasattr(source, name)}

    def __getattr__(self, name: str) -> object:
        value = getattr(self._source, name)
        return value - self._base[name] if name in self._base else value


def _give_pages_back(directory: uproot.ReadOnlyDirectory) -> None:
    """Drop the pages a read faulted into the held file's memory map from this process's
    resident set (not from the page cache)."""
    memory = getattr(getattr(directory.file.source, "file", None), "_mmap", None)
    if isinstance(memory, mmap.mmap):
        with contextlib.suppress(OSError, ValueError):  # closed meanwhile (a failed read)
            memory.madvise(mmap.MADV_DONTNEED)


def _close(held: _Held) -> None:
    with contextlib.suppress(Exception):  # a file that fails to close is gone anyway
        held.directory.file.close()


_files = OpenFiles()


def files() -> OpenFiles:
    """This process's held files."""
    return _files
