"""The decisions of one ``get`` call, as a state machine: events in, instructions out.

:class:`RunState` holds what one run knows (the planner's ready and done tasks, the calls in
flight, the values at the manager and those kept on workers, retry counts) and
:meth:`RunState.handle` turns events into instructions, as distributed's
``worker_state_machine`` does. It reads no clock (every event carries the time), does no I/O
and never sees TaskVine: calls are numbered here, temp files are numbered here, and the driver
(:mod:`datavine.manager.execution`) maps both onto TaskVine's objects through the runtime's port.

Its events (:class:`~datavine.scheduler.run_messages.Tick`, ``PoolSample``, ``CallDone``,
``CallWithdrawn``) and instructions (``Submit``, ``Withdraw``, ``DropTemp``, ``Deliver``,
``Network``, ``Fail``) are the records of :mod:`datavine.scheduler.run_messages`.

Each bundle moves through the phases of :mod:`datavine.scheduler.lifecycle` (held, sent,
running, withdrawing, then done, retried, failed over, withdrawn, failed or abandoned) in
one place, :meth:`RunState._move`, which checks the lifecycle's table and records the step:
:meth:`RunState.story` tells what happened to a task or bundle, a run's failure carries the
story of the bundle it failed on, and :meth:`RunState.validate` checks that the lifecycle,
the calls in flight, the dispatcher's held bundles and the planner agree.

The decisions are the pure modules': bundles from :mod:`datavine.scheduler.bundling`, placement from
:mod:`datavine.scheduler.dispatch`, backup copies from :mod:`datavine.scheduler.run_copies`
(deciding with :mod:`datavine.scheduler.speculation`), failed calls' retries from
:mod:`datavine.scheduler.run_failures`, what a look at the pool changes from
:mod:`datavine.scheduler.run_pool`, the shards' pace (slow shards read around) from
:mod:`datavine.scheduler.run_shards` (judged by :mod:`datavine.scheduler.shard_pace`), caps from
:mod:`datavine.scheduler.memory`, kept values from
:mod:`datavine.scheduler.intermediates`. What a manager learns across runs (costs, memory peaks,
workers and racks, shard health) is one
:class:`~datavine.scheduler.learned.Learned` handed in.
"""

from __future__ import annotations

import itertools
from collections import Counter
from collections.abc import Callable, Hashable, Mapping
from dataclasses import dataclass, field
from typing import Any, NoReturn

from datavine.config import RunConfig
from datavine.errors import (
    NoWorkersError,
    RunTimeoutError,
    TaskLoadError,
)
from datavine.io.shards import logical_name
from datavine.protocol import BundleResult, BundleSpec, Pickled, ProtocolError, Status, loaded
from datavine.scheduler import graph as graphs
from datavine.scheduler.bundling import Bundle, Planner
from datavine.scheduler.dispatch import Dispatcher
from datavine.scheduler.hit_saving import bytes_split
from datavine.scheduler.inflight import Again, Inflight
from datavine.scheduler.inputs import task_files
from datavine.scheduler.intermediates import Intermediates, Plan
from datavine.scheduler.learned import Learned
from datavine.scheduler.lifecycle import InvariantError, Lifecycle, Phase, Reason, Step, tell
from datavine.scheduler.longest_first import longest_first
from datavine.scheduler.once import FirstSeen
from datavine.scheduler.pieces import PiecesOf
from datavine.scheduler.placement import Placement, placement_off_reason
from datavine.scheduler.run_copies import BackupCopies, speculate_every
from datavine.scheduler.run_failures import FailedCalls, shown, task_error
from datavine.scheduler.run_messages import (
    CallDone,
    CallWithdrawn,
    Deliver,
    DropTemp,
    Event,
    Fail,
    Instruction,
    PoolSample,
    Submit,
    Tick,
    Withdraw,
)
from datavine.scheduler.run_pool import PoolWatch
from datavine.scheduler.run_shards import PACE_EVERY_S, ShardWatch
from datavine.scheduler.speculation import Lanes
from datavine.scheduler.summary import RunSummary
from datavine.scheduler.topology import Target, counted_tier

Key = Hashable
STORY_LINES = 20  # a failed run's error notes at most this many steps of its bundle's story


class _Failed(Exception):
    def __init__(self, error: BaseException) -> None:
        self.error = error


@dataclass
class RunState(BackupCopies, FailedCalls, PoolWatch, ShardWatch):
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
        self.pieces_of = PiecesOf(graph.nodes)  # each task's pieces, found once
        held_first = cfg.column_cache and cfg.placement is not None
        self.planner = Planner(graph, files=self.files_of, costs=learned.costs,
                               target_s=cfg.target_bundle_s, max_tasks=cfg.max_bundle_tasks,
                               priority=self._order() if cfg.longest_first else None,
                               holder=self._holder, light=self._light,
                               cached_on=self._cached_on if held_first else None,
                               pieces=self.pieces_of, task_costs=learned.hit_saving.costs)
        if learned.memory is not None:  # caps leave the column caches their room
            learned.memory.cache_share = cfg.column_cache_share if cfg.column_cache else 0.0
            learned.memory.cache_mb = cfg.column_cache_mb
        if cfg.racks is not None and learned.topology.racks is None:
            learned.topology.racks = cfg.racks  # for workers seen from now on
        self.dispatch = Dispatcher(self.planner, learned.topology, cfg.placement, cfg.shardmap,
                                   learned.shard_health, cfg.bundles_per_slot,
                                   pieces_of=self.pieces_of, hit_saving=learned.hit_saving,
                                   pieces_only=cfg.column_cache, backlog=self._backlog_s)
        self._temps = itertools.count(1)
        self._calls = itertools.count(1)
        self._out: list[Instruction] = []
        self.kept = Intermediates(self._temps.__next__,
                                  lambda temp: self._out.append(DropTemp(temp)),
                                  largest=self.learned.largest_output)
        self.values: dict[Key, Any] = {}  # values at the manager: outputs, small ones
        self.consumers = {k: set(d) for k, d in graph.dependents.items()}
        self.inflight: dict[int, Inflight] = {}
        self.life = Lifecycle(self.now)  # each bundle's phase and steps
        self.cap_override: dict[Key, float] = {}  # tasks retried after an overrun
        self.attempts: Counter[Key] = Counter()  # by task: a requeued task gets a new bundle
        self.timed_out: Counter[Key] = Counter()
        self.delivered: FirstSeen[Key] = FirstSeen()  # tasks delivered (once each)
        self.preload = tuple(dict.fromkeys((*cfg.preload, *graph.modules())))
        # backup copies (scheduler/speculation.py): each copy's record (its bundle's, another
        # call), and which call each copies; every call's place in its worker's lane
        self.backups: dict[int, Inflight] = {}
        self.copy_of: dict[int, int] = {}  # call -> its copy
        self._unmeasured: dict[int, int] = {}  # bundle -> calls stopped running (run_copies)
        self.copied_from: dict[int, int] = {}  # copy -> the call it copies
        self.lanes = Lanes(self._cores_of)
        self._speculated_at = float("-inf")
        self._paced_at = float("-inf")

    # --- the interface ----------------------------------------------------------------------
    @property
    def finished(self) -> bool:
        return self.planner.finished

    @property
    def wants_look(self) -> bool:
        """Whether a look at the pool (a :class:`PoolSample`) would let backup copies act
        now: nothing more waits to be sent, and some call out is not known to be on a
        worker (its target was a rack or anywhere; a copy always has its worker). The
        driver then looks more often than once a second, so a run's tail does not wait for
        its next sample. Counted, not searched: the driver asks at every loop turn."""
        return (self.cfg.speculation and bool(self.inflight) and not self.planner.n_ready
                and not len(self.dispatch.held)
                and len(self.inflight) + len(self.backups) > len(self.lanes.on))

    def results(self) -> dict[Key, Any]:
        return {k: loaded(self.values[k]) for k in self.graph.outputs}

    def _order(self) -> dict[Key, int]:
        """dask's order with the larger reads first (:mod:`.longest_first`)."""
        entries = self.pieces_of.entries
        sizes = {k: n for k in self.graph.nodes if (n := entries(k)) is not None}
        return longest_first(self.graph.priority, sizes)

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
        every temp still declared; bundles still out or held are abandoned."""
        for call, entry in list(self.inflight.items()):
            self._move(entry.bundle, Phase.ABANDONED, detail="the run ended with it out")
            self._forget(call)
        for call in list(self.backups):
            self._forget_copy(call)
        for bundle, _ in self.dispatch.held:
            if bundle.id not in self.life.bundles:  # held by a turn that did not finish
                self._move(bundle, Phase.HELD)
            self._move(bundle, Phase.ABANDONED, detail="the run ended before it was sent")
        self.dispatch.held.clear()
        self.kept.clear()
        return self._take()

    def story(self, what: Any) -> list[Step]:
        """What happened to a task (its key, or the key's ``repr``/``str``) or a bundle (its
        number) in this run, step by step (:mod:`datavine.scheduler.lifecycle`)."""
        return self.life.story(what)

    def validate(self) -> None:
        """Check that the lifecycle agrees with the rest of the state (InvariantError
        naming what does not): each call in flight belongs to a bundle that is sent,
        running or withdrawing, and each such bundle has its call; a bundle is withdrawing
        exactly when its call is to be withdrawn; the held bundles are the dispatcher's;
        no task is in two live bundles, or both done and in a live bundle; a task is done
        exactly when the last bundle it was in is done (and its value was not lost since);
        values at the manager and kept on workers are of done tasks; and the topology
        counts the calls in flight. For tests: it walks the whole state."""
        self.life.check(
            {call: (e.bundle.id, e.again is not None) for call, e in self.inflight.items()},
            [b.id for b, _ in self.dispatch.held], self.planner.done, self.graph.nodes)
        errors = []
        for key in [*self.values, *self.kept.held]:
            if key not in self.planner.done:
                errors.append(f"task {key!r} has a value but is not done")
        counted = sum(self.learned.topology.inflight.values())
        if counted != len(self.inflight) + len(self.backups):
            errors.append(f"the topology counts {counted} calls in flight, the run "
                          f"{len(self.inflight)} and {len(self.backups)} backup copies")
        for copy, call in self.copied_from.items():
            if self.copy_of.get(call) != copy or copy not in self.backups or (
                    call not in self.inflight):
                errors.append(f"backup copy {copy} of call {call} is not out with it")
        if errors:
            raise InvariantError("; ".join(errors))

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
        summary.lifecycle = self.life.to_dict()
        off = placement_off_reason(self.cfg.placement, self.cfg.shardmap,
                                   [w.rack for w in self.learned.topology.workers.values()])
        if off and summary.placement:
            summary.notes.append(off)
        return summary

    def _take(self) -> list[Instruction]:
        out, self._out = self._out, []
        return out

    def _fail(self, error: BaseException, bundle: Bundle | None = None,
              reason: Reason | None = None, detail: str = "") -> NoReturn:
        """The run cannot succeed: raise ``error``. When it fails on a bundle, the bundle
        moves to failed and the error gets a note with the story of its tasks."""
        if bundle is not None:
            self._move(bundle, Phase.FAILED, reason=reason, detail=detail or str(error))
            error.add_note(
                f"datavine: the story of bundle {bundle.id} (tasks {shown(bundle.keys)}; "
                "cluster.story(key) or datavine story RUN.json tells it again):\n"
                + tell(self.life.keys_story(bundle.keys), limit=STORY_LINES))
        raise _Failed(error)

    def _move(self, bundle: Bundle, to: Phase, *, call: int | None = None,
              reason: Reason | None = None, detail: str = "") -> None:
        """The one place a bundle changes phase: checked against the lifecycle's table
        (IllegalMove otherwise) and recorded in its story."""
        self.life.move(bundle.id, to, self.now, keys=bundle.keys, call=call, reason=reason,
                       detail=detail)

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
        for bundle in self.dispatch.newly_held:  # those held before are HELD already
            if bundle.id not in self.life.bundles:
                self._move(bundle, Phase.HELD, detail="waits for a slot near its files")
        shardmap = cfg.shardmap
        if (cfg.read_around_slow_shards and shardmap is not None and len(shardmap.shards) > 1
                and tick.now - self._paced_at >= PACE_EVERY_S):
            self._pace_shards(tick.now)
        if (cfg.speculation and self.inflight and not self.planner.n_ready
                and not len(self.dispatch.held)
                and tick.now - self._speculated_at
                >= speculate_every(len(self.inflight) + len(self.backups))):
            self._speculated_at = tick.now
            # cores running a call, or that may be (a call whose worker is not known yet)
            unplaced = len(self.inflight) + len(self.backups) - len(self.lanes.on)
            free = tick.cores - len(self.lanes.began) - unplaced
            if free > 0:
                self._speculate(tick.now, free)

    def _holder(self, key: Key) -> str | None:
        """The worker whose column cache holds every piece ``key`` reads: the planner
        bundles tasks held by the same worker together. (Until 2026-11-27, under memory caps
        only while that cache had evicted no piece in the run: grouped calls to a cache that
        holds less than the run reads lost hits, 0.70 to 0.61 in the scale test. Since the
        held chunks go first, hits stay at their most, and grouping there too took the scale
        test's time from 3.62 to 3.27 s: benchmarks/SCALETEST.md.)"""
        return self._cached_on(key)

    def _cached_on(self, key: Key) -> str | None:
        """The worker whose column cache holds (or, a call reading them sent there, will
        hold) every piece ``key`` reads: the planner takes such tasks before tasks whose
        pieces no cache holds (:meth:`datavine.scheduler.bundling.Planner._seed`)."""
        pieces = self.pieces_of(key)
        return self.learned.topology.holder(pieces) if pieces else None

    def _light(self, key: Key) -> bool:
        """Whether ``key``'s inputs all came back to the manager (values small enough to be
        sent inline): a merge of them needs little memory beside a file task's."""
        return all(dep in self.values for dep in self.graph.dependencies[key])

    def _submit(self, bundle: Bundle, target: Target, placement: Placement) -> None:
        graph, cfg, memory = self.graph, self.cfg, self.learned.memory
        categories = {k: graph.category(k) for k in bundle.keys}
        category = (memory.dominant_category(categories.values()) if memory is not None
                    else categories[self.planner.reader(bundle)])
        cap_mb = None
        if memory is not None:
            retried = [self.cap_override[k] for k in bundle.keys if k in self.cap_override]
            cap_mb = max(retried) if retried else memory.cap_for(category)
        keep = [k for k in bundle.outputs if k not in graph.outputs
                and self.kept.worth_keeping(graph.output_kind(k), cfg.inline_max_bytes)
                ] if cfg.keep_on_workers and self.learned.network.keep_on_workers else []
        plan = self.kept.plan(keep, bundle.inputs)
        call = self._send(bundle, plan, target, cap_mb, categories)
        self.inflight[call] = Inflight(bundle, target, category, cap_mb, plan, sent=self.now,
                                       shard=self._one_shard(bundle),
                                       expected=self._expect(bundle, target))
        if target.worker is not None:
            self.lanes.place(call, target.worker, self.now)
        self._move(bundle, Phase.SENT, call=call, detail=_sent_to(target, cap_mb, placement))
        self.summary.bundles += 1
        if bundle.files:
            self.summary.placement[counted_tier(placement, target)] += 1

    def _expect(self, bundle: Bundle, target: Target) -> tuple[str, ...]:
        """The pieces ``bundle`` reads count as held by its worker from now on, when its
        column cache keeps them (:meth:`~datavine.scheduler.topology.Topology.expect`)."""
        if target.worker is None or not bundle.files or not self.cfg.column_cache:
            return ()
        return self.learned.topology.expect(target.worker, self.dispatch.bundle_pieces(bundle))

    def _expected_back(self, entry: Inflight, result: BundleResult | None) -> None:
        """What ``entry``'s worker was expected to hold and its result does not confirm
        stops counting as held there (a call that failed, was withdrawn or lost to its
        backup copy confirms nothing)."""
        if entry.expected and entry.target.worker is not None:
            self.learned.topology.expected_back(
                entry.target.worker, entry.expected,
                result.reads if result is not None and result.ok else ())

    def _send(self, bundle: Bundle, plan: Plan, target: Target, cap_mb: float | None,
              categories: Mapping[Key, str], avoid: tuple[str, ...] = ()) -> int:
        """Submit one call of ``bundle`` (a first copy or a backup) to ``target``, with its
        tasks' time limits; returns the call."""
        limits = {k: limit for k, c in categories.items()
                  if (limit := self.cfg.time_limit(c)) is not None}
        spec = self._spec(bundle, plan, categories, limits, avoid, cap_mb)
        call = next(self._calls)
        self._out.append(Submit(
            call, spec, cap_mb, self.preload, sum(limits.values()) if limits else None, target,
            fetch={name: self.kept.held[key].file for key, name in plan.fetch.items()},
            store={name: plan.declared[key] for key, name in plan.store.items()}))
        return call

    def _spec(self, bundle: Bundle, plan: Plan, categories: Mapping[Key, str],
              limits: dict[Key, float], avoid: tuple[str, ...] = (),
              cap_mb: float | None = None) -> BundleSpec:
        graph = self.graph
        return BundleSpec(
            nodes=[(k, graph.nodes[k]) for k in bundle.keys],
            inputs={k: self.values[k] for k in bundle.inputs if k not in plan.fetch},
            input_files=plan.fetch,
            outputs=sorted(bundle.outputs, key=graph.priority.__getitem__),
            store=plan.store,
            inline_max=self.cfg.inline_max_bytes,
            categories=dict(categories),
            shardmap=self.cfg.shardmap,
            limits=limits,
            avoid=self._read_around(avoid),
            cache_mb=self.cfg.column_cache_budget_mb(cap_mb),  # io/column_cache.py
            cache_epoch=self.learned.topology.cache_epoch,
            cache_rss_mb=self.cfg.column_cache_rss_mb(cap_mb),
            input_cache_mb=self.cfg.input_cache_mb,  # io/disk_cache.py
            prefetch_mb=self.cfg.prefetch_budget_mb(cap_mb),  # worker/prefetch.py
        )

    def _withdraw(self, call: int, again: Again, *, running: bool = False) -> None:
        entry = self.inflight[call]
        if entry.again is None:
            entry.again = again
            self._move(entry.bundle, Phase.WITHDRAWING, reason=again.why, detail=again.reason)
            self._out.append(Withdraw(call, running))

    def _withdrawn(self, call: int) -> None:
        entry = self._forget(call)
        if entry is None:
            return
        again = entry.again or Again(Reason.REQUEUED, "withdrawn", retry=False)
        if again.retry:
            self._retry(entry.bundle, again.why, again.reason, to=Phase.WITHDRAWN,
                        anywhere=True)
        else:
            self._move(entry.bundle, Phase.WITHDRAWN, reason=again.why, detail=again.reason)
            if again.anywhere:
                self.dispatch.anywhere.update(entry.bundle.keys)
            self.planner.requeue(entry.bundle)

    def _forget(self, call: int, *, succeeded: bool = False,
                why: str = "its first copy ended",
                result: BundleResult | None = None) -> Inflight | None:
        """A call is no longer out: its slot is free, its backup copy (if any) cancelled,
        unless it ``succeeded`` the temps it was to make will never be, and the pieces its
        worker was expected to hold count as held only where ``result`` says so."""
        entry = self.inflight.pop(call, None)
        if entry is not None:
            self._cancel_copy(call, why)
            self.learned.topology.returned(entry.target)
            self.lanes.remove(call, self.now)
            if not succeeded:
                self.kept.failed(entry.plan)  # its outputs will never be there
            self._expected_back(entry, result)
        return entry

    # --- results ----------------------------------------------------------------------------
    def _done(self, done: CallDone) -> None:
        if done.call in self.copied_from:
            self._copy_done(done)
            return
        result = done.result
        ok = result is not None and result.ok
        entry = self._forget(done.call, succeeded=ok, why="its first copy came back first"
                             if ok else "its first copy failed: the bundle is retried as a whole",
                             result=result)
        if entry is None:
            return  # a call withdrawn earlier
        if done.unreadable is not None:
            self._fail(done.unreadable, entry.bundle, Reason.PROTOCOL)
        if result is None:  # the library or its worker died under the call
            self._retry(entry.bundle, Reason.LOST_WORKER,
                        done.failure or f"its worker {done.addrport} died under it",
                        anywhere=True)
            return
        where = f"{result.worker or done.addrport} ({result.host or '?'})"
        status = result.status
        if status is Status.OK:
            self._accept(entry, result, done.addrport, where)
        elif status is Status.MEMORY:
            self._overrun(entry, result, where)
        elif status is Status.INPUT:
            self._input_failed(entry, result, where)
        elif status is Status.TIME:
            self._over_time(entry, result, where)
        elif status is Status.LOST:  # not the bundle's fault: no attempt counted
            self.summary.failures.append(f"bundle {entry.bundle.id}: {result.message}")
            self._move(entry.bundle, Phase.RETRIED, reason=Reason.INPUT_LOST,
                       detail=f"on {where}: {result.message}")
            self._recover(self.kept.lose([result.key]))
            self.dispatch.anywhere.update(entry.bundle.keys)
            self.planner.requeue(entry.bundle)
        elif status is Status.LOAD:
            self._fail(TaskLoadError(
                f"worker {where} could not load tasks {shown(entry.bundle.keys)}: "
                f"{result.message}. Install the module in the workers' environment, or "
                "send it by value: RunConfig(pickle_by_value=('module',)).\n"
                f"{result.traceback}"), entry.bundle, Reason.LOAD, result.message)
        elif status is Status.PROTOCOL:
            self._fail(ProtocolError(
                f"worker {where} could not read bundle {entry.bundle.id} (tasks "
                f"{shown(entry.bundle.keys)}): {result.message}"), entry.bundle,
                Reason.PROTOCOL, result.message)
        else:
            self._fail(task_error(entry.bundle, result, where), entry.bundle,
                       Reason.TASK_ERROR, f"on {where}: {result.message}")

    def _accept(self, entry: Inflight, result: BundleResult, addrport: str | None,
                where: str, how: str = "") -> None:
        bundle, graph = entry.bundle, self.graph
        self._unmeasured_reads(bundle, result)
        for key, blob in result.values.items():
            self.values[key] = Pickled(blob)  # unpickled only where it is wanted
        sizes = {**{k: len(b) for k, b in result.values.items()}, **result.stored}
        for key, nbytes in sizes.items():
            self.kept.observe(graph.output_kind(key), nbytes)
        self.kept.fetched(entry.plan, addrport)
        self.kept.made(entry.plan, result.stored, result.values, addrport)
        for key in bundle.keys:
            for dep in graph.dependencies[key]:
                users = self.consumers[dep]
                users.discard(key)
                if not users and dep not in graph.outputs:
                    self.values.pop(dep, None)
                    self.kept.consumed(dep)
        self.planner.complete(bundle)
        self._move(bundle, Phase.DONE, detail=(
            f"on {where} in {result.wall_s:.3f} s, peak {result.peak_mb:.0f} MB; "
            f"{len(result.values)} values back, {len(result.stored)} kept there"
            + (f"; {how}" if how else "")))
        peak = result.peak_mb
        worker = self._note_worker(result, addrport, bundle)
        self.learned.worker_pace.observe(worker, result.wall_s, self._expected(bundle))
        self._note_pace(entry.category, entry.shard, result)
        if self.learned.memory is not None and entry.cap_mb:
            self.learned.memory.record_peak(entry.category, peak, min(result.cache_mb, peak))
        summary = self.summary
        fresh = self.delivered.first(bundle.keys)  # a task made again counts once
        fresh_in = Counter(graph.category(k) for k in fresh)
        if bundle.files and (reader := graph.category(self.planner.reader(bundle))) in (
                result.timing):
            self.learned.hit_saving.observe(reader, *result.timing[reader],
                                            *bytes_split(result.reads))
        for category, (count, seconds) in result.timing.items():
            self.learned.costs.observe(category, count, seconds)
            stats = summary.categories[category]
            stats.tasks += fresh_in[category]
            stats.seconds += seconds
            stats.peak_mb = max(stats.peak_mb, peak)
            if entry.cap_mb:
                stats.cap_mb = entry.cap_mb
        t = round(self.now - self.start, 3)
        summary.completions.extend((t, k, worker) for k in bundle.keys)
        summary.worker_peak_mb[worker] = max(summary.worker_peak_mb.get(worker, 0.0), peak)
        summary.tasks += len(fresh)
        summary.hosts[result.host or "?"] += len(bundle.keys)
        self._out.append(Deliver(list(bundle.keys), {k: self.values[k] for k in result.values
                                                     if k in self.values},
                                 again=frozenset(bundle.keys) - set(fresh)))

    def _note_worker(self, result: BundleResult, addrport: str | None, bundle: Bundle) -> str:
        reads = result.reads
        files = ({r["lfn"] for r in reads if not r.get("dropped")}
                 | {logical_name(f) for f in bundle.files})
        known = self.learned.topology.learn(result.worker, result.rack, addrport, files,
                                            host=result.host or None)
        self.summary.add_reads(reads, result.rack)
        if known is not None:
            self.learned.topology.held(known, reads)  # what its column cache dropped
            self._say(self.learned.network.reads(known.id, result.host, reads, self.now,
                                                 self.start))
        for r in reads:
            for server, _ in r.get("errors", ()):
                if server != "origin":
                    self.learned.shard_health.mark_failed(server, self.now)
        return known.id if known is not None else "?"


def _sent_to(target: Target, cap_mb: float | None, placement: Placement) -> str:
    """Where a bundle went, in words: worker, rack or anywhere, its cap, why there."""
    where = (f"to worker {target.worker}" if target.worker is not None else
             f"to rack {target.rack}" if target.rack is not None else "to any worker")
    cap = f", cap {cap_mb:.0f} MB" if cap_mb else ""
    why = f" ({placement.reason})" if placement.reason else ""
    return f"{where}{cap}{why}"
