"""The simulation driver: datavine's planner, placement, shard map and memory policy run a
simulated facility.

:class:`SimRun` builds the graph a run over the workload's files would have (one task per
file, then merges of ``merge_fanin``), a :class:`~datavine.io.shards.ShardMap` of the XCache
nodes, a :class:`~datavine.scheduler.topology.Topology` announcing every simulated worker by
name (as
``LocalCluster`` and named pool workers do), and then repeats what
:class:`datavine.manager.execution.GraphRun` does on each turn of its loop: fill the free slots
(``bundles_per_slot`` per core) through datavine's :class:`~datavine.scheduler.dispatch.Dispatcher`
(bundles from the :class:`~datavine.scheduler.bundling.Planner`, held or placed by
:func:`~datavine.scheduler.placement.decide`, waits counted from the later of its arrival and its
rack's last near bundle), cap each with
:class:`~datavine.scheduler.memory.MemoryState`, and take results back (planner, topology, costs and
memory learn from them). ``RunConfig(placement=None)`` is datavine locality-blind, as in
``benchmarks/locality.py``. TaskVine's part is :class:`~datavine.apps.sim.taskvine.SimTaskVine`,
the bytes move through :class:`~datavine.apps.sim.network.Network`.
"""

from __future__ import annotations

import math
import random
import time
from collections import Counter
from dataclasses import dataclass, field
from typing import Any

from datavine.apps.sim.events import EventQueue
from datavine.apps.sim.network import Network
from datavine.apps.sim.results import Recorder, SimResult
from datavine.apps.sim.spec import GBPS, FacilitySpec, ManagerCost, Workload
from datavine.apps.sim.taskvine import SimCall, SimTaskVine, SimWorker
from datavine.config import RunConfig
from datavine.io.shards import Shard, ShardHealth, ShardMap
from datavine.scheduler.bundling import Bundle, CostModel, Planner
from datavine.scheduler.dispatch import Dispatcher
from datavine.scheduler.graph import TaskGraph
from datavine.scheduler.memory import GiveUp, MemoryState
from datavine.scheduler.placement import Placement
from datavine.scheduler.topology import ANYWHERE, Target, Topology

FILE_CATEGORY, MERGE_CATEGORY = "process-file", "merge"


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
    bundle: Bundle
    target: Target
    category: str
    cap_mb: float | None
    started: float = 0.0


def workload_graph(n_files: int, fanin: int) -> tuple[TaskGraph, list[str]]:
    """The graph of one run: a task per file, merges of ``fanin`` up to one output; and the
    files' logical names. Priorities as dask.order gives a reduction (depth first)."""
    lfns = [f"/store/sim/file-{i:06d}.root" for i in range(n_files)]
    deps: dict[Any, frozenset[Any]] = {}
    priority: dict[Any, float] = {}
    level = []
    for i in range(n_files):
        key = (FILE_CATEGORY, i)
        deps[key], priority[key] = frozenset(), float(i)
        level.append(key)
    depth = 0
    while len(level) > 1:
        merged = []
        for j in range(0, len(level), fanin):
            key = (MERGE_CATEGORY, depth, j // fanin)
            inputs = level[j:j + fanin]
            deps[key] = frozenset(inputs)
            priority[key] = max(priority[k] for k in inputs) + 0.5 / (depth + 1)
            merged.append(key)
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
        self.shardmap = ShardMap(Shard(url=f"root://{s.name}:1094", rack=s.rack, name=s.name,
                                       weight=s.gbps if facility.weighted else 1.0)
                                 for s in facility.shards)
        self.shard_of = {s.name: s for s in facility.shards}
        self.graph, self.lfns = workload_graph(workload.n_files, workload.merge_fanin)
        rng = random.Random(workload.seed)
        sigma = workload.spread
        self.events = [workload.events_per_file * math.exp(rng.gauss(-sigma * sigma / 2, sigma))
                       for _ in self.lfns]
        self.hit = [rng.random() < workload.hit_fraction for _ in self.lfns]
        self.costs = CostModel()
        policy = self.run_cfg.memory
        self.memory = MemoryState(policy) if policy is not None else None
        self.planner = Planner(self.graph, files=self._files, costs=self.costs,
                               target_s=self.run_cfg.target_bundle_s,
                               max_tasks=self.run_cfg.max_bundle_tasks)
        self.topology = Topology(self.run_cfg.bundles_per_slot)
        workers = [SimWorker(f"{rack}-w{i:03d}", rack, facility.cores_per_worker)
                   for rack in facility.racks for i in range(facility.workers_per_rack)]
        for w in workers:
            self.topology.announce(w.id, w.rack, w.cores)
        self.tv = SimTaskVine(self.q, workers, self.cfg.cost, self._started, self._result,
                              seed=self.cfg.seed)
        self.net = Network(self._capacities())
        self.dispatch = Dispatcher(self.planner, self.topology, self.run_cfg.placement,
                                   self.shardmap, ShardHealth(),
                                   self.run_cfg.bundles_per_slot)
        self.inflight: dict[int, _Inflight] = {}
        self.cap_override: dict[Any, float] = {}
        self.placement_tiers: Counter[str] = Counter()
        self.decision_s = 0.0
        self.overruns = 0
        self.flows: dict[int, tuple[SimCall, float]] = {}  # flow id -> (call, merges' time)
        self.rec = Recorder(self, self.cfg.sample_s)
        self._net_version = 0

    # --- setup ---------------------------------------------------------------------------
    def _files(self, key: Any) -> tuple[str, ...]:
        return (self.lfns[key[1]],) if key[0] == FILE_CATEGORY else ()

    def _capacities(self) -> dict[str, float]:
        f = self.facility
        caps = {f"nic:{s.name}": s.gbps * GBPS for s in f.shards}
        caps["wan"] = f.origin_gbps * GBPS
        for a in f.racks:
            for b in f.racks:
                if a < b:
                    if f.duplex:
                        caps[f"inter:{a}>{b}"] = caps[f"inter:{b}>{a}"] = f.inter_rack_gbps * GBPS
                    else:
                        caps[f"inter:{a}|{b}"] = f.inter_rack_gbps * GBPS
        return caps

    def inter_links(self) -> list[str]:
        return [name for name in self.net.capacity if name.startswith("inter:")]

    def _path(self, rack: str, shard: str, hit: bool) -> list[tuple[str, float]]:
        path = [(f"nic:{shard}", 1.0)]
        home = self.shard_of[shard].rack
        if home != rack:
            a, b = sorted((home, rack))
            path.append((f"inter:{home}>{rack}" if self.facility.duplex else f"inter:{a}|{b}",
                         1.0))
        if not hit:
            path.append(("wan", self.workload.miss_overhead))
        return path

    # --- the loop (GraphRun's, on simulated time) -----------------------------------------
    def run(self) -> SimResult:
        self.q.at(0.0, self._tick)
        self.rec.sample()
        self.q.run(lambda: self.planner.finished, self.cfg.max_time_s)
        self.rec.sample()
        return self.rec.result()

    def _tick(self) -> None:
        self._submit()
        if not self.planner.finished:
            self.q.after(self.cfg.cost.wait_s, self._tick)

    def _submit(self) -> None:
        """Fill the free slots through datavine's own
        :class:`~datavine.scheduler.dispatch.Dispatcher`
        (held bundles, delay scheduling, look-ahead), as the run loop does; the time its
        decisions really take is charged to the manager (or ``decision_s`` per bundle)."""
        wall = time.perf_counter()
        out = self.dispatch.fill(self.q.now, self.tv.cores, len(self.inflight))
        spent = time.perf_counter() - wall
        self.decision_s += spent
        per = self.cfg.cost.decision_s
        self.tv.busy(spent if per is None else per * max(len(out), 1))
        for bundle, target, placement in out:
            self._submit_bundle(bundle, target, placement)

    @property
    def decisions(self) -> int:
        return self.dispatch.decisions

    def _submit_bundle(self, bundle: Bundle, target: Target, placement: Placement) -> None:
        categories = [self.graph.category(k) for k in bundle.keys]
        category = (self.memory.dominant_category(categories) if self.memory is not None
                    else categories[0])
        cap = None
        if self.memory is not None:
            retried = [self.cap_override[k] for k in bundle.keys if k in self.cap_override]
            cap = max(retried) if retried else self.memory.cap_for(category)
        call = self.tv.submit(bundle, worker=target.worker, rack=target.rack)
        self.inflight[call.seq] = _Inflight(bundle, target, category, cap)
        if bundle.files:
            self.placement_tiers[placement.tier.name.lower() if target != ANYWHERE
                                 else "anywhere"] += 1

    # --- on the workers ------------------------------------------------------------------
    def _started(self, call: SimCall, t: float) -> None:
        entry = self.inflight[call.seq]
        entry.started = t
        bundle = entry.bundle
        merges = sum(1 for k in bundle.keys if k[0] == MERGE_CATEGORY)
        tail = merges * self.workload.merge_s
        if entry.cap_mb is not None and self._peak(bundle) > entry.cap_mb:
            self.q.after(tail, self.tv.finish, call)  # killed over its cap: fails early
            return
        files = [k for k in bundle.keys if k[0] == FILE_CATEGORY]
        if not files:
            self.q.after(tail, self.tv.finish, call)
            return
        i = files[0][1]
        worker = call.ran_on
        assert worker is not None
        shard = self.shardmap.shard_for(self.lfns[i]).name
        path = self._path(worker.rack, shard, self.hit[i])
        key = (worker.rack, shard, self.hit[i])
        self.net.advance(t)
        cls = self.net.flow_class(key, path, self.workload.core_bytes_per_s)
        fid = self.net.add(cls, self.events[i] * self.workload.bytes_per_event)
        self.flows[fid] = (call, tail)
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
            call, tail = self.flows.pop(fid)
            self.q.after(tail, self.tv.finish, call)
        self._reshare()

    def _peak(self, bundle: Bundle) -> float:
        files = [k[1] for k in bundle.keys if k[0] == FILE_CATEGORY]
        scale = max((self.events[i] / self.workload.events_per_file for i in files), default=0.3)
        return self.workload.peak_mb * (0.5 + 0.5 * scale)

    # --- results (GraphRun._handle) ------------------------------------------------------
    def _result(self, call: SimCall, t: float) -> None:
        entry = self.inflight.pop(call.seq)
        self.topology.returned(entry.target)
        bundle = entry.bundle
        worker = call.ran_on
        assert worker is not None
        peak = self._peak(bundle)
        if entry.cap_mb is not None and peak > entry.cap_mb:
            self._overrun(entry, peak)
        else:
            self.planner.complete(bundle)
            files = [self.lfns[k[1]] for k in bundle.keys if k[0] == FILE_CATEGORY]
            self.topology.learn(worker.id, worker.rack, None, files)
            if self.memory is not None and entry.cap_mb:
                self.memory.record_peak(entry.category, peak)
            counts = Counter(self.graph.category(k) for k in bundle.keys)
            for category, n in counts.items():
                self.costs.observe(category, n, (t - entry.started) * n / len(bundle.keys))
            self.rec.completed(bundle, t)
        self._submit()

    def _overrun(self, entry: _Inflight, peak: float) -> None:
        assert self.memory is not None and entry.cap_mb is not None
        self.overruns += 1
        decision = self.memory.after_overrun(entry.category, entry.cap_mb, peak)
        if isinstance(decision, GiveUp):
            raise RuntimeError(decision.reason)
        for key in entry.bundle.keys:
            self.cap_override[key] = decision.cap_mb
        self.planner.requeue(entry.bundle)


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
