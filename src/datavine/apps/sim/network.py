"""Links shared by flows of bytes, max-min fair, in a fluid model.

Flows that take the same path and want the same rate form a *class* (e.g. "workers of rack
A reading from xcache-3, cache hit"): they all progress at one rate, so a class keeps one
service counter (bytes served per flow since it was created) and a heap of the counter
values at which its flows are done. Changing the flows of a class or the number of flows
re-divides the links (progressive filling over a few dozen classes), and the next completion
is the smallest ``(threshold - service) / rate`` over the classes: the cost of an event does
not grow with the number of flows.

A flow's demand is the rate its core can consume (events/s x bytes/event); a class whose
links have room runs at its demand, others share their bottleneck. ``weight`` is how many
bytes a flow moves on a link per byte it consumes (e.g. a cache miss pulls whole blocks).
"""

from __future__ import annotations

import heapq
import itertools
from collections.abc import Hashable, Mapping, Sequence
from dataclasses import dataclass, field

EPS_BYTES = 1e-3


@dataclass
class FlowClass:
    """Flows of one path and demand."""

    key: Hashable
    path: tuple[tuple[str, float], ...]  # (link, weight)
    demand: float  # bytes/s per flow
    rate: float = 0.0  # bytes/s per flow, set by Network.share
    service: float = 0.0  # bytes served per flow since creation
    bytes_total: float = 0.0  # bytes consumed by all its flows
    flows: list[tuple[float, int]] = field(default_factory=list)  # heap (threshold, id)

    @property
    def n(self) -> int:
        return len(self.flows)


class Network:
    """Link capacities (bytes/s) and the flow classes crossing them."""

    def __init__(self, capacities: Mapping[str, float]) -> None:
        self.capacity = dict(capacities)
        self.classes: dict[Hashable, FlowClass] = {}
        self.link_bytes: dict[str, float] = dict.fromkeys(self.capacity, 0.0)
        self._ids = itertools.count()
        self._last = 0.0

    def flow_class(self, key: Hashable, path: Sequence[tuple[str, float]],
                   demand: float) -> FlowClass:
        cls = self.classes.get(key)
        if cls is None:
            for link, _ in path:
                if link not in self.capacity:
                    raise KeyError(f"unknown link {link!r}")
            cls = self.classes[key] = FlowClass(key, tuple(path), demand)
        return cls

    def advance(self, now: float) -> None:
        """Serve every flow up to ``now`` at the current rates."""
        dt = now - self._last
        if dt <= 0:
            return
        for cls in self.classes.values():
            if cls.flows and cls.rate > 0:
                served = cls.rate * dt
                cls.service += served
                moved = served * cls.n
                cls.bytes_total += moved
                for link, weight in cls.path:
                    self.link_bytes[link] += moved * weight
        self._last = now

    def add(self, cls: FlowClass, nbytes: float) -> int:
        """A flow of ``nbytes`` joins ``cls`` (call :meth:`advance` first, then share)."""
        fid = next(self._ids)
        heapq.heappush(cls.flows, (cls.service + max(nbytes, 0.0), fid))
        return fid

    def finished(self) -> list[tuple[FlowClass, int]]:
        """Flows whose bytes are all served (after :meth:`advance`); removed from classes."""
        done = []
        for cls in self.classes.values():
            while cls.flows and cls.flows[0][0] <= cls.service + EPS_BYTES:
                done.append((cls, heapq.heappop(cls.flows)[1]))
        return done

    def next_completion(self) -> float | None:
        """Seconds from the last :meth:`advance` until the next flow is done, or None."""
        best = None
        for cls in self.classes.values():
            if cls.flows and cls.rate > 0:
                dt = max(cls.flows[0][0] - cls.service, 0.0) / cls.rate
                best = dt if best is None or dt < best else best
        return best

    def share(self) -> None:
        """Max-min fair rates by progressive filling, each class capped at its demand."""
        for cls in self.classes.values():
            cls.rate = 0.0
        active = [(c, len(c.flows)) for c in self.classes.values() if c.flows]
        remaining = dict(self.capacity)
        while active:
            load: dict[str, float] = {}
            for cls, n in active:
                for link, weight in cls.path:
                    load[link] = load.get(link, 0.0) + n * weight
            bottleneck, level = None, float("inf")
            for link, units in load.items():
                if units > 0 and remaining[link] / units < level:
                    bottleneck, level = link, remaining[link] / units
            satisfied = [(c, n) for c, n in active if c.demand <= level]
            frozen = satisfied or [(c, n) for c, n in active
                                   if any(link == bottleneck for link, _ in c.path)]
            for cls, n in frozen:
                cls.rate = cls.demand if satisfied else max(level, 0.0)
                for link, weight in cls.path:
                    remaining[link] = max(remaining[link] - cls.rate * n * weight, 0.0)
            ids = {id(c) for c, _ in frozen}
            active = [(c, n) for c, n in active if id(c) not in ids]

    def link_rate(self, link: str) -> float:
        """Bytes/s on ``link`` at the current rates."""
        return sum(c.rate * c.n * w for c in self.classes.values() for name, w in c.path
                   if name == link)
