"""What a simulated run measured: a timeline sampled on simulated time, and its figures.

``gbps_sustained`` is the rate between the moments 5% and 95% of the bytes were delivered
(ramp-up and tail left out); ``link_utilisation`` is the busiest inter-rack link's mean use
over that same window, ``link_utilisation_peak`` its highest sample; ``interrack_bytes``
all bytes that crossed racks (every inter-rack link, both directions). The tail is the time
the last 5% of files took to finish after the first 95% had.
"""

from __future__ import annotations

import bisect
import itertools
from collections import Counter
from dataclasses import asdict, dataclass, field
from typing import TYPE_CHECKING, Any

from datavine.apps.sim.spec import GBPS

if TYPE_CHECKING:
    from datavine.apps.sim.driver import SimRun


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
    t: list[float] = field(default_factory=list)
    gbps: list[float] = field(default_factory=list)
    link_util: list[float] = field(default_factory=list)
    near_gbps: list[float] = field(default_factory=list)
    busy: list[float] = field(default_factory=list)
    file_done_s: list[float] = field(default_factory=list)

    def figures(self) -> dict[str, Any]:
        """The scalar figures (no series)."""
        skip = {"t", "gbps", "link_util", "near_gbps", "busy", "file_done_s"}
        return {k: v for k, v in asdict(self).items() if k not in skip}


class Recorder:
    """Samples a :class:`SimRun` every ``sample_s`` of simulated time."""

    def __init__(self, run: SimRun, sample_s: float) -> None:
        self.run = run
        self.sample_s = sample_s
        self.rows: list[tuple[float, float, float, float, int]] = []  # t, bytes, near, link
        self.done: list[float] = []
        self.bundles = 0
        self._scheduled = False

    def sample(self) -> None:
        run = self.run
        run.net.advance(run.q.now)
        total = near = 0.0
        for cls in run.net.classes.values():
            if not isinstance(cls.key, tuple):
                continue  # not a read (a library starting)
            total += cls.bytes_total
            rack, shard, _ = cls.key
            if run.shard_of[shard].rack == rack:
                near += cls.bytes_total
        links = run.inter_links()
        link = max((run.net.link_bytes[name] for name in links), default=0.0)
        self.rows.append((run.q.now, total, near, link, run.tv.busy_cores))
        if not self._scheduled:
            self._scheduled = True
            run.q.after(self.sample_s, self._periodic)

    def _periodic(self) -> None:
        self._scheduled = False
        if not self.run.planner.finished:
            self.sample()

    def completed(self, keys: list[Any], t: float) -> None:
        self.bundles += 1
        self.done.extend(t for k in keys if k[0] == "process-file")

    def result(self) -> SimResult:
        run = self.run
        rows = self.rows
        ts = [r[0] for r in rows]
        wall = ts[-1] if ts else 0.0
        total = rows[-1][1] if rows else 0.0
        links = run.inter_links()
        cap = min((run.net.capacity[name] for name in links), default=0.0)
        t_mid, gbps, util, near, busy = [], [], [], [], []
        for a, b in itertools.pairwise(rows):
            dt = b[0] - a[0]
            if dt <= 0:
                continue
            t_mid.append(b[0])
            gbps.append((b[1] - a[1]) / dt / GBPS)
            near.append((b[2] - a[2]) / dt / GBPS)
            util.append((b[3] - a[3]) / dt / cap if cap else 0.0)
            busy.append(b[4] / max(run.tv.cores, 1))
        t5, t95 = _when(rows, 1, 0.05 * total), _when(rows, 1, 0.95 * total)
        window = max(t95 - t5, 1e-9)
        l5, l95 = _at(rows, 3, t5), _at(rows, 3, t95)
        done = sorted(self.done)
        n = len(done)
        tail_start = done[max(int(0.95 * n) - 1, 0)] if n else 0.0
        tail_s = (done[-1] - tail_start) if n else 0.0
        tail_bytes = total - _at(rows, 1, tail_start)
        cores_s = sum(r1[4] * (r2[0] - r1[0]) for r1, r2 in itertools.pairwise(rows))
        return SimResult(
            mode="blind" if run.run_cfg.placement is None else "datavine",
            cores=run.tv.cores, files=run.workload.n_files, wall_s=wall, bytes_total=total,
            gbps_avg=total / max(wall, 1e-9) / GBPS,
            gbps_sustained=0.9 * total / window / GBPS,
            gbps_peak=max(gbps, default=0.0),
            link_utilisation=(l95 - l5) / window / cap if cap else 0.0,
            link_utilisation_peak=max(util, default=0.0),
            near_fraction=(rows[-1][2] / total) if total else 1.0,
            tail_s=tail_s, tail_fraction=tail_s / max(wall, 1e-9),
            tail_gbps=tail_bytes / max(tail_s, 1e-9) / GBPS if tail_s else 0.0,
            busy_fraction=cores_s / max(wall * run.tv.cores, 1e-9),
            manager_busy_fraction=run.tv.manager_busy_s / max(wall, 1e-9),
            decisions=run.decisions, bundles=self.bundles,
            decision_us_per_bundle=1e6 * run.decision_s / max(self.bundles, 1),
            overruns=run.overruns, placement=dict(Counter(run.placement_tiers)),
            interrack_bytes=sum(run.net.link_bytes[name] for name in links),
            t=t_mid, gbps=gbps, link_util=util, near_gbps=near, busy=busy, file_done_s=done)


def _when(rows: list[tuple[float, float, float, float, int]], col: int, value: float) -> float:
    """Time column ``col`` reached ``value`` (linear between samples)."""
    values = [r[col] for r in rows]
    i = bisect.bisect_left(values, value)
    if i <= 0:
        return rows[0][0] if rows else 0.0
    if i >= len(rows):
        return rows[-1][0]
    (t0, v0), (t1, v1) = (rows[i - 1][0], values[i - 1]), (rows[i][0], values[i])
    return t0 if v1 == v0 else t0 + (value - v0) / (v1 - v0) * (t1 - t0)


def _at(rows: list[tuple[float, float, float, float, int]], col: int, t: float) -> float:
    """Column ``col`` at time ``t`` (linear between samples)."""
    ts = [r[0] for r in rows]
    i = bisect.bisect_left(ts, t)
    if i <= 0:
        return rows[0][col] if rows else 0.0
    if i >= len(rows):
        return rows[-1][col]
    t0, t1 = ts[i - 1], ts[i]
    v0, v1 = rows[i - 1][col], rows[i][col]
    return v0 if t1 == t0 else v0 + (t - t0) / (t1 - t0) * (v1 - v0)
