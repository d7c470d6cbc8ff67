"""The simulation driver: datavine's own run state machine runs a simulated facility.

:class:`SimRun` builds the graph a run over the workload's files would have (one task per
file, then merges of ``merge_fanin``), a :class:`~datavine.io.shards.ShardMap` of the XCache
nodes, a :class:`~datavine.scheduler.topology.Topology` announcing every simulated worker by
name (as ``LocalCluster`` and named pool workers do), and then drives
:class:`~datavine.scheduler.run_state.RunState`, the same state machine a real run's driver
(:class:`datavine.manager.execution.GraphRun`) drives, on simulated time: a :class:`Tick` on
each turn of the loop and after each result (bundles from the planner, placed or held by the
dispatcher's delay scheduling, capped by the memory policy), a :class:`CallDone` for each
call that comes back (results, overruns retried under a larger cap, costs and peaks
learned). ``RunConfig(placement=None)`` is datavine locality-blind, as in
``benchmarks/locality.py``. TaskVine's part is :class:`~datavine.apps.sim.taskvine.SimTaskVine`,
the bytes move through :class:`~datavine.apps.sim.network.Network`.

A call's work is one flow: its file's bytes from its shard (across racks when the shard is
in another rack; from the origin first when the shard misses) at the rate one core consumes
them. When the facility's workers share a machine (``FacilitySpec.host_cores``), the cores
are one more link of that flow's path, ``host_cores`` core-seconds per second shared
max-min fairly with every other running call, so that a call waiting on the network leaves
its core to the others, as the kernel's scheduler does. A worker's first call first waits
``Workload.startup_wait_s`` and spends ``Workload.startup_s`` core-seconds (its library
starting) on those same cores.

The manager's host is two resources that saturate (:mod:`.manager`): its core, which every
call sent and every result taken occupies (``ManagerCost``), and its NIC, which the call's
bytes (its spec as pickled, plus ``Workload.task_bytes`` a task) and the result's
(``Workload.result_bytes``) cross. The driver samples the run's counters into a
:class:`~datavine.apps.sim.results.Timeline` every ``SimConfig.sample_s``.
"""

from __future__ import annotations

import math
import pickle
import random
import time
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import cloudpickle

from datavine.apps.sim.events import EventQueue
from datavine.apps.sim.network import Network
from datavine.apps.sim.results import RunFacts, Sample, SimResult, Timeline, summarise
from datavine.apps.sim.spec import (
    GBPS,
    INTER_LINK,
    FacilitySpec,
    ManagerCost,
    Workload,
    inter_link,
    shard_link,
)
from datavine.apps.sim.taskvine import SimCall, SimTaskVine, SimWorker
from datavine.config import RunConfig
from datavine.io.shards import Shard, ShardHealth, ShardMap
from datavine.protocol import BundleResult, Status
from datavine.scheduler.bundling import CostModel
from datavine.scheduler.graph import TaskGraph
from datavine.scheduler.learned import Learned
from datavine.scheduler.memory import MemoryState
from datavine.scheduler.run_messages import CallDone, Fail, Submit, Tick
from datavine.scheduler.run_state import RunState
from datavine.scheduler.topology import Topology

FILE_CATEGORY, MERGE_CATEGORY = "process-file", "merge"
CPU = "cpu"  # the machine's cores, a link of every flow when workers share them
STARTUP = "startup"  # flow class of libraries starting
PICKLE = pickle.HIGHEST_PROTOCOL


@dataclass(frozen=True)
class SimConfig:
    """How to run the model: datavine's own ``RunConfig`` (``placement=None`` is blind),
    the manager's costs, the sampling period of the timeline, a bound on simulated time."""

    run: RunConfig = field(default_factory=RunConfig)
    cost: ManagerCost = field(default_factory=ManagerCost)
    sample_s: float = 1.0
    max_time_s: float = 1e6
    seed: int = 0


@dataclass
class _Inflight:
    keys: list[Any]
    outputs: list[Any]  # those tasks outside the bundle (or the caller) need
    cap_mb: float | None
    started: float = 0.0


def workload_graph(n_files: int, fanin: int, lfn_format: str = "/store/sim/file-{:06d}.root"
                   ) -> tuple[TaskGraph, list[str]]:
    """The graph of one run: a task per file, merges of ``fanin`` up to one output; and the
    files' logical names. Priorities as dask.order gives a reduction (depth first)."""
    lfns = [lfn_format.format(i) for i in range(n_files)]
    deps: dict[Any, frozenset[Any]] = {}
    priority: dict[Any, float] = {}
    level: list[tuple[str | int, ...]] = []
    for i in range(n_files):
        file_key = (FILE_CATEGORY, i)
        deps[file_key], priority[file_key] = frozenset(), float(i)
        level.append(file_key)
    depth = 0
    while len(level) > 1:
        merged: list[tuple[str | int, ...]] = []
        for j in range(0, len(level), fanin):
            merge_key = (MERGE_CATEGORY, depth, j // fanin)
            inputs = level[j:j + fanin]
            deps[merge_key] = frozenset(inputs)
            priority[merge_key] = max(priority[k] for k in inputs) + 0.5 / (depth + 1)
            merged.append(merge_key)
        level, depth = merged, depth + 1
    dependents: dict[Any, set[Any]] = {k: set() for k in deps}
    for key, ds in deps.items():
        for d in ds:
            dependents[d].add(key)
    nodes = dict.fromkeys(deps)
    graph = TaskGraph(nodes, deps, dependents, priority, {level[0]})  # type: ignore[arg-type]
    return graph, lfns


class SimRun:
    """One simulated run of the workload on the facility."""

    def __init__(self, facility: FacilitySpec, workload: Workload,
                 config: SimConfig | None = None) -> None:
        self.facility, self.workload = facility, workload
        self.cfg = config or SimConfig()
        self.run_cfg = self.cfg.run
        self.q = EventQueue()
        self.shardmap = ShardMap(Shard(url=f"root://{s.host or s.name}:1094", rack=s.rack,
                                       name=s.name,
                                       weight=s.gbps if facility.weighted else 1.0)
                                 for s in facility.shards)
        self.shard_of = {s.name: s for s in facility.shards}
        self.graph, self.lfns = workload_graph(workload.n_files, workload.merge_fanin,
                                               workload.lfn_format)
        rng = random.Random(workload.seed)
        sigma = workload.spread
        self.events = [workload.events_per_file * math.exp(rng.gauss(-sigma * sigma / 2, sigma))
                       for _ in self.lfns]
        self.hit = [rng.random() < workload.hit_fraction for _ in self.lfns]
        topology = Topology(self.run_cfg.bundles_per_slot)
        workers = [SimWorker(name, rack, facility.cores_per_worker, host=host)
                   for name, rack, host in facility.workers()]
        for w in workers:  # known at connect: names, racks and hosts
            topology.announce(w.id, w.rack, w.cores, host=w.host)
        self.started_workers: set[str] = set()
        policy = self.run_cfg.memory
        self.learned = Learned(CostModel(), MemoryState(policy) if policy is not None else None,
                               topology, ShardHealth())
        # the model's own bound is SimConfig.max_time_s; results come back inline; its
        # workers run at one speed and it does not cancel calls: no backup copies
        self.state = RunState(self.graph, self.run_cfg.replace(shardmap=self.shardmap,
                                                               timeout_s=0, speculation=False),
                              self.learned, now=0.0, files_of=self._files)
        self.tv = SimTaskVine(self.q, workers, self.cfg.cost, self._started, self._result,
                              seed=self.cfg.seed,
                              nic_bytes_per_s=facility.manager_nic_gbps * GBPS)
        self.net = Network(self._capacities())
        self.inflight: dict[int, _Inflight] = {}  # by the state's call number
        self.decision_s = 0.0
        self.flows: dict[int, Callable[[], None]] = {}  # flow id -> what follows it
        self.timeline = Timeline()
        self._sampling = False
        self._net_version = 0
        self._shard_name: dict[int, str] = {}  # file -> its shard (all shards healthy)
        self._pickled: dict[int, int] = {}  # id of a shard map -> its pickle's size

    # --- setup ---------------------------------------------------------------------------
    def _files(self, key: Any) -> tuple[str, ...]:
        return (self.lfns[key[1]],) if key[0] == FILE_CATEGORY else ()

    def _capacities(self) -> dict[str, float]:
        f = self.facility
        caps = {shard_link(s.name): s.gbps * GBPS for s in f.shards}
        caps["wan"] = f.origin_gbps * GBPS
        if f.host_cores > 0:
            caps[CPU] = f.host_cores
        for a in f.racks:
            for b in f.racks:
                if a != b:
                    caps[inter_link(a, b, f.duplex)] = f.inter_rack_gbps * GBPS
        return caps

    def inter_links(self) -> list[str]:
        return [name for name in self.net.capacity if name.startswith(INTER_LINK)]

    def _path(self, rack: str, shard: str, hit: bool) -> list[tuple[str, float]]:
        path = [(shard_link(shard), 1.0)]
        home = self.shard_of[shard].rack
        if home != rack:
            path.append((inter_link(home, rack, self.facility.duplex), 1.0))
        if not hit:
            path.append(("wan", self.workload.miss_overhead))
        if CPU in self.net.capacity:  # core-seconds per byte
            path.append((CPU, 1.0 / self.workload.core_bytes_per_s))
        return path

    # --- the loop (GraphRun's, on simulated time) -----------------------------------------
    def run(self) -> SimResult:
        self.q.at(0.0, self._tick)
        self._sample()
        self.q.run(lambda: self.state.finished, self.cfg.max_time_s)
        self._sample()
        return summarise(self.timeline, self.facts())

    def facts(self) -> RunFacts:
        return RunFacts(
            mode="blind" if self.run_cfg.placement is None else "datavine",
            cores=self.tv.cores, files=self.workload.n_files, capacity=self.net.capacity,
            nic_bytes_per_s=self.tv.manager.nic_bytes_per_s, decisions=self.decisions,
            decision_s=self.decision_s, overruns=self.overruns,
            placement=dict(self.placement_tiers))

    # --- the timeline --------------------------------------------------------------------
    def _sample(self) -> None:
        """The counters now; the next sample ``sample_s`` later while the run goes."""
        now = self.q.now
        self.net.advance(now)
        total = near = 0.0
        for cls in self.net.classes.values():
            if not isinstance(cls.key, tuple):
                continue  # not a read (a library starting)
            total += cls.bytes_total
            rack, shard, _ = cls.key
            if self.shard_of[shard].rack == rack:
                near += cls.bytes_total
        manager = self.tv.manager
        self.timeline.samples.append(Sample(
            now, total, near, self.tv.busy_cores, manager.cpu.done_by(now),
            manager.nic_in.done_by(now), manager.nic_out.done_by(now), manager.nic_bytes,
            dict(self.net.link_bytes)))
        if not self._sampling:
            self._sampling = True
            self.q.after(self.cfg.sample_s, self._periodic)

    def _periodic(self) -> None:
        self._sampling = False
        if not self.planner.finished:
            self._sample()

    @property
    def planner(self) -> Any:
        return self.state.planner

    @property
    def decisions(self) -> int:
        return self.state.dispatch.decisions

    @property
    def overruns(self) -> int:
        return sum(c.overruns for c in self.state.summary.categories.values())

    @property
    def placement_tiers(self) -> Counter[str]:
        return self.state.summary.placement

    def _tick(self) -> None:
        self._handle(Tick(self.q.now, len(self.tv.workers), self.tv.cores))
        if not self.state.finished:
            self.q.after(self.cfg.cost.wait_s, self._tick)

    def _handle(self, event: Any) -> None:
        """One event through datavine's state machine; its instructions carried out here. The
        time its decisions really take is charged to the manager (or ``decision_s`` per
        bundle)."""
        wall = time.perf_counter()
        out = self.state.handle(event)
        spent = time.perf_counter() - wall
        self.decision_s += spent
        submits = [ins for ins in out if isinstance(ins, Submit)]
        if isinstance(event, Tick):
            per = self.cfg.cost.decision_s
            self.tv.busy(spent if per is None else per * max(len(submits), 1))
        for ins in out:
            if isinstance(ins, Fail):
                raise ins.error
        for ins in submits:
            self.inflight[ins.call] = _Inflight(ins.keys, ins.spec.outputs, ins.cap_mb)
            self.tv.submit(ins.call, worker=ins.target.worker, rack=ins.target.rack,
                           nbytes=self._call_bytes(ins))

    def _call_bytes(self, ins: Submit) -> float:
        """What the manager sends for a call: its spec as pickled (keys, inline inputs,
        the shard map) and ``Workload.task_bytes`` for each task's function and arguments
        (the model's tasks have none)."""
        record = ins.spec.encode()
        shardmap = record.pop("shardmap", None)  # the same in every call: pickled once
        if id(shardmap) not in self._pickled:
            self._pickled[id(shardmap)] = len(pickle.dumps(shardmap, protocol=PICKLE))
        spec = len(pickle.dumps(record, protocol=PICKLE)) + self._pickled[id(shardmap)]
        return spec + self.workload.task_bytes * len(ins.keys)

    # --- on the workers ------------------------------------------------------------------
    def _started(self, call: SimCall, t: float) -> None:
        entry = self.inflight[call.payload]
        entry.started = t
        keys = entry.keys
        merges = sum(1 for k in keys if k[0] == MERGE_CATEGORY)
        tail = merges * self.workload.merge_s
        if entry.cap_mb is not None and self._peak(keys) > entry.cap_mb:
            self.q.after(tail, self.tv.finish, call)  # killed over its cap: fails early
            return
        files = [k for k in keys if k[0] == FILE_CATEGORY]
        if not files:
            self.q.after(tail, self.tv.finish, call, self.workload.result_bytes)
            return
        worker = call.ran_on
        assert worker is not None
        first = worker.id not in self.started_workers
        self.started_workers.add(worker.id)
        if first and (self.workload.startup_s > 0 or self.workload.startup_wait_s > 0):
            self.q.after(self.workload.startup_wait_s, self._startup,
                         lambda: self._read(call, files[0][1], tail))
            return
        self._read(call, files[0][1], tail)

    def _startup(self, then: Callable[[], None]) -> None:
        """A worker's library starts (``startup_s`` core-seconds), then ``then``."""
        seconds = self.workload.startup_s
        if CPU not in self.net.capacity or seconds <= 0:
            self.q.after(seconds, then)
            return
        self.net.advance(self.q.now)
        cls = self.net.flow_class(STARTUP, [(CPU, 1.0)], 1.0)  # bytes: core-seconds
        self.flows[self.net.add(cls, seconds)] = then
        self._reshare()

    def _read(self, call: SimCall, i: int, tail: float) -> None:
        """The call reads file ``i`` (and works through its events), then its merges."""
        worker = call.ran_on
        assert worker is not None
        shard = self._shard_name.get(i)
        if shard is None:
            shard = self._shard_name[i] = self.shardmap.shard_for(self.lfns[i]).name
        path = self._path(worker.rack, shard, self.hit[i])
        key = (worker.rack, shard, self.hit[i])
        self.net.advance(self.q.now)
        cls = self.net.flow_class(key, path, self.workload.core_bytes_per_s)
        fid = self.net.add(cls, self.events[i] * self.workload.bytes_per_event)
        self.flows[fid] = lambda: self.q.after(tail, self.tv.finish, call,
                                               self.workload.result_bytes)
        self._reshare()

    def _reshare(self) -> None:
        self.net.share()
        self._net_version += 1
        dt = self.net.next_completion()
        if dt is not None:
            self.q.after(dt, self._net_event, self._net_version)

    def _net_event(self, version: int) -> None:
        if version != self._net_version:
            return  # rates changed since this was scheduled
        self.net.advance(self.q.now)
        for _, fid in self.net.finished():
            self.flows.pop(fid)()
        self._reshare()

    def _peak(self, keys: list[Any]) -> float:
        files = [k[1] for k in keys if k[0] == FILE_CATEGORY]
        scale = max((self.events[i] / self.workload.events_per_file for i in files), default=0.3)
        return self.workload.peak_mb * (0.5 + 0.5 * scale)

    # --- results: what the library would send back ----------------------------------------
    def _result(self, call: SimCall, t: float) -> None:
        entry = self.inflight.pop(call.payload)
        worker = call.ran_on
        assert worker is not None
        peak = self._peak(entry.keys)
        result: BundleResult
        if entry.cap_mb is not None and peak > entry.cap_mb:
            result = BundleResult(Status.MEMORY, peak_mb=peak, cap_mb=entry.cap_mb)
        else:
            counts = Counter(self.graph.category(k) for k in entry.keys)
            seconds = t - entry.started
            result = BundleResult(Status.OK, peak_mb=peak, worker=worker.id, rack=worker.rack,
                                  host=worker.host or worker.id,
                                  values=dict.fromkeys(entry.outputs, _NONE),
                                  timing={c: (n, seconds * n / len(entry.keys))
                                          for c, n in counts.items()})
            self.timeline.completed(sum(1 for k in entry.keys if k[0] == FILE_CATEGORY), t)
        self._handle(CallDone(call.payload, result, None, t))
        self._handle(Tick(t, len(self.tv.workers), self.tv.cores))  # fill the freed slot


_NONE = cloudpickle.dumps(None)  # a value's bytes in a simulated result


def simulate(facility: FacilitySpec, workload: Workload, mode: str = "datavine",
             config: SimConfig | None = None) -> SimResult:
    """Run the model once; ``mode`` ``"blind"`` switches datavine's placement off."""
    config = config or SimConfig()
    if mode == "blind":
        config = SimConfig(config.run.replace(placement=None), config.cost, config.sample_s,
                           config.max_time_s, config.seed)
    elif mode != "datavine":
        raise ValueError(f"mode must be 'datavine' or 'blind', got {mode!r}")
    return SimRun(facility, workload, config).run()
