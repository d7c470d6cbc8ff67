"""Simulated time: a heap of timed callbacks, run in time order (ties in insertion order)."""

from __future__ import annotations

import heapq
import itertools
from collections.abc import Callable
from typing import Any


class EventQueue:
    """The clock and the pending events of one simulation."""

    def __init__(self) -> None:
        self.now = 0.0
        self._heap: list[tuple[float, int, Callable[..., Any], tuple[Any, ...]]] = []
        self._seq = itertools.count()
        self.processed = 0

    def at(self, t: float, fn: Callable[..., Any], *args: Any) -> None:
        """Call ``fn(*args)`` at time ``t`` (never in the past)."""
        heapq.heappush(self._heap, (max(t, self.now), next(self._seq), fn, args))

    def after(self, dt: float, fn: Callable[..., Any], *args: Any) -> None:
        self.at(self.now + dt, fn, *args)

    def __len__(self) -> int:
        return len(self._heap)

    def run(self, stop: Callable[[], bool], max_time: float) -> None:
        """Process events until ``stop()`` is true, none is left, or ``max_time`` passes
        (later events stay queued: a later call goes on with them)."""
        while self._heap and not stop():
            if self._heap[0][0] > max_time:
                self.now = max_time
                return
            t, _, fn, args = heapq.heappop(self._heap)
            self.now = t
            self.processed += 1
            fn(*args)
