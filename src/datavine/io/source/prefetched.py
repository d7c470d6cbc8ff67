"""A bundle's ``root://`` source in front of the ranges read ahead for it.

:class:`PrefetchedSource` is :class:`~datavine.io.source.disk.DiskCachedSource` over the
process's :class:`~datavine.io.prefetch_store.PrefetchStore` (read side): the file's header
comes from the server (its identity), each range uproot asks for is taken from the store
when the prefetch fetched it (:mod:`datavine.worker.prefetch`), the others are asked of the
wrapped source. Counts: the bytes taken from the store crossed the network too (early), so
``num_requested_bytes`` counts them with what the server was asked now (the run summary's
bytes near and far stay what the bundle read), and ``num_prefetched_bytes`` says how many
came early. Imported where a file is opened with the store holding ranges (it imports
uproot).
"""

from __future__ import annotations

import uproot

from datavine.io.prefetch_store import PrefetchStore
from datavine.io.source.disk import DiskCachedSource


class PrefetchedSource(DiskCachedSource):
    """``inner`` (an open uproot source of a remote file) with ``store``'s ranges in front."""

    def __init__(self, inner: uproot.source.chunk.Source, store: PrefetchStore,
                 name: str | None = None) -> None:
        super().__init__(inner, store.reader(), name)  # type: ignore[arg-type]

    @property
    def num_prefetched_bytes(self) -> int:
        """Bytes taken from the prefetch store so far."""
        return self._num_disk_bytes

    @property
    def num_disk_bytes(self) -> int:
        """Bytes the worker's disk served (a disk cache under this source), not the store."""
        return int(getattr(self._inner, "num_disk_bytes", 0))

    @property
    def num_requested_bytes(self) -> int:
        """Bytes asked of the server, now or ahead of the bundle by the prefetch."""
        return int(self._inner.num_requested_bytes) + self._num_disk_bytes

    def __repr__(self) -> str:
        return f"<PrefetchedSource {self._inner!r}>"
