"""A discrete-event model of a facility that runs datavine's own scheduling decisions.

What belongs here: simulated time (:mod:`.events`), links shared max-min fairly between
flows of bytes (:mod:`.network`), the facility and workload to simulate with the figures
they are calibrated from (:mod:`.spec`), a simulated TaskVine manager and its workers
(:mod:`.taskvine`), the driver that feeds datavine's real planner
(:class:`datavine.bundling.Planner`), placement (:func:`datavine.placement.decide`,
:class:`datavine.topology.Topology`), shard map (:class:`datavine.shards.ShardMap`) and
memory policy (:class:`datavine.memory.MemoryState`) with that simulated facility
(:mod:`.driver`), and what a run measured (:mod:`.results`, :mod:`.plot`).

What does not: any scheduling decision of its own. The driver dispatches through the same
:class:`datavine.dispatch.Dispatcher` as :class:`datavine.execution.GraphRun` (fill free
slots, hold or place each bundle, count in-flight bundles per target) and asks datavine's
pure modules for every choice; only TaskVine's part (which free core a call matching its
features lands on) is modelled here.

::

    from datavine.sim import FacilitySpec, Workload, simulate
    result = simulate(FacilitySpec.challenge(), Workload.challenge(), mode="datavine")
    print(result.gbps_sustained, result.link_utilisation)
"""

from datavine.sim.driver import SimConfig, SimRun, simulate
from datavine.sim.results import SimResult
from datavine.sim.spec import FacilitySpec, ManagerCost, ShardSpec, Workload

__all__ = ["FacilitySpec", "ManagerCost", "ShardSpec", "SimConfig", "SimResult", "SimRun",
           "Workload", "simulate"]
