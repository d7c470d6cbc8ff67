"""A discrete-event model of a facility that runs datavine's own scheduling decisions.

What belongs here: simulated time (:mod:`.events`), links shared max-min fairly between
flows of bytes (:mod:`.network`), the facility and workload to simulate (:mod:`.spec`), a
simulated TaskVine manager and its workers (:mod:`.taskvine`) on a manager host whose core
and NIC saturate (:mod:`.manager`), the driver (:mod:`.driver`), what a run measured
(:mod:`.results`, :mod:`.plot`), a long run's steady state from a window of it
(:mod:`.steady`), the model's inputs measured by real loopback runs (:mod:`.calibration`)
and, from them and a description alone, the prediction of a facility in a box
(:mod:`.box`).

What does not: any scheduling decision of its own. The driver feeds the simulated
facility's events to :class:`datavine.scheduler.run_state.RunState`, the state machine a
real run's driver (:class:`datavine.manager.execution.GraphRun`) feeds, and carries out its
instructions: the planner, dispatcher (delay scheduling), topology, shard map, memory caps
and retries are datavine's own code; only TaskVine's part (which free core a call matching
its features lands on), the manager's host (its core and NIC) and the network are
modelled here.

::

    from datavine.apps.sim import FacilitySpec, Workload, simulate
    result = simulate(FacilitySpec.challenge(), Workload.challenge(), mode="datavine")
    print(result.gbps_sustained, result.link_utilisation)

    from datavine.apps.sim.steady import steady_state  # the HL-LHC target, 1 ms a bundle
    st = steady_state(FacilitySpec.hllhc(), Workload.hllhc(), ManagerCost.per_bundle(1.0))
    print(st.gbps, st.limited_by, st.manager_cores, st.nic_share)

    from datavine.apps.sim.box import BoxGeometry, load_calibration, predict_box
    calibration = load_calibration("runs/benchmarks/calibration.json")  # --calibrate made it
    print(predict_box(BoxGeometry(racks=2, hosts_per_rack=2, link_mbit=200), calibration))
"""

from datavine.apps.sim.driver import SimConfig, SimRun, simulate
from datavine.apps.sim.results import SimResult
from datavine.apps.sim.spec import FacilitySpec, ManagerCost, ShardSpec, Workload

__all__ = ["FacilitySpec", "ManagerCost", "ShardSpec", "SimConfig", "SimResult", "SimRun",
           "Workload", "simulate"]
