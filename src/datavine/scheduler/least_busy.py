"""Workers ordered by how busy they are, so that a decision takes the best few, not all.

Placement wants, among the workers of a rack (or of a shard's host), those with the most
free bundle slots, ties broken by the smallest id (:func:`datavine.scheduler.placement.decide`
ranks them so). Within one group of workers that share a rack, a host, a number of cores and
whether they have a name, that order is the order of bundles in flight to each worker
(fewer first), since the rest of a worker's free slots (its cores, its share of the bundles
sent to its rack) is the same for the whole group. :class:`LeastBusy` keeps one group in a
heap with lazy deletion: changing a worker's count is O(log n), and the best ``k`` workers
below a bound cost O(k log n), whatever the size of the group.
"""

from __future__ import annotations

import heapq


class LeastBusy:
    """Worker ids and their bundles in flight, least busy first (then by ``tie``, then by
    id: :meth:`put`)."""

    __slots__ = ("_busy", "_heap")

    def __init__(self) -> None:
        self._busy: dict[str, tuple[int, int]] = {}  # id -> (bundles in flight, tie)
        # (busy, tie, id); entries no longer the worker's are skipped when met
        self._heap: list[tuple[int, int, str]] = []

    def __len__(self) -> int:
        return len(self._busy)

    def put(self, wid: str, busy: int, tie: int = 0) -> None:
        """Add ``wid``, or change its count; among workers as busy, a smaller ``tie`` comes
        first (the freest worker's search passes when it last got a bundle)."""
        if self._busy.get(wid) == (busy, tie):
            return
        self._busy[wid] = (busy, tie)
        heapq.heappush(self._heap, (busy, tie, wid))
        self._trim()

    def remove(self, wid: str) -> None:
        if self._busy.pop(wid, None) is not None:
            self._trim()

    def best(self, n: int, below: int) -> list[str]:
        """Up to ``n`` ids with fewer than ``below`` bundles in flight, least busy first."""
        heap, busy = self._heap, self._busy
        taken: list[tuple[int, int, str]] = []
        while heap and len(taken) < n:
            count, tie, wid = heap[0]
            # stale, or a second copy (equal entries leave the heap one after the other)
            if busy.get(wid) != (count, tie) or (taken and taken[-1][2] == wid):
                heapq.heappop(heap)
                continue
            if count >= below:
                break
            taken.append(heapq.heappop(heap))
        for entry in taken:
            heapq.heappush(heap, entry)
        return [wid for _, _, wid in taken]

    def any_below(self, below: int) -> bool:
        """Whether some worker has fewer than ``below`` bundles in flight."""
        self._drop_stale()
        return bool(self._heap) and self._heap[0][0] < below

    def least(self) -> str | None:
        """The least busy worker (any member when all are busy), or None when empty."""
        self._drop_stale()
        return self._heap[0][2] if self._heap else None

    def _drop_stale(self) -> None:
        heap, busy = self._heap, self._busy
        while heap and busy.get(heap[0][2]) != heap[0][:2]:
            heapq.heappop(heap)

    def _trim(self) -> None:
        """Rebuild once stale entries outnumber the live ones (amortised O(log n))."""
        if len(self._heap) > 2 * len(self._busy) + 32:
            self._heap = sorted((count, tie, wid)
                                for wid, (count, tie) in self._busy.items())
