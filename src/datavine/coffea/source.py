"""An uproot ``handler`` that reads through the run's XCache shards, and accounts each read.

coffea opens its inputs itself (``uproot.open`` inside ``Runner``'s work function, or the
readers of a ``from_map`` dask graph), so datavine cannot hand it a file opened with
:func:`datavine.open_input`. It can choose the *source*: uproot builds one with
``handler(file_path, **options)``, and :class:`DatavineSource` is such a handler whose
construction returns the uproot source that datavine's read layer opened for the file
(:func:`datavine.io.reading.open_source`, the same code as ``open_input``):

- inside a datavine bundle with a shard map (``RunConfig.shardmap``): on the file's XCache
  shard, failing over to the next healthy shard and finally the origin when one does not
  open (:mod:`datavine.io.source.xcache`);
- a ``root://`` URL without a shard map: that URL, with uproot's ``XRootDSource`` (which,
  unlike fsspec-xrootd, does not keep handles to a dead server open);
- anything else (a local path): uproot's default source (:mod:`datavine.io.source.handles`
  says why not a memory map).

Each source opened inside a bundle is recorded in the bundle's
:class:`~datavine.io.reading.ReadContext`, so its requested bytes reach the run summary as near
or far bytes, exactly as reads through ``open_input`` do. Outside a bundle (on the client,
or under coffea's own executors) nothing is recorded and no shard is used.

The dask path uses it by name: ``NanoEventsFactory.from_root(..., uproot_options={"handler":
DatavineSource})`` or ``uproot.dask(..., handler=DatavineSource)``; ``DatavineExecutor``
sets it for ``Runner`` work items itself. Imported on workers.
"""

from __future__ import annotations

import uproot

from datavine.io.reading import open_source
from datavine.io.source.handles import XROOTD_SCHEMES, source_class

__all__ = ["XROOTD_SCHEMES", "DatavineSource", "source_class"]


class DatavineSource(uproot.source.chunk.Source):
    """uproot handler: ``DatavineSource(path, **options)`` is the source of the server that
    should serve ``path`` now (see the module docstring); never an instance of this class."""

    def __new__(cls, file_path: str, **options: object) -> uproot.source.chunk.Source:
        return open_source(str(file_path), **options)
