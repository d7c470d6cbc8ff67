"""coffea's NanoEvents buffers kept in the worker's column cache, across work items and runs.

coffea's ``Runner`` builds each work item's events with ``NanoEventsFactory.from_root(...,
buffer_cache=cache_function())``: every column it decodes goes through that mapping first,
under a key naming the file's UUID, the tree, the item's entry range and the column's form
key. :class:`WorkerBuffers` is such a mapping on this process's
:class:`~datavine.io.column_cache.ColumnCache`, so a ``Runner`` called again through the same
:class:`~datavine.coffea.DatavineExecutor` finds its columns in the worker's memory, as the
AGC path does (:mod:`datavine.io.cached_arrays`). ``DatavineExecutor`` sets it as the work
function's ``cache_function`` unless the user chose a ``cachestrategy``
(:func:`datavine.coffea.prepare.with_datavine_reads`).

Only inside a datavine bundle with a cache bound does it keep anything; elsewhere it is an
empty mapping that forgets what it is given. The file's identity is its UUID (coffea checks
that the file it opens has the UUID it expects) and, since a copy keeps its UUID, the file
the item opened last through the read layer: a local file's device, inode, size and
modification time, a URL's logical name. That logical name is also the one placement matches
against the work item's (:mod:`datavine.scheduler.pieces`). Imported on workers.
"""

from __future__ import annotations

from collections.abc import Iterator, MutableMapping
from urllib.parse import unquote

from datavine.io import column_cache, reading
from datavine.io.column_cache import ColumnKey

KIND = "nanoevents"  # the ColumnKey's interpretation field for coffea's buffers


class WorkerBuffers(MutableMapping[str, object]):
    """A NanoEvents ``buffer_cache`` on the process's column cache (see the module)."""

    def get(self, key: str, default: object = None) -> object:
        ctx = reading.current()
        cache = column_cache.cache()
        parsed = _parse(key, ctx) if ctx is not None else None
        if parsed is None or ctx is None or cache.max_bytes <= 0:
            return default
        value = cache.get(parsed)
        if value is None:
            return default
        nbytes = int(getattr(value, "nbytes", 0))
        ctx.note_cache(_lfn(ctx), nbytes, 0, _piece(ctx, parsed))
        return value

    def __getitem__(self, key: str) -> object:
        value = self.get(key, None)
        if value is None:
            raise KeyError(key)
        return value

    def __setitem__(self, key: str, value: object) -> None:
        ctx = reading.current()
        cache = column_cache.cache()
        parsed = _parse(key, ctx) if ctx is not None else None
        if parsed is None or ctx is None or cache.max_bytes <= 0:
            return
        nbytes = int(getattr(value, "nbytes", 0))
        cache.missed(nbytes)
        piece = _piece(ctx, parsed)
        ctx.note_cache(_lfn(ctx), 0, nbytes, piece)
        cache.put(parsed, value, nbytes, piece)

    def __delitem__(self, key: str) -> None:
        raise KeyError(key)  # the cache evicts by itself

    def __iter__(self) -> Iterator[str]:
        return iter(())

    def __len__(self) -> int:
        return 0


def worker_buffers() -> WorkerBuffers:
    """coffea's ``cachestrategy``/``cache_function``: the mapping of this process."""
    return WorkerBuffers()


def _parse(key: str, ctx: reading.ReadContext) -> ColumnKey | None:
    """The column key of a NanoEvents buffer key (``uuid/tree/start-stop/partition/form``),
    its file known by the UUID and, for the local file the item opened, by its device,
    inode, size and modification time too (a copy keeps the UUID: a corrupted or rewritten
    copy must not be served the original's columns); None when it has no identity."""
    if not ctx.opened:
        return None
    last = ctx.opened[-1]
    where = (column_cache.file_identity(last.lfn) if last.server == "local"
             else ("url", last.lfn))
    if where is None:
        return None
    parts = [unquote(x) for x in key.split("/")]
    if len(parts) < 5:
        return None
    uuid, tree, entries = parts[0], parts[1], parts[2]
    start, _, stop = entries.partition("-")
    try:
        first, stop_ = int(start), int(stop)
    except ValueError:
        return None
    return ColumnKey(("uuid", uuid, where), tree, "/".join(parts[3:]), KIND, first, stop_)


def _lfn(ctx: reading.ReadContext) -> str:
    return ctx.opened[-1].lfn if ctx.opened else "?"


def _piece(ctx: reading.ReadContext, key: ColumnKey) -> str:
    return column_cache.piece_name(_lfn(ctx), key.entry_start, key.entry_stop)
