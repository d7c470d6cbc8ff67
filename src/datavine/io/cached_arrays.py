"""Reading a tree's branches through the process's column cache: ``TTree.arrays`` that
remembers.

:func:`read_arrays` is the seam the analysis paths read through (the AGC chunks,
:mod:`datavine.apps.analysis.agc`; coffea's source, :mod:`datavine.coffea.source`): given a
file (a path, a URL, or an open uproot file, directory or tree), branch names and an entry
range, it returns ``{branch: awkward array}`` as ``TTree.arrays(..., how=dict)`` does. The
columns already in this process's :class:`~datavine.io.column_cache.ColumnCache` (same file
identity, tree, branch, entries) come from memory; the others are read with one
``TTree.arrays`` call, copied into buffers of their own (so that a kept column holds only its
entries, not the baskets around them) and kept. A local file read entirely from the cache is
not even opened. Outside a datavine bundle (no read context), or with a bound of 0
(``RunConfig.column_cache`` off), it is ``TTree.arrays`` and nothing else.

What each read took from the cache and decoded is noted in the bundle's read context
(:meth:`datavine.io.reading.ReadContext.note_cache`), which the run summary sums
(``last_summary.cache``).
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from typing import TYPE_CHECKING, NamedTuple, TypeAlias, cast

import awkward as ak
import numpy as np

from datavine.io import column_cache, open_files, read_profile, reading
from datavine.io.column_cache import ColumnKey
from datavine.io.shards import logical_name

if TYPE_CHECKING:  # uproot ships no types: to mypy these are Any
    import uproot

DEFAULT = "default"  # the key's interpretation for the branches' own (TTree.arrays' default)
# a path, a URL, or an open uproot file, directory or tree
Source: TypeAlias = ("str | os.PathLike[str] | uproot.ReadOnlyFile | uproot.ReadOnlyDirectory"
                     " | uproot.TTree")
Holder: TypeAlias = "uproot.ReadOnlyDirectory | uproot.TTree"
Arrays: TypeAlias = dict[str, ak.Array]


class Read(NamedTuple):
    """The arrays of one read and what it cost: compressed bytes asked of the file, decoded
    bytes served from the cache and decoded from the file."""

    arrays: Arrays
    bytes_read: int
    cached: int
    decoded: int
    path: str


def read_arrays(source: Source, branches: Sequence[str], entry_start: int | None = None,
                entry_stop: int | None = None, tree: str = "Events") -> Read:
    """``{branch: array}`` of entries ``[entry_start, entry_stop)`` of ``source``'s
    ``tree`` (ignored when ``source`` is a TTree), through the column cache.

    ``source``: a local path or URL (opened with :func:`datavine.io.reading.open_input`
    when a column is missing, and for a URL, to learn its UUID; a local file read in a
    bundle stays open for the process's next reads, :mod:`datavine.io.open_files`), or an
    open uproot file, directory or TTree (left open).
    """
    import uproot

    cache = column_cache.cache()
    if reading.current() is None:  # outside a bundle: no cache (its bound is the bundle's)
        cache = column_cache.ColumnCache()
    if isinstance(source, (str, os.PathLike)):
        path = str(source)
        if cache.max_bytes <= 0:
            with open_files.files().tree(path, tree) as taken:
                return _plain(taken.tree, branches, entry_start, entry_stop, path)
        held = _held_whole(cache, path, branches, entry_start, entry_stop, tree)
        if held is not None:
            return held
        with open_files.files().tree(path, tree) as taken:
            return _cached(cache, taken.tree, tree, branches, entry_start, entry_stop, path)
    if isinstance(source, uproot.TTree):
        tree_name = source.object_path.lstrip("/").split(";")[0]
        path = str(source.file.file_path)
        if cache.max_bytes <= 0:
            return _plain(source, branches, entry_start, entry_stop, path)
        return _cached(cache, source, tree_name, branches, entry_start, entry_stop, path)
    directory = source.root_directory if isinstance(source, uproot.ReadOnlyFile) else source
    path = str(directory.file.file_path)
    if cache.max_bytes <= 0:
        return _plain(directory[tree], branches, entry_start, entry_stop, path)
    return _cached(cache, directory, tree, branches, entry_start, entry_stop, path)


def read_held(path: str, branches: Sequence[str], entry_start: int | None = None,
              entry_stop: int | None = None, tree: str = "Events") -> Read | None:
    """The columns of a local file's entries from this process's column cache, when it
    holds every one of them (the file is not opened: known by stat); None otherwise, or
    outside a bundle. For a caller that opens the file itself on a miss (to count what the
    open reads too), and would otherwise open it for every read (~0.65 ms a chunk)."""
    if reading.current() is None:
        return None
    return _held_whole(column_cache.cache(), path, branches, entry_start, entry_stop, tree)


def _held_whole(cache: column_cache.ColumnCache, path: str, branches: Sequence[str],
                start: int | None, stop: int | None, tree: str) -> Read | None:
    if "://" in path or cache.max_bytes <= 0:
        return None
    hit = _lookup(cache, column_cache.file_identity(path), tree, branches, start, stop)
    if len(hit) != len(branches):
        return None
    piece = column_cache.piece_name(logical_name(path), start, stop)
    return _served(hit, branches, path, piece, None)


def _plain(ttree: uproot.TTree, branches: Sequence[str], start: int | None, stop: int | None,
           path: str) -> Read:
    file_source = ttree.file.source
    before = getattr(file_source, "num_requested_bytes", 0)
    read_profile.note(str(ttree.name), branches)  # what a prefetch of the next chunk reads
    arrays = ttree.arrays(list(branches), entry_start=start, entry_stop=stop, how=dict,
                          array_cache=None)
    decoded = sum(int(array.nbytes) for array in arrays.values())
    return Read(arrays, getattr(file_source, "num_requested_bytes", 0) - before, 0, decoded,
                path)


def _lookup(cache: column_cache.ColumnCache, identity: object, tree: str,
            branches: Sequence[str], start: int | None, stop: int | None) -> Arrays:
    if identity is None:
        return {}
    found = {}
    for name in branches:
        value = cache.get(ColumnKey(identity, tree, name, DEFAULT, start, stop))
        if value is not None:
            found[name] = cast(ak.Array, value)
    return found


def _served(hit: Arrays, branches: Sequence[str], path: str, piece: str,
            read: Read | None) -> Read:
    cached = sum(int(hit[name].nbytes) for name in hit)
    ctx = reading.current()
    decoded = read.decoded if read is not None else 0
    if ctx is not None:
        ctx.note_cache(logical_name(path), cached, decoded, piece)
    more = read.arrays if read is not None else {}
    arrays = {name: hit[name] if name in hit else more[name] for name in branches}
    return Read(arrays, read.bytes_read if read is not None else 0, cached, decoded, path)


def _cached(cache: column_cache.ColumnCache, holder: Holder, tree: str, branches: Sequence[str],
            start: int | None, stop: int | None, path: str) -> Read:
    """Through the cache, ``holder`` an open directory (its ``tree`` is opened only if a
    column is missing) or the TTree itself."""
    # a URL: its UUID, and its length (a copy keeps the UUID); a local file: by stat
    uuid = None if "://" not in path else (str(holder.file.uuid), holder.file.fEND)
    identity = column_cache.file_identity(path, uuid)
    hit = _lookup(cache, identity, tree, branches, start, stop)
    missing = [name for name in branches if name not in hit]
    piece = column_cache.piece_name(logical_name(path), start, stop)
    if not missing:
        return _served(hit, branches, path, piece, None)
    ttree = holder if hasattr(holder, "arrays") else holder[tree]
    plain = _plain(ttree, missing, start, stop, path)
    arrays, decoded = {}, plain.decoded
    keep = identity is not None and decoded <= cache.max_bytes  # else it would only churn
    for name in missing:
        array = _own(plain.arrays[name]) if keep else plain.arrays[name]
        nbytes = int(array.nbytes)
        cache.missed(nbytes)
        if keep:
            cache.put(ColumnKey(identity, tree, name, DEFAULT, start, stop), array, nbytes,
                      piece)
        arrays[name] = array
    return _served(hit, branches, path, piece, Read(arrays, plain.bytes_read, 0, decoded, path))


def _own(array: ak.Array) -> ak.Array:
    """The array in buffers of its own, packed: what it keeps alive is what it shows (a
    copy only when it is a view into more: a range that cut baskets)."""
    if not isinstance(array, ak.Array) or _compact(array.layout):
        return array
    return ak.copy(ak.to_packed(array))


def _compact(layout: ak.contents.Content) -> bool:
    """Whether the layout's buffers hold its data and nothing more (a flat array, or a list
    of one over it, starting at 0: how uproot returns a branch read over whole baskets)."""
    if isinstance(layout, ak.contents.NumpyArray):
        return _owns(np.asarray(layout.data))
    if isinstance(layout, ak.contents.ListOffsetArray):
        offsets = np.asarray(layout.offsets.data)
        return (len(offsets) > 0 and offsets[0] == 0 and _owns(offsets)
                and layout.content.length == offsets[-1] and _compact(layout.content))
    return False


def _owns(data: np.ndarray) -> bool:
    """Whether the memory under ``data`` is (about) ``data`` itself, not a larger buffer."""
    base: object = data
    while isinstance(base, np.ndarray) and base.base is not None:
        base = base.base
    size = base.nbytes if isinstance(base, (np.ndarray, memoryview)) else (
        len(base) if isinstance(base, (bytes, bytearray)) else None)
    return size is not None and size <= data.nbytes * 1.1 + 4096
