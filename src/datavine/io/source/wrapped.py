"""An uproot source in front of another: what every datavine wrap passes through unchanged.

:class:`WrappedSource` holds ``inner`` (an open uproot source of a remote file) and answers
uproot's counters, ``close`` and the context manager from it, and any other attribute
(``file``, ``timeout``, ...) by the wrapped source's own. The wraps that change what a read
does subclass it and define ``chunk`` and ``chunks``: the worker's disk
(:class:`datavine.io.source.disk.DiskCachedSource`) and the read clock
(:class:`datavine.io.source.timed.TimedSource`). Imported on workers where a ``root://``
file is opened (it imports uproot).
"""

from __future__ import annotations

import queue
from typing import Self

import uproot

Chunk = uproot.source.chunk.Chunk
Notifications = queue.Queue["uproot.source.chunk.Chunk"]  # uproot's: each chunk once filled


class WrappedSource(uproot.source.chunk.Source):
    """``inner``, with the counters and attributes of its own."""

    def __init__(self, inner: uproot.source.chunk.Source) -> None:
        self._inner = inner
        self._file_path = inner.file_path

    @property
    def inner(self) -> uproot.source.chunk.Source:
        return self._inner

    @property
    def num_bytes(self) -> int:
        return int(self._inner.num_bytes)

    @property
    def num_requests(self) -> int:
        return int(self._inner.num_requests)

    @property
    def num_requested_chunks(self) -> int:
        return int(self._inner.num_requested_chunks)

    @property
    def num_requested_bytes(self) -> int:
        """Bytes asked of the server (those a wrap served itself are not)."""
        return int(self._inner.num_requested_bytes)

    @property
    def closed(self) -> bool:
        return bool(self._inner.closed)

    def close(self) -> None:
        self._inner.close()

    def __enter__(self) -> Self:
        return self

    def __exit__(self, *exc: object) -> None:
        self._inner.__exit__(*exc)

    def __getattr__(self, name: str) -> object:  # the wrapped source's own (file, timeout, ...)
        if name.startswith("__") or name == "_inner":
            raise AttributeError(name)
        return getattr(self._inner, name)

    def __repr__(self) -> str:
        return f"<{type(self).__name__} {self._inner!r}>"
