"""An uproot ``handler`` that reads through the run's XCache shards, and accounts each read.

coffea opens its inputs itself (``uproot.open`` inside ``Runner``'s work function, or the
readers of a ``from_map`` dask graph), so datavine cannot hand it a file opened with
:func:`datavine.open_input`. It can choose the *source*: uproot builds one with
``handler(file_path, **options)``, and :class:`DatavineSource` is such a handler whose
construction returns uproot's own source for the server that should serve the file:

- inside a datavine bundle with a shard map (``RunConfig.shardmap``): the file's XCache shard,
  failing over to the next healthy shard and finally the origin when one does not open
  (:func:`datavine.io.xcache.reader.open_with_failover`, the same code as ``open_input``);
- a ``root://`` URL without a shard map: that URL, with uproot's ``XRootDSource`` (which,
  unlike fsspec-xrootd, does not keep handles to a dead server open);
- anything else (a local path): uproot's default source.

Each source opened inside a bundle is recorded in the bundle's
:class:`~datavine.io.reading.ReadContext`, so its requested bytes reach the run summary as near
or far bytes, exactly as reads through ``open_input`` do. Outside a bundle (on the client,
or under coffea's own executors) nothing is recorded and no shard is used.

The dask path uses it by name: ``NanoEventsFactory.from_root(..., uproot_options={"handler":
DatavineSource})`` or ``uproot.dask(..., handler=DatavineSource)``; ``DatavineExecutor``
sets it for ``Runner`` work items itself. Imported on workers.
"""

from __future__ import annotations

import time
from types import SimpleNamespace
from typing import Any

import uproot

from datavine.io import reading
from datavine.io.shards import logical_name

XROOTD_SCHEMES = ("root://", "roots://", "xroot://")


class DatavineSource(uproot.source.chunk.Source):
    """uproot handler: ``DatavineSource(path, **options)`` is the source of the server that
    should serve ``path`` now (see the module docstring); never an instance of this class."""

    def __new__(cls, file_path: str, **options: Any) -> Any:
        return open_source(str(file_path), options)


def source_class(url: str) -> type[Any]:
    """uproot's source class for ``url``: XRootD's own for ``root://``, else uproot's
    default (fsspec). Not a memory map for local files: a truncated file then kills the
    process with SIGSEGV/SIGBUS instead of raising an error that names it."""
    if url.startswith(XROOTD_SCHEMES):
        return uproot.XRootDSource
    return uproot.FSSpecSource


def _construct(url: str, **options: Any) -> Any:
    return source_class(url)(url, **options)


def open_source(file_path: str, options: dict[str, Any]) -> Any:
    """The source for ``file_path`` (a shard's, when the bundle has a shard map), recorded
    in the bundle's read context."""
    from datavine.io.xcache.reader import open_with_failover

    ctx = reading.current()
    lfn = logical_name(file_path)
    shardmap = ctx.shardmap if ctx is not None else None
    if shardmap is None or "://" not in file_path:
        source = _construct(file_path, **options)
        server = "local" if "://" not in file_path else "direct"
        _record(ctx, source, lfn, server, None, 0, ())
        return source
    source, rec = open_with_failover(file_path, shardmap, reading.shard_health(),
                                     open_fn=_construct, now=time.monotonic(), **options)
    _record(ctx, source, rec.lfn, rec.server, rec.rack, rec.failovers, rec.errors)
    return source


def _record(ctx: reading.ReadContext | None, source: Any, lfn: str, server: str,
            rack: str | None, failovers: int, errors: tuple[tuple[str, str], ...]) -> None:
    if ctx is not None:
        # ReadContext.records() asks ``handle.source`` for its requested bytes at the end of
        # the bundle: the source counts every byte uproot asked of it, failed reads included.
        ctx.opened.append((SimpleNamespace(source=source), lfn, server, rack, failovers,
                           errors))


def shards_used_since(ctx: reading.ReadContext | None, start: int) -> list[str]:
    """Shards (not local files, direct URLs or the origin) opened by the reads recorded in
    ``ctx`` after its first ``start`` records."""
    if ctx is None:
        return []
    return [entry[2] for entry in ctx.opened[start:]
            if entry[2] not in ("local", "direct", "origin")]
