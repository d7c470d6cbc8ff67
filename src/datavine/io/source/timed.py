"""How long a server took to serve a file's byte ranges: an uproot source that clocks its reads.

:class:`TimedSource` wraps the uproot source of a ``root://`` file (uproot's
``XRootDSource``, under the worker's disk cache and the prefetch store when they are on:
:mod:`datavine.io.reading`) and adds up, in ``num_read_seconds``, the time during which at
least one of its requests was outstanding: from a ``chunks`` call until the last of its
ranges has arrived (overlapping requests count once). uproot's pipelining is kept: each
chunk is passed on to uproot's queue as it arrives. With the bytes asked of the server this
is the shard's read rate as the worker saw it, which the manager compares between shards
(:mod:`datavine.scheduler.shard_pace`): a bundle's run time mixes reads with decompression
and the analysis, and a loaded host slows those alike on every shard.

Imported on workers where a ``root://`` file is opened (it imports uproot).
"""

from __future__ import annotations

import threading
import time

import uproot

from datavine.io.source.wrapped import Notifications, WrappedSource


class TimedSource(WrappedSource):
    """``inner`` (an open uproot source of a remote file), its reads clocked."""

    def __init__(self, inner: uproot.source.chunk.Source) -> None:
        super().__init__(inner)
        self._lock = threading.Lock()
        self._busy_s = 0.0
        self._busy_until = 0.0  # the end of the last interval counted (monotonic clock)

    def chunk(self, start: int, stop: int) -> uproot.source.chunk.Chunk:
        began = time.monotonic()
        chunk = self._inner.chunk(start, stop)  # XRootDSource reads it here, synchronously
        self.note(began, time.monotonic())
        return chunk

    def chunks(self, ranges: list[tuple[int, int]], notifications: Notifications,
               ) -> list[uproot.source.chunk.Chunk]:
        if not ranges:
            return list(self._inner.chunks(ranges, notifications))
        clock = _Clock(self, time.monotonic(), len(ranges), notifications)
        return list(self._inner.chunks(ranges, clock))

    def note(self, began: float, ended: float) -> None:
        """A request outstanding from ``began`` to ``ended``: the time not yet counted."""
        with self._lock:
            start = max(began, self._busy_until)
            if ended > start:
                self._busy_s += ended - start
            self._busy_until = max(self._busy_until, ended)

    @property
    def num_read_seconds(self) -> float:
        """Seconds during which a read of this source was outstanding, so far."""
        return self._busy_s


class _Clock:
    """Stands in for uproot's notification queue under one ``chunks`` call: passes each
    chunk on as it arrives, and notes the request's time when the last one has."""

    def __init__(self, source: TimedSource, began: float, pending: int,
                 notifications: Notifications) -> None:
        self._source = source
        self._began = began
        self._pending = pending
        self._lock = threading.Lock()
        self._notifications = notifications

    def put(self, chunk: uproot.source.chunk.Chunk) -> None:
        with self._lock:
            self._pending -= 1
            last = self._pending == 0
        if last:
            self._source.note(self._began, time.monotonic())
        self._notifications.put(chunk)
