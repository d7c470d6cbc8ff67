"""A long run's steady state: simulate a window of it, not all of it.

A facility that reads 200 TB in 30 minutes runs ~1.8M bundles; the model runs datavine's
own decisions for each, which takes about a millisecond of this host's time per bundle, so
it cannot run them all in minutes. :func:`steady_state` simulates ``warmup_s`` +
``window_s`` seconds of the run (with enough files that none runs out) and measures the
window only: the rate reached, each resource's use, what limits the run
(:meth:`~datavine.apps.sim.results.Window.limited_by`), the manager cores the demand needs
and the manager's NIC bytes per byte read.

The warm-up (:func:`warmup_for`) lasts until the start is behind: a few bundles' time, and
the calls submitted ahead at the start (``bundles_per_slot`` a core) gone through the
manager. Until then a manager at its limit sends file bundles only (the merges wait behind
that first queue), which flatters its rate.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, replace

from datavine.apps.sim.driver import SimConfig, simulate
from datavine.apps.sim.results import SimResult, Window
from datavine.apps.sim.spec import GBPS, FacilitySpec, ManagerCost, Workload

FILES_MARGIN = 1.3  # files for the window, over what its cores can read at full rate
WARMUP_BUNDLES = 3.0  # the warm-up lasts at least this many mean bundles' time
WARMUP_MARGIN = 1.2  # and this much longer than the manager takes for the first calls


@dataclass(frozen=True)
class SteadyState:
    """One window of a run at ``demand_gbps`` (every core at its full event rate)."""

    result: SimResult
    window: Window
    demand_gbps: float
    manager_s_per_bundle: float | None

    @property
    def gbps(self) -> float:
        return self.window.gbps

    @property
    def limited_by(self) -> str:
        return self.window.limited_by()

    @property
    def manager_cores(self) -> float:
        return self.window.manager_cores(self.demand_gbps)

    @property
    def nic_share(self) -> float:
        return self.window.nic_share

    @property
    def nic_gbps(self) -> float:
        w = self.window
        return w.nic_bytes / (w.t_to - w.t_from) / GBPS

    @property
    def link_utilisation(self) -> float:
        return self.window.link_utilisation


def demand_gbps(facility: FacilitySpec, workload: Workload) -> float:
    """What the facility's cores read when every one works at its full event rate."""
    return facility.cores * workload.core_bytes_per_s / GBPS


def window_files(facility: FacilitySpec, workload: Workload, seconds: float,
                 bundles_per_slot: int) -> int:
    """Files enough that a run of ``seconds`` does not run out: what its cores read at
    full rate, with a margin, and the bundles submitted ahead of the cores."""
    per_core = seconds / workload.core_s_per_file
    return math.ceil(facility.cores * (FILES_MARGIN * per_core + bundles_per_slot))


def manager_s_per_bundle(cost: ManagerCost) -> float | None:
    """The manager's core-seconds per bundle (None: decisions charged as they run)."""
    if cost.decision_s is None:
        return None
    return cost.dispatch_s + cost.result_s + cost.decision_s


def warmup_for(facility: FacilitySpec, workload: Workload, cost: ManagerCost,
               bundles_per_slot: int) -> float:
    """Seconds to simulate before the window: ``WARMUP_BUNDLES`` mean bundles, or the
    manager's time for the calls submitted at the start (``bundles_per_slot`` a core) with
    a margin, whichever is longer."""
    per = manager_s_per_bundle(cost) or 0.0
    first_calls = facility.cores * bundles_per_slot * per
    return max(WARMUP_BUNDLES * workload.core_s_per_file, WARMUP_MARGIN * first_calls)


def steady_state(facility: FacilitySpec, workload: Workload, cost: ManagerCost,
                 window_s: float = 60.0, warmup_s: float | None = None,
                 mode: str = "datavine", config: SimConfig | None = None) -> SteadyState:
    """Simulate ``warmup_s + window_s`` seconds and measure the last ``window_s``
    (``warmup_s`` None: :func:`warmup_for`'s). ``workload.n_files`` is replaced by
    :func:`window_files`'s count."""
    base = config or SimConfig()
    if warmup_s is None:
        warmup_s = warmup_for(facility, workload, cost, base.run.bundles_per_slot)
    if window_s <= 0 or warmup_s < 0:
        raise ValueError(f"a window needs window_s > 0 and warmup_s >= 0, got {window_s} "
                         f"and {warmup_s}")
    end = warmup_s + window_s
    config = replace(base, cost=cost, max_time_s=end)
    files = window_files(facility, workload, end, config.run.bundles_per_slot)
    result = simulate(facility, replace(workload, n_files=files), mode, config)
    if result.wall_s < end:
        raise RuntimeError(f"the run of {files} files ended at {result.wall_s:.1f} s, before "
                           f"its window's end ({end:g} s): not a steady state")
    return SteadyState(result, result.window(warmup_s, end), demand_gbps(facility, workload),
                       manager_s_per_bundle(cost))
