"""What a simulated run measured: samples of its counters on simulated time, and its figures.

The driver (:mod:`.driver`) records a :class:`Timeline`: a :class:`Sample` of the run's
cumulative counters every ``sample_s`` and the moment each file finished; :func:`summarise`
turns it and the run's :class:`RunFacts` into a :class:`SimResult`. Nothing here knows the
driver: samples and facts are plain data.

``gbps_sustained`` is the rate between the moments 5% and 95% of the bytes were delivered
(ramp-up and tail left out); ``link_utilisation`` is the busiest inter-rack link's mean use
over that same window, ``link_utilisation_peak`` its highest sample; ``interrack_bytes``
all bytes that crossed racks (every inter-rack link, both directions). The tail is the time
the last 5% of files took to finish after the first 95% had.

:meth:`SimResult.window` gives the figures of a stretch of simulated time (a steady state,
when a run is simulated for a window rather than to its end): the rate, each resource's use
(the busiest inter-rack link, the busiest XCache node, the manager's core and NIC), and
:meth:`Window.limited_by`, the resource that stops the run short of its demand.
"""

from __future__ import annotations

import bisect
import itertools
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field, fields
from typing import Any, NamedTuple

from datavine.apps.sim.spec import GBPS, INTER_LINK, SHARD_LINK

SATURATED = 0.95  # a resource used this much of a window is the run's limit
LIMITS = ("manager_cpu", "interrack_link", "shards", "nic", "none")


class Sample(NamedTuple):
    """The run's counters at time ``t``, cumulative since it started."""

    t: float
    bytes: float  # bytes the calls read
    near: float  # of which from an XCache node in the reader's rack
    busy_cores: int  # cores taken now (working, or holding a result not yet taken)
    manager_cpu_s: float  # the manager core's seconds of work done
    manager_nic_in_s: float  # seconds the manager's NIC was busy taking results in
    manager_nic_out_s: float  # and sending calls out
    manager_nic_bytes: float  # bytes through it, both directions (sent or queued)
    links: dict[str, float]  # bytes each network link carried


@dataclass
class Timeline:
    """What the driver records while a run goes."""

    samples: list[Sample] = field(default_factory=list)
    file_done_s: list[float] = field(default_factory=list)
    bundles: int = 0

    def completed(self, files: int, t: float) -> None:
        """A bundle of ``files`` files finished at ``t``."""
        self.bundles += 1
        self.file_done_s.extend([t] * files)


@dataclass(frozen=True)
class RunFacts:
    """What a result needs besides the timeline: the run's mode and size, its links'
    capacities (bytes/s), the manager's NIC (bytes/s, 0: not modelled) and datavine's
    counters."""

    mode: str
    cores: int
    files: int
    capacity: Mapping[str, float]
    nic_bytes_per_s: float
    decisions: int
    decision_s: float
    overruns: int
    placement: dict[str, int]


@dataclass(frozen=True)
class Window:
    """Figures of one stretch of simulated time, ``t_from`` to ``t_to`` (fractions are of
    the stretch; ``link`` and ``shard`` name the busiest; ``nic_busy`` is the manager's
    NIC's busier direction)."""

    t_from: float
    t_to: float
    gbps: float
    cores_busy: float
    link: str
    link_utilisation: float
    shard: str
    shard_utilisation: float
    manager_busy: float
    nic_busy: float
    nic_bytes: float
    data_bytes: float

    @property
    def nic_share(self) -> float:
        """Bytes through the manager's NIC per byte the cores read."""
        return self.nic_bytes / self.data_bytes if self.data_bytes else 0.0

    def utilisations(self) -> dict[str, float]:
        """Each resource that can stop the run, and how much of the window it was used."""
        return {"manager_cpu": self.manager_busy, "interrack_link": self.link_utilisation,
                "shards": self.shard_utilisation, "nic": self.nic_busy}

    def limited_by(self, saturated: float = SATURATED) -> str:
        """The most used resource among those used ``saturated`` of the window or more, or
        ``"none"`` (the cores' own rate, or idle cores that no resource explains)."""
        used = {name: u for name, u in self.utilisations().items() if u >= saturated}
        return max(used, key=used.__getitem__) if used else "none"

    def manager_cores(self, demand_gbps: float) -> float:
        """Manager cores the demand needs: its core's busy fraction, scaled from the rate
        reached to ``demand_gbps`` (> 1: one core is not enough)."""
        return self.manager_busy * demand_gbps / self.gbps if self.gbps > 0 else 0.0


@dataclass
class SimResult:
    """Figures of one simulated run (rates in Gbps, times in simulated seconds)."""

    mode: str
    cores: int
    files: int
    wall_s: float
    bytes_total: float
    gbps_avg: float
    gbps_sustained: float
    gbps_peak: float
    link_utilisation: float
    link_utilisation_peak: float
    near_fraction: float
    tail_s: float
    tail_fraction: float
    tail_gbps: float
    busy_fraction: float
    manager_busy_fraction: float
    decisions: int
    bundles: int
    decision_us_per_bundle: float
    overruns: int
    placement: dict[str, int]
    interrack_bytes: float = 0.0
    manager_nic_bytes: float = 0.0
    t: list[float] = field(default_factory=list)
    gbps: list[float] = field(default_factory=list)
    link_util: list[float] = field(default_factory=list)
    near_gbps: list[float] = field(default_factory=list)
    busy: list[float] = field(default_factory=list)
    file_done_s: list[float] = field(default_factory=list)
    samples: list[Sample] = field(default_factory=list, repr=False)
    capacity: dict[str, float] = field(default_factory=dict, repr=False)
    nic_bytes_per_s: float = 0.0

    _SERIES = ("t", "gbps", "link_util", "near_gbps", "busy", "file_done_s", "samples",
               "capacity")

    def figures(self) -> dict[str, Any]:
        """The scalar figures (no series)."""
        return {f.name: getattr(self, f.name) for f in fields(self)
                if f.name not in self._SERIES}

    def window(self, t_from: float, t_to: float | None = None) -> Window:
        """The figures from ``t_from`` to ``t_to`` (default: the end of the run)."""
        samples = self.samples
        if not samples:
            raise ValueError("a run without samples has no window")
        t_to = samples[-1].t if t_to is None else t_to
        if not t_to > t_from:
            raise ValueError(f"a window needs t_to > t_from, got {t_from} to {t_to}")
        span = t_to - t_from

        def delta(get: Callable[[Sample], float]) -> float:
            return _at(samples, get, t_to) - _at(samples, get, t_from)

        def busiest(prefix: str) -> tuple[str, float]:
            best, use = "", 0.0
            for name, cap in self.capacity.items():
                if name.startswith(prefix) and cap > 0:
                    u = delta(_link_bytes(name)) / span / cap
                    if u > use or not best:
                        best, use = name, u
            return best, use

        data = delta(lambda s: s.bytes)
        link, link_use = busiest(INTER_LINK)
        shard, shard_use = busiest(SHARD_LINK)
        cores_s = _integral(samples, t_from, t_to)
        return Window(
            t_from=t_from, t_to=t_to, gbps=data / span / GBPS,
            cores_busy=cores_s / span / max(self.cores, 1),
            link=link, link_utilisation=link_use, shard=shard, shard_utilisation=shard_use,
            manager_busy=delta(lambda s: s.manager_cpu_s) / span,
            nic_busy=max(delta(lambda s: s.manager_nic_in_s),
                         delta(lambda s: s.manager_nic_out_s)) / span,
            nic_bytes=delta(lambda s: s.manager_nic_bytes), data_bytes=data)


def summarise(timeline: Timeline, facts: RunFacts) -> SimResult:
    """The figures of a whole run."""
    rows = timeline.samples
    ts = [r.t for r in rows]
    wall = ts[-1] if ts else 0.0
    total = rows[-1].bytes if rows else 0.0
    inter = [name for name in facts.capacity if name.startswith(INTER_LINK)]
    cap = min((facts.capacity[name] for name in inter), default=0.0)

    def link(s: Sample) -> float:  # the busiest inter-rack link's bytes so far
        return max((s.links.get(name, 0.0) for name in inter), default=0.0)

    t_mid, gbps, util, near, busy = [], [], [], [], []
    for a, b in itertools.pairwise(rows):
        dt = b.t - a.t
        if dt <= 0:
            continue
        t_mid.append(b.t)
        gbps.append((b.bytes - a.bytes) / dt / GBPS)
        near.append((b.near - a.near) / dt / GBPS)
        util.append((link(b) - link(a)) / dt / cap if cap else 0.0)
        busy.append(b.busy_cores / max(facts.cores, 1))
    t5, t95 = _when(rows, 0.05 * total), _when(rows, 0.95 * total)
    window = max(t95 - t5, 1e-9)
    l5, l95 = _at(rows, link, t5), _at(rows, link, t95)
    done = sorted(timeline.file_done_s)
    n = len(done)
    tail_start = done[max(int(0.95 * n) - 1, 0)] if n else 0.0
    tail_s = (done[-1] - tail_start) if n else 0.0
    tail_bytes = total - _at(rows, lambda s: s.bytes, tail_start)
    last = rows[-1] if rows else None
    return SimResult(
        mode=facts.mode, cores=facts.cores, files=facts.files, wall_s=wall, bytes_total=total,
        gbps_avg=total / max(wall, 1e-9) / GBPS,
        gbps_sustained=0.9 * total / window / GBPS,
        gbps_peak=max(gbps, default=0.0),
        link_utilisation=(l95 - l5) / window / cap if cap else 0.0,
        link_utilisation_peak=max(util, default=0.0),
        near_fraction=(last.near / total) if last and total else 1.0,
        tail_s=tail_s, tail_fraction=tail_s / max(wall, 1e-9),
        tail_gbps=tail_bytes / max(tail_s, 1e-9) / GBPS if tail_s else 0.0,
        busy_fraction=_integral(rows, 0.0, wall) / max(wall * facts.cores, 1e-9),
        manager_busy_fraction=(last.manager_cpu_s / max(wall, 1e-9)) if last else 0.0,
        decisions=facts.decisions, bundles=timeline.bundles,
        decision_us_per_bundle=1e6 * facts.decision_s / max(timeline.bundles, 1),
        overruns=facts.overruns, placement=dict(facts.placement),
        interrack_bytes=sum(last.links.get(name, 0.0) for name in inter) if last else 0.0,
        manager_nic_bytes=last.manager_nic_bytes if last else 0.0,
        t=t_mid, gbps=gbps, link_util=util, near_gbps=near, busy=busy, file_done_s=done,
        samples=list(rows), capacity=dict(facts.capacity),
        nic_bytes_per_s=facts.nic_bytes_per_s)


def _link_bytes(name: str) -> Callable[[Sample], float]:
    """What a sample says link ``name`` carried so far."""
    return lambda s: s.links.get(name, 0.0)


def _integral(rows: list[Sample], t_from: float, t_to: float) -> float:
    """Core-seconds taken between ``t_from`` and ``t_to`` (each sample's busy cores held
    until the next sample)."""
    total = 0.0
    for a, b in itertools.pairwise(rows):
        lo, hi = max(a.t, t_from), min(b.t, t_to)
        if hi > lo:
            total += a.busy_cores * (hi - lo)
    return total


def _when(rows: list[Sample], value: float) -> float:
    """When the bytes read reached ``value`` (linear between samples)."""
    values = [r.bytes for r in rows]
    i = bisect.bisect_left(values, value)
    if i <= 0:
        return rows[0].t if rows else 0.0
    if i >= len(rows):
        return rows[-1].t
    (t0, v0), (t1, v1) = (rows[i - 1].t, values[i - 1]), (rows[i].t, values[i])
    return t0 if v1 == v0 else t0 + (value - v0) / (v1 - v0) * (t1 - t0)


def _at(rows: list[Sample], get: Callable[[Sample], float], t: float) -> float:
    """``get(sample)`` at time ``t`` (linear between samples)."""
    ts = [r.t for r in rows]
    i = bisect.bisect_left(ts, t)
    if i <= 0:
        return get(rows[0]) if rows else 0.0
    if i >= len(rows):
        return get(rows[-1])
    t0, t1 = ts[i - 1], ts[i]
    v0, v1 = get(rows[i - 1]), get(rows[i])
    return v0 if t1 == t0 else v0 + (t - t0) / (t1 - t0) * (v1 - v0)
