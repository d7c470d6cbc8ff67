"""A discrete-event model of a facility that runs datavine's own scheduling decisions.

What belongs here: simulated time (:mod:`.events`), links shared max-min fairly between
flows of bytes (:mod:`.network`), the facility and workload to simulate with the figures
they are calibrated from (:mod:`.spec`), a simulated TaskVine manager and its workers
(:mod:`.taskvine`), the driver that feeds datavine's real planner
(:class:`datavine.scheduler.bundling.Planner`), placement
(:func:`datavine.scheduler.placement.decide`,
:class:`datavine.scheduler.topology.Topology`), shard map (:class:`datavine.io.shards.ShardMap`) and
memory policy (:class:`datavine.scheduler.memory.MemoryState`) with that simulated facility
(:mod:`.driver`), and what a run measured (:mod:`.results`, :mod:`.plot`).

What does not: any scheduling decision of its own. The driver dispatches through the same
:class:`datavine.scheduler.dispatch.Dispatcher` as
:class:`datavine.manager.execution.GraphRun` (fill free
slots, hold or place each bundle, count in-flight bundles per target) and asks datavine's
pure modules for every choice; only TaskVine's part (which free core a call matching its
features lands on) is modelled here.

::

    from datavine.apps.sim import FacilitySpec, Workload, simulate
    result = simulate(FacilitySpec.challenge(), Workload.challenge(), mode="datavine")
    print(result.gbps_sustained, result.link_utilisation)
"""

from datavine.apps.sim.driver import SimConfig, SimRun, simulate
from datavine.apps.sim.results import SimResult
from datavine.apps.sim.spec import FacilitySpec, ManagerCost, ShardSpec, Workload

__all__ = ["FacilitySpec", "ManagerCost", "ShardSpec", "SimConfig", "SimResult", "SimRun",
           "Workload", "simulate"]
