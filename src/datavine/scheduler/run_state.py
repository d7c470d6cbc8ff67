"""The decisions of one ``get`` call, as a state machine: events in, instructions out.

:class:`RunState` holds what one run knows (the planner's ready and done tasks, the calls in
flight, the values at the manager and those kept on workers, retry counts) and
:meth:`RunState.handle` turns events into instructions, as distributed's
``worker_state_machine`` does. It reads no clock (every event carries the time), does no I/O
and never sees TaskVine: calls are numbered here, temp files are numbered here, and the driver
(:mod:`datavine.manager.execution`) maps both onto TaskVine's objects through the runtime's port.

Events: :class:`Tick` (the loop turned; the pool's size), :class:`PoolSample` (the calls'
TaskVine states, calls TaskVine requeued by itself, workers that left), :class:`CallDone` (a
call's status dict, or why there is none) and :class:`CallWithdrawn` (a call cancelled before
a worker took it, as asked). Instructions: :class:`Submit`, :class:`Withdraw` (cancel if not
dispatched yet), :class:`DropTemp`, :class:`Deliver` (values for progress and the result
hook) and :class:`Fail` (the run cannot succeed: raise this).

The decisions are the pure modules': bundles from :mod:`datavine.scheduler.bundling`, placement from
:mod:`datavine.scheduler.dispatch`, caps from :mod:`datavine.scheduler.memory`, kept values from
:mod:`datavine.scheduler.intermediates`. What a manager learns across runs (costs, memory peaks,
workers and racks, shard health) is one :class:`Learned` handed in.
"""

from __future__ import annotations

import itertools
from collections import Counter
from collections.abc import Callable, Hashable, Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any, NoReturn

import cloudpickle

from datavine.config import RunConfig
from datavine.errors import (
    BundleFailedError,
    MemoryCapError,
    NoWorkersError,
    RemoteTaskError,
    RunTimeoutError,
    TaskLoadError,
    TaskTimeLimitError,
)
from datavine.io.shards import ShardHealth, logical_name
from datavine.scheduler import graph as graphs
from datavine.scheduler.bundling import Bundle, CostModel, Planner
from datavine.scheduler.dispatch import Dispatcher
from datavine.scheduler.inputs import task_files
from datavine.scheduler.intermediates import Intermediates, Plan
from datavine.scheduler.memory import GiveUp, MemoryState
from datavine.scheduler.network import Finding, LibraryState, NetworkWatch
from datavine.scheduler.placement import Placement, placement_off_reason
from datavine.scheduler.summary import RunSummary
from datavine.scheduler.topology import Target, Topology, counted_tier
from datavine.worker import remote

Key = Hashable
TASK_READY = "READY"  # TaskVine's state of a call submitted and not dispatched to a worker


@dataclass
class Learned:
    """What a manager learns across runs and hands to each: task costs per category, memory
    peaks and caps, the workers it has seen (and their racks), shards seen failing, workers
    dropped for the network (:mod:`datavine.scheduler.network`)."""

    costs: CostModel
    memory: MemoryState | None
    topology: Topology
    shard_health: ShardHealth
    network: NetworkWatch = field(default_factory=NetworkWatch)

    @classmethod
    def fresh(cls, run: RunConfig, here: str = "localhost") -> Learned:
        """Nothing learned yet; ``here``: the manager's host name (what loopback means)."""
        return cls(CostModel(), MemoryState(run.memory) if run.memory is not None else None,
                   Topology(run.bundles_per_slot, racks=run.racks, here=here), ShardHealth())


# --- events -------------------------------------------------------------------------------
@dataclass(frozen=True)
class Tick:
    """The loop turned at ``now``, with this many workers and cores connected."""

    now: float
    workers: int
    cores: int


@dataclass(frozen=True)
class PoolSample:
    """A look at the pool (about once a second): each call's TaskVine state, calls TaskVine
    put back in its queue by itself, named workers that left, addresses that disconnected;
    each worker's library (by address) and the address of each call a worker took."""

    now: float
    workers: int
    cores: int
    states: Mapping[int, str]
    requeued: frozenset[int] = frozenset()
    gone: frozenset[str] = frozenset()
    lost_addr: frozenset[str] = frozenset()
    libraries: Mapping[str, LibraryState] = field(default_factory=dict)
    where: Mapping[int, str] = field(default_factory=dict)


@dataclass(frozen=True)
class CallDone:
    """A call came back: the library's status dict, or ``None`` and why (``failure``)."""

    call: int
    result: dict[str, Any] | None
    addrport: str | None
    now: float
    failure: str = ""


@dataclass(frozen=True)
class CallWithdrawn:
    """A call this state asked to withdraw was cancelled before any worker ran it."""

    call: int


Event = Tick | PoolSample | CallDone | CallWithdrawn


# --- instructions -------------------------------------------------------------------------
@dataclass(frozen=True)
class Submit:
    """Send a bundle as call ``call``: ``fetch``/``store`` map sandbox file names to temp
    numbers (a number not seen before is a new temp to declare)."""

    call: int
    spec: dict[str, Any]
    cap_mb: float | None
    preload: tuple[str, ...]
    limit_s: float | None
    target: Target
    fetch: dict[str, int]
    store: dict[str, int]

    @property
    def keys(self) -> list[Key]:
        return [key for key, _ in self.spec["nodes"]]

    @property
    def features(self) -> tuple[str, ...]:
        """TaskVine features that pin the call to its worker or rack (none: anywhere)."""
        return tuple(self.target.features())


@dataclass(frozen=True)
class Withdraw:
    """Cancel ``call`` if no worker took it yet, and answer :class:`CallWithdrawn`; a call
    already running is left to finish, unless ``running``: its worker's library never
    started, so nothing runs it."""

    call: int
    running: bool = False


@dataclass(frozen=True)
class DropTemp:
    """Temp ``temp`` is not needed any more: undeclare it (workers delete it)."""

    temp: int


@dataclass(frozen=True)
class Deliver:
    """Tasks finished: ``values`` are those that came back to the manager."""

    keys: list[Key]
    values: dict[Key, Any]


@dataclass(frozen=True)
class Network:
    """Change TaskVine for the network (:mod:`datavine.scheduler.network`): block hosts,
    unblock others, turn peer transfers off."""

    block: tuple[str, ...] = ()
    unblock: tuple[str, ...] = ()
    peers_off: bool = False


@dataclass(frozen=True)
class Fail:
    """The run cannot succeed: raise ``error``."""

    error: BaseException


Instruction = Submit | Withdraw | DropTemp | Deliver | Network | Fail


class _Failed(Exception):
    def __init__(self, error: BaseException) -> None:
        self.error = error


@dataclass
class Inflight:
    bundle: Bundle
    target: Target
    category: str
    cap_mb: float | None
    plan: Plan
    dispatched: bool = False  # seen running at a pool sample


@dataclass(frozen=True)
class _Again:
    """What to do with a call once withdrawn: retry it (counting an attempt) or requeue it."""

    reason: str = ""
    retry: bool = True
    anywhere: bool = False  # requeued (not retried) to run on any worker


@dataclass
class RunState:
    """The state of one ``get`` call; nothing of it outlives the call but ``learned``."""

    graph: graphs.TaskGraph
    cfg: RunConfig
    learned: Learned
    now: float
    port: int = 0
    files_of: Callable[[Key], tuple[str, ...]] | None = None  # default: found in the tasks
    summary: RunSummary = field(default_factory=RunSummary)

    def __post_init__(self) -> None:
        graph, cfg, learned = self.graph, self.cfg, self.learned
        self.start = self.last_worker = self.now
        if self.files_of is None:
            self.files_of = {k: task_files(n) for k, n in graph.nodes.items()}.__getitem__
        self.planner = Planner(graph, files=self.files_of, costs=learned.costs,
                               target_s=cfg.target_bundle_s, max_tasks=cfg.max_bundle_tasks)
        if cfg.racks is not None and learned.topology.racks is None:
            learned.topology.racks = cfg.racks  # for workers seen from now on
        self.dispatch = Dispatcher(self.planner, learned.topology, cfg.placement, cfg.shardmap,
                                   learned.shard_health, cfg.bundles_per_slot)
        self._temps = itertools.count(1)
        self._calls = itertools.count(1)
        self._out: list[Instruction] = []
        self.kept = Intermediates(self._temps.__next__,
                                  lambda temp: self._out.append(DropTemp(temp)))
        self.values: dict[Key, Any] = {}  # values at the manager: outputs, small ones
        self.consumers = {k: set(d) for k, d in graph.dependents.items()}
        self.inflight: dict[int, Inflight] = {}
        self.withdrawing: dict[int, _Again] = {}
        self.cap_override: dict[Key, float] = {}  # tasks retried after an overrun
        self.attempts: Counter[Key] = Counter()  # by task: a requeued task gets a new bundle
        self.timed_out: Counter[Key] = Counter()
        self.preload = tuple(dict.fromkeys((*cfg.preload, *graph.modules())))

    # --- the interface ----------------------------------------------------------------------
    @property
    def finished(self) -> bool:
        return self.planner.finished

    def results(self) -> dict[Key, Any]:
        return {k: self.values[k] for k in self.graph.outputs}

    def handle(self, *events: Event) -> list[Instruction]:
        """Apply ``events`` in order; the instructions they call for, in order. After a
        :class:`Fail` the state is not to be driven further (but :meth:`close`)."""
        try:
            for event in events:
                if isinstance(event, CallDone):
                    self.now = event.now
                    self._done(event)
                elif isinstance(event, Tick):
                    self.now = event.now
                    self._tick(event)
                elif isinstance(event, PoolSample):
                    self.now = event.now
                    self._sample(event)
                elif isinstance(event, CallWithdrawn):
                    self._withdrawn(event.call)
                else:
                    raise TypeError(f"not an event: {event!r}")
        except _Failed as failed:
            self._out.append(Fail(failed.error))
        return self._take()

    def close(self) -> list[Instruction]:
        """The run is over (finished, failed or interrupted) and its calls are gone: drop
        every temp still declared."""
        for call in list(self.inflight):
            self._forget(call)
        self.kept.clear()
        return self._take()

    def summarize(self, wall_s: float, workers: int, manager_out: int,
                  manager_in: int) -> RunSummary:
        summary = self.summary
        traffic = summary.traffic
        traffic.manager_out, traffic.manager_in = manager_out, manager_in
        traffic.kept, traffic.peer = self.kept.kept_bytes, self.kept.peer_bytes
        summary.wall_s = wall_s
        summary.workers = workers
        if self.learned.memory is not None:
            summary.memory = self.learned.memory.as_dict()
        off = placement_off_reason(self.cfg.placement, self.cfg.shardmap,
                                   [w.rack for w in self.learned.topology.workers.values()])
        if off and summary.placement:
            summary.notes.append(off)
        return summary

    def _take(self) -> list[Instruction]:
        out, self._out = self._out, []
        return out

    def _fail(self, error: BaseException) -> NoReturn:
        raise _Failed(error)

    # --- the loop turns: bounds, then submissions -------------------------------------------
    def _tick(self, tick: Tick) -> None:
        cfg = self.cfg
        if tick.workers > 0:
            self.last_worker = tick.now
        elif tick.now - self.last_worker > cfg.no_worker_timeout_s:
            self._fail(NoWorkersError(
                f"{self.planner.n_ready + len(self.inflight)} bundles waiting and no worker "
                f"connected to the manager on port {self.port} for "
                f"{cfg.no_worker_timeout_s:.0f} s (RunConfig.no_worker_timeout_s)"))
        if cfg.timeout_s and tick.now - self.start > cfg.timeout_s:
            self._fail(RunTimeoutError(
                f"run of {len(self.graph)} tasks did not finish within {cfg.timeout_s:.0f} s "
                f"(RunConfig.timeout_s); {len(self.planner.done)} tasks done"))
        for bundle, target, placement in self.dispatch.fill(tick.now, tick.cores,
                                                            len(self.inflight)):
            self._submit(bundle, target, placement)

    def _submit(self, bundle: Bundle, target: Target, placement: Placement) -> None:
        graph, cfg, memory = self.graph, self.cfg, self.learned.memory
        categories = {k: graph.category(k) for k in bundle.keys}
        category = (memory.dominant_category(categories.values()) if memory is not None
                    else categories[bundle.keys[0]])
        cap_mb = None
        if memory is not None:
            retried = [self.cap_override[k] for k in bundle.keys if k in self.cap_override]
            cap_mb = max(retried) if retried else memory.cap_for(category)
        limits = {k: limit for k, c in categories.items()
                  if (limit := cfg.time_limit(c)) is not None}
        keep = [k for k in bundle.outputs if k not in graph.outputs
                and self.kept.worth_keeping(graph.category(k), cfg.inline_max_bytes)
                ] if cfg.keep_on_workers and self.learned.network.keep_on_workers else []
        plan = self.kept.plan(keep, bundle.inputs)
        spec = {
            "nodes": [(k, graph.nodes[k]) for k in bundle.keys],
            "inputs": {k: self.values[k] for k in bundle.inputs if k not in plan.fetch},
            "input_files": plan.fetch,
            "outputs": sorted(bundle.outputs, key=graph.priority.__getitem__),
            "store": plan.store,
            "inline_max": cfg.inline_max_bytes,
            "categories": categories,
            "shardmap": cfg.shardmap,
            "limits": limits,
        }
        call = next(self._calls)
        self._out.append(Submit(
            call, spec, cap_mb, self.preload, sum(limits.values()) if limits else None, target,
            fetch={name: self.kept.held[key].file for key, name in plan.fetch.items()},
            store={name: plan.declared[key] for key, name in plan.store.items()}))
        self.inflight[call] = Inflight(bundle, target, category, cap_mb, plan)
        self.summary.bundles += 1
        if bundle.files:
            self.summary.placement[counted_tier(placement, target)] += 1

    # --- the pool ---------------------------------------------------------------------------
    def _sample(self, sample: PoolSample) -> None:
        """Record the pool's size; calls whose worker or library died under them, and calls
        pinned to a worker that left, run again at once anywhere; values kept on workers
        that left are made again."""
        self.summary.samples.append((round(sample.now - self.start, 3), sample.workers,
                                     sample.cores))
        topology = self.learned.topology
        self.summary.lost_workers.extend(sorted(
            set(sample.gone) | {topology.who_left(a) for a in sample.lost_addr}))
        if sample.lost_addr:
            self._recover(self.kept.lost_on(set(sample.lost_addr)))
        # TaskVine's log names the calls it put back with a new attempt; a call seen running
        # that is waiting again was put back without one (its library died: "forsaken").
        requeued = set(sample.requeued)
        for call, entry in self.inflight.items():
            state = sample.states.get(call, "")
            if state == TASK_READY and entry.dispatched:
                requeued.add(call)
            entry.dispatched = state != TASK_READY
        for call in sorted(requeued):
            entry = self.inflight.get(call)
            if entry is None:
                continue
            entry.dispatched = False
            if sample.states.get(call) == TASK_READY:
                # TaskVine would hold it back for its transient-error interval (~15 s):
                # withdraw it, and run it again at once where there is room.
                self._withdraw(call, _Again("its worker or library died under it"))
            else:  # TaskVine sent it to another worker already: count the retry
                self.summary.retries += 1
                self.summary.failures.append(
                    f"bundle {entry.bundle.id} ({len(entry.bundle.keys)} tasks): its worker or "
                    "library died under it; TaskVine sent it to another worker")
        for call, entry in list(self.inflight.items()):
            if entry.target.worker in sample.gone and sample.states.get(call) == TASK_READY:
                self._withdraw(call, _Again(f"worker {entry.target.worker} left"))
        self._watch_network(sample)

    def _withdraw(self, call: int, again: _Again, *, running: bool = False) -> None:
        if call not in self.withdrawing:
            self.withdrawing[call] = again
            self._out.append(Withdraw(call, running))

    def _watch_network(self, sample: PoolSample) -> None:
        """Workers whose library does not start are dropped, their calls sent elsewhere
        (not counted as attempts: the bundle did nothing wrong); TaskVine is told what to
        block and whether to stop peer transfers (:mod:`datavine.scheduler.network`)."""
        workers = self.learned.topology.workers.values()
        names = {w.addrport: w.id for w in workers if w.addrport}
        held = Counter(addr for call, addr in sample.where.items() if call in self.inflight)
        actions = self.learned.network.libraries(
            sample.libraries, sample.now, self.cfg.library_start_timeout_s, names,
            len(self.kept.held), self.start, held)
        for call, addr in sorted(sample.where.items()):
            if addr in actions.stalled and call in self.inflight:
                why = f"its worker {names.get(addr, addr)}'s library did not start"
                self._withdraw(call, _Again(why, retry=False, anywhere=True), running=True)
        self._out_of_placement(actions.stalled, sample.states)
        if actions.for_runtime:
            self._out.append(Network(actions.block, actions.unblock, actions.peers_off))
        self._say(actions.findings)

    def _out_of_placement(self, stalled: frozenset[str], states: Mapping[int, str]) -> None:
        """Dropped workers leave placement (TaskVine sends their blocked host nothing):
        calls waiting for one of them, or for a rack with no other worker, go anywhere."""
        topology, left = self.learned.topology, self.learned.network.out_of_placement
        for known in list(topology.workers.values()) if stalled else ():
            if known.addrport in stalled:
                left[known.addrport] = (known.id, known.rack)
                topology.forget(known.id)
        for addr in set(left) - set(self.learned.network.dropped):
            del left[addr]  # taken back: placement learns it again from TaskVine or results
        if not left:
            return
        ids = {wid for wid, _ in left.values()}
        racks = {w.rack for w in topology.workers.values()}
        empty = {rack for _, rack in left.values() if rack is not None and rack not in racks}
        for call, entry in list(self.inflight.items()):
            target = entry.target
            if states.get(call) == TASK_READY and (target.worker in ids or target.rack in empty):
                where = target.worker or f"rack {target.rack}"
                self._withdraw(call, _Again(f"{where} was dropped for the network",
                                            retry=False, anywhere=True))

    def _say(self, findings: Iterable[Finding]) -> None:
        self.summary.network.extend(f.as_dict() for f in findings)

    def _withdrawn(self, call: int) -> None:
        again = self.withdrawing.pop(call, None)
        entry = self._forget(call)
        if entry is None or again is None:
            return
        if again.retry:
            self._retry(entry.bundle, again.reason, anywhere=True)
        else:
            if again.anywhere:
                self.dispatch.anywhere.update(entry.bundle.keys)
            self.planner.requeue(entry.bundle)

    def _forget(self, call: int, *, succeeded: bool = False) -> Inflight | None:
        entry = self.inflight.pop(call, None)
        if entry is not None:
            self.learned.topology.returned(entry.target)
            if not succeeded:
                self.kept.failed(entry.plan)  # its outputs will never be there
        return entry

    # --- results ----------------------------------------------------------------------------
    def _done(self, done: CallDone) -> None:
        result = done.result
        self.withdrawing.pop(done.call, None)
        ok = bool(result and result.get("status") == remote.STATUS_OK)
        entry = self._forget(done.call, succeeded=ok)
        if entry is None:
            return  # a call withdrawn earlier
        if result is None:  # the library or its worker died under the call
            self._retry(entry.bundle, done.failure, anywhere=True)
            return
        where = f"{result.get('worker') or done.addrport} ({result.get('host', '?')})"
        status = result["status"]
        if status == remote.STATUS_OK:
            self._accept(entry, result, done.addrport)
        elif status == remote.STATUS_MEMORY:
            self._overrun(entry, result, where)
        elif status == remote.STATUS_INPUT:
            self._input_failed(entry, result, where)
        elif status == remote.STATUS_TIME:
            self._over_time(entry, result, where)
        elif status == remote.STATUS_LOST:  # not the bundle's fault: no attempt counted
            self.summary.failures.append(f"bundle {entry.bundle.id}: {result.get('message')}")
            self._recover(self.kept.lose([result.get("key")]))
            self.dispatch.anywhere.update(entry.bundle.keys)
            self.planner.requeue(entry.bundle)
        elif status == remote.STATUS_LOAD:
            self._fail(TaskLoadError(
                f"worker {where} could not load tasks {_shown(entry.bundle.keys)}: "
                f"{result.get('message')}. Install the module in the workers' environment, or "
                "send it by value: RunConfig(pickle_by_value=('module',)).\n"
                f"{result.get('traceback', '')}"))
        else:
            self._fail(_task_error(entry.bundle, result, where))

    def _accept(self, entry: Inflight, result: dict[str, Any], addrport: str | None) -> None:
        bundle, graph = entry.bundle, self.graph
        for key, blob in result["values"].items():
            self.values[key] = cloudpickle.loads(blob)
        sizes = {**{k: len(b) for k, b in result["values"].items()}, **result.get("stored", {})}
        for key, nbytes in sizes.items():
            self.kept.observe(graph.category(key), nbytes)
        self.kept.fetched(entry.plan, addrport)
        self.kept.made(entry.plan, result.get("stored", {}), result["values"], addrport)
        for key in bundle.keys:
            for dep in graph.dependencies[key]:
                users = self.consumers[dep]
                users.discard(key)
                if not users and dep not in graph.outputs:
                    self.values.pop(dep, None)
                    self.kept.consumed(dep)
        self.planner.complete(bundle)
        peak = float(result.get("peak_mb") or 0.0)
        worker = self._note_worker(result, addrport, bundle)
        if self.learned.memory is not None and entry.cap_mb:
            self.learned.memory.record_peak(entry.category, peak)
        summary = self.summary
        for category, (count, seconds) in result.get("timing", {}).items():
            self.learned.costs.observe(category, count, seconds)
            stats = summary.categories[category]
            stats.tasks += count
            stats.seconds += seconds
            stats.peak_mb = max(stats.peak_mb, peak)
            if entry.cap_mb:
                stats.cap_mb = entry.cap_mb
        t = round(self.now - self.start, 3)
        summary.completions.extend((t, k, worker) for k in bundle.keys)
        summary.worker_peak_mb[worker] = max(summary.worker_peak_mb.get(worker, 0.0), peak)
        summary.tasks += len(bundle.keys)
        summary.hosts[result.get("host", "?")] += len(bundle.keys)
        self._out.append(Deliver(list(bundle.keys), {k: self.values[k] for k in result["values"]
                                                     if k in self.values}))

    def _note_worker(self, result: dict[str, Any], addrport: str | None, bundle: Bundle) -> str:
        reads = result.get("reads", ())
        files = {r["lfn"] for r in reads} | {logical_name(f) for f in bundle.files}
        known = self.learned.topology.learn(result.get("worker"), result.get("rack"), addrport,
                                            files, host=result.get("host"))
        self.summary.add_reads(reads, result.get("rack"))
        if known is not None:
            self._say(self.learned.network.reads(known.id, str(result.get("host", "")),
                                                 reads, self.now, self.start))
        for r in reads:
            for server, _ in r.get("errors", ()):
                if server != "origin":
                    self.learned.shard_health.mark_failed(server, self.now)
        return known.id if known is not None else "?"

    def _overrun(self, entry: Inflight, result: dict[str, Any], where: str) -> None:
        memory = self.learned.memory
        peak = float(result.get("peak_mb") or 0.0)
        cap = float(entry.cap_mb or result.get("cap_mb") or 0.0)
        stats = self.summary.categories[entry.category]
        stats.overruns += 1
        stats.peak_mb = max(stats.peak_mb, peak)
        how = (f"were killed by SIGKILL under their {cap:.0f} MB cap (an out-of-memory killer)"
               if result.get("oom") else f"went over their {cap:.0f} MB cap")
        self.summary.failures.append(
            f"tasks {_shown(entry.bundle.keys)} {how} on {where} (peak {peak:.0f} MB)")
        assert memory is not None
        decision = memory.after_overrun(entry.category, cap, peak)
        if isinstance(decision, GiveUp):
            self._fail(MemoryCapError(entry.bundle.keys, entry.category, peak, cap,
                                      decision.reason))
        for key in entry.bundle.keys:  # a requeued task may come back in another bundle
            self.cap_override[key] = decision.cap_mb
        stats.cap_mb = decision.cap_mb
        self.summary.retries += 1
        self.planner.requeue(entry.bundle)

    def _input_failed(self, entry: Inflight, result: dict[str, Any], where: str) -> None:
        """A shard failed under a running read: cool it down and run the bundle again (its
        reads then fail over to the next shard)."""
        server = str(result.get("server"))
        self.learned.shard_health.mark_failed(server, self.now)
        error = f"{server}: {result.get('message', '?')}"
        self.summary.reads.failovers += 1
        self.summary.reads.failover_errors.append(
            f"tasks {_shown(entry.bundle.keys)} on {where}: {error}")
        self._retry(entry.bundle, f"input server failed during a read ({error})")

    def _recover(self, lost: list[Key]) -> None:
        """Values kept on a worker that left are gone: run their producers again (and what
        those need whose values are gone too); calls waiting to fetch them are withdrawn
        and planned again once the values exist."""
        if not lost:
            return
        undone = self.planner.undo(lost, self._available)
        lost_set = set(lost)
        for call, entry in list(self.inflight.items()):
            if lost_set & entry.plan.fetch.keys():
                self._withdraw(call, _Again(retry=False))  # ready again once its inputs are
        self.summary.recomputed += len(undone)
        self.summary.failures.append(
            f"{len(lost)} values kept on lost workers: {len(undone)} tasks run again "
            f"({_shown(sorted(undone, key=self.graph.priority.__getitem__))})")

    def _available(self, key: Key) -> bool:
        return key in self.values or key in self.kept.held

    def _over_time(self, entry: Inflight, result: dict[str, Any], where: str) -> None:
        """A task ran past its time limit and was stopped: once more elsewhere (a stalled
        read may not stall twice), then the run fails naming it."""
        key = result.get("key")
        keys = [key] if key in entry.bundle.keys else entry.bundle.keys
        self.timed_out.update(keys)
        limit = float(result.get("limit_s") or 0.0)
        self.summary.timeouts += 1
        self.summary.failures.append(f"tasks {_shown(keys)} on {where}: {result.get('message')}")
        worst = max(keys, key=self.timed_out.__getitem__)
        if self.timed_out[worst] > 1:
            self._fail(TaskTimeLimitError(worst, self.graph.category(worst), limit,
                                          self.timed_out[worst], where))
        self.summary.retries += 1
        self.dispatch.anywhere.update(entry.bundle.keys)
        self.planner.requeue(entry.bundle)

    def _retry(self, bundle: Bundle, reason: str, *, anywhere: bool = False) -> None:
        if anywhere:
            self.dispatch.anywhere.update(bundle.keys)
        self.attempts.update(bundle.keys)
        bundle.attempts = max(self.attempts[k] for k in bundle.keys)
        self.summary.failures.append(f"bundle {bundle.id} ({len(bundle.keys)} tasks): {reason}")
        if bundle.attempts > self.cfg.max_retries:
            self._fail(BundleFailedError(bundle.keys, bundle.attempts, reason))
        self.summary.retries += 1
        self.planner.requeue(bundle)


def _task_error(bundle: Bundle, result: dict[str, Any], where: str) -> BaseException:
    """The error a failed task raised (unpickled, with a note naming the task and the remote
    traceback), or a :class:`RemoteTaskError` when it cannot be rebuilt here."""
    key = result.get("key")
    tb = result.get("traceback", "")
    if key is None:  # the bundle's process died (a signal): name its tasks
        key = bundle.keys[0] if len(bundle.keys) == 1 else _shown(bundle.keys)
    blob = result.get("exception")
    if blob is not None:
        try:
            exc = cloudpickle.loads(blob)
        except Exception:
            exc = None
        if isinstance(exc, BaseException):
            exc.add_note(f"datavine: task {key!r} failed on {where}; remote traceback:\n{tb}")
            return exc
    return RemoteTaskError(key, result.get("message", "?"), tb, where)


def _shown(keys: list[Key]) -> str:
    return ", ".join(repr(k) for k in keys[:3]) + (f" ... ({len(keys)} in all)"
                                                   if len(keys) > 3 else "")
