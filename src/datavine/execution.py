"""One ``get`` call: the loop that feeds bundles to TaskVine and results back to the graph.

:class:`GraphRun` asks the planner (:mod:`datavine.bundling`) for bundles, places those that
read files (:mod:`datavine.placement`, delay scheduling against :mod:`datavine.topology`),
caps their memory (:mod:`datavine.memory`), submits them as function calls of the runtime's
library, and handles what comes back: values, user errors (raised naming the dask key, with
the remote traceback), memory overruns (retried under a larger cap), lost workers and
crashed libraries (retried), tasks a worker cannot load (raised). Every wait is bounded.
"""

from __future__ import annotations

import time
from collections import Counter
from collections.abc import Hashable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import cloudpickle

from datavine import graph as graphs
from datavine import remote
from datavine.bundling import Bundle, Planner
from datavine.config import RunConfig
from datavine.dispatch import Dispatcher
from datavine.errors import (
    BundleFailedError,
    MemoryCapError,
    NoWorkersError,
    RemoteTaskError,
    RunTimeoutError,
    TaskLoadError,
    TaskTimeLimitError,
)
from datavine.inputs import task_files
from datavine.intermediates import Intermediates, Plan
from datavine.memory import GiveUp
from datavine.placement import Placement, placement_off_reason
from datavine.progress import RunProgress
from datavine.shards import logical_name
from datavine.summary import RunSummary
from datavine.topology import ANYWHERE, Target

if TYPE_CHECKING:
    from datavine.runtime import Finished, Runtime

Key = Hashable
SALVAGE_S = 15.0  # at most this long fetching kept values after Ctrl-C
REFRESH_S = 1.0  # how often workers are sampled and the library's health is checked
TASK_READY = "READY"  # Task.state (a string): submitted, not dispatched to a worker yet


@dataclass
class Inflight:
    bundle: Bundle
    target: Target
    category: str
    cap_mb: float | None
    plan: Plan
    dispatched: bool = False  # seen running at a refresh


class GraphRun:
    """State of one ``get`` call; nothing of it outlives the call but what it learned."""

    def __init__(self, rt: Runtime, graph: graphs.TaskGraph, cfg: RunConfig) -> None:
        self.rt = rt
        self.graph = graph
        self.cfg = cfg
        self.files = {k: task_files(n) for k, n in graph.nodes.items()}
        self.planner = Planner(graph, files=self.files.__getitem__, costs=rt.costs,
                               target_s=cfg.target_bundle_s, max_tasks=cfg.max_bundle_tasks)
        self.values: dict[Key, Any] = {}  # values at the manager: outputs, small ones
        self.kept = Intermediates(rt.declare_temp, rt.undeclare)  # values left on workers
        self.consumers = {k: set(d) for k, d in graph.dependents.items()}
        self.inflight: dict[int, Inflight] = {}
        self.dispatch = Dispatcher(self.planner, rt.topology, cfg.placement, cfg.shardmap,
                                   rt.shard_health, cfg.bundles_per_slot)
        self.cap_override: dict[Key, float] = {}  # tasks retried after an overrun
        self.attempts: Counter[Key] = Counter()  # by task: a requeued task gets a new bundle
        self.timed_out: Counter[Key] = Counter()
        self.preload = tuple(dict.fromkeys((*cfg.preload, *graph.modules())))
        self.summary = RunSummary()
        self.progress = RunProgress(len(graph), enabled=cfg.progress)
        self.start = time.monotonic()
        self.bytes_at_start = rt.file_bytes()

    # --- the loop ------------------------------------------------------------------------
    def execute(self) -> dict[Key, Any]:
        library = self.rt.ensure_library()
        last_worker = last_refresh = self.start
        try:
            with self.progress:
                while not self.planner.finished:
                    now = time.monotonic()
                    if now - last_refresh >= REFRESH_S:
                        self._refresh(now)
                        last_refresh = now
                    self._submit(library, now)
                    done = self.rt.wait(int(self.cfg.wait_s))
                    if done is not None:
                        self._handle(done)
                    now = time.monotonic()
                    if self.rt.connected_workers() > 0:
                        last_worker = now
                    elif now - last_worker > self.cfg.no_worker_timeout_s:
                        raise NoWorkersError(
                            f"{self.planner.n_ready + len(self.inflight)} bundles waiting and no "
                            f"worker connected to the manager on port {self.rt.port} for "
                            f"{self.cfg.no_worker_timeout_s:.0f} s (RunConfig.no_worker_timeout_s)")
                    if self.cfg.timeout_s and now - self.start > self.cfg.timeout_s:
                        raise RunTimeoutError(
                            f"run of {len(self.graph)} tasks did not finish within "
                            f"{self.cfg.timeout_s:.0f} s (RunConfig.timeout_s); "
                            f"{len(self.planner.done)} tasks done")
        except KeyboardInterrupt:
            self._salvage()
            raise
        finally:
            self._cancel_inflight()
            self.kept.clear()
            traffic = self.summary.traffic
            (out_now, in_now), (out_then, in_then) = self.rt.file_bytes(), self.bytes_at_start
            traffic.manager_out, traffic.manager_in = out_now - out_then, in_now - in_then
            traffic.kept, traffic.peer = self.kept.kept_bytes, self.kept.peer_bytes
            self.summary.wall_s = time.monotonic() - self.start
            self.summary.workers = self.rt.connected_workers()
            if self.rt.memory is not None:
                self.summary.memory = self.rt.memory.as_dict()
            off = placement_off_reason(self.cfg.placement, self.cfg.shardmap,
                                       [w.rack for w in self.rt.topology.workers.values()])
            if off and self.summary.placement:
                self.summary.notes.append(off)
            self.rt.last_summary = self.summary
            if self.cfg.progress:
                self.progress.print_summary(self.summary)
        return {k: self.values[k] for k in self.graph.outputs}

    def _refresh(self, now: float) -> None:
        """Sample the pool, move the calls of workers that left to the others at once, and
        stop if the library keeps dying."""
        self.summary.samples.append((round(now - self.start, 3), self.rt.connected_workers(),
                                     self.rt.connected_cores()))
        gone, lost_addr = self.rt.drop_lost_workers()
        self.summary.lost_workers.extend(sorted(gone | lost_addr))
        if lost_addr:
            self._recover(self.kept.lost_on(lost_addr))
        # Calls whose worker or library died under them: TaskVine's log shows those it put
        # back with a new attempt; a call seen running that is waiting again was put back
        # without one (its library died: "forsaken").
        requeued = set(self.rt.requeues.read())
        for task_id, entry in self.inflight.items():
            state = self.rt.call_state(task_id)
            if state == TASK_READY and entry.dispatched:
                requeued.add(task_id)
            entry.dispatched = state != TASK_READY
        for task_id in requeued:
            entry = self.inflight.get(task_id)
            if entry is None:
                continue
            entry.dispatched = False
            if self.rt.call_state(task_id) == TASK_READY:
                # TaskVine would hold it back for its transient-error interval (~15 s):
                # cancel it, and run it again at once where there is room.
                self.rt.cancel(task_id)
                self._forget(task_id)
                self._retry(entry.bundle, "its worker or library died under it", anywhere=True)
            else:  # TaskVine sent it to another worker already: count the retry
                self.summary.retries += 1
                self.summary.failures.append(
                    f"bundle {entry.bundle.id} ({len(entry.bundle.keys)} tasks): its worker or "
                    f"library died under it; re-run on {self.rt.call_worker(task_id)}")
        for task_id, entry in list(self.inflight.items()):
            if entry.target.worker in gone and self.rt.call_state(task_id) == TASK_READY:
                self.rt.cancel(task_id)  # pinned to a worker that left
                self._forget(task_id)
                self._retry(entry.bundle, f"worker {entry.target.worker} left", anywhere=True)
        self.rt.check_library()

    # --- submitting ----------------------------------------------------------------------
    def _submit(self, library: str, now: float) -> None:
        """Send what the dispatcher picks for the free slots."""
        for bundle, target, placement in self.dispatch.fill(
                now, self.rt.connected_cores(), len(self.inflight)):
            self._submit_bundle(library, bundle, target, placement)

    def _submit_bundle(self, library: str, bundle: Bundle, target: Target,
                       placement: Placement) -> None:
        categories = {k: self.graph.category(k) for k in bundle.keys}
        memory = self.rt.memory
        category = (memory.dominant_category(categories.values()) if memory is not None
                    else categories[bundle.keys[0]])
        cap_mb = None
        if memory is not None:
            retried = [self.cap_override[k] for k in bundle.keys if k in self.cap_override]
            cap_mb = max(retried) if retried else memory.cap_for(category)
        limits = {k: limit for k, c in categories.items()
                  if (limit := self.cfg.time_limit(c)) is not None}
        keep = [k for k in bundle.outputs if k not in self.graph.outputs
                and self.kept.worth_keeping(self.graph.category(k), self.cfg.inline_max_bytes)
                ] if self.cfg.keep_on_workers else []
        plan = self.kept.plan(keep, bundle.inputs)
        spec = {
            "nodes": [(k, self.graph.nodes[k]) for k in bundle.keys],
            "inputs": {k: self.values[k] for k in bundle.inputs if k not in plan.fetch},
            "input_files": plan.fetch,
            "outputs": sorted(bundle.outputs, key=self.graph.priority.__getitem__),
            "store": plan.store,
            "inline_max": self.cfg.inline_max_bytes,
            "categories": categories,
            "shardmap": self.cfg.shardmap,
            "limits": limits,
        }
        task_id = self.rt.submit_bundle(
            self.rt.dumps(spec), cap_mb, self.preload, sum(limits.values()) if limits else None,
            target.features(),
            fetch={name: self.kept.held[key].file for key, name in plan.fetch.items()},
            store={name: plan.declared[key] for key, name in plan.store.items()})
        self.inflight[task_id] = Inflight(bundle, target, category, cap_mb, plan)
        self.summary.bundles += 1
        if bundle.files:
            self.summary.placement[placement.tier.name.lower() if target != ANYWHERE
                                   else "anywhere"] += 1

    # --- results -------------------------------------------------------------------------
    def _salvage(self) -> None:
        """Interrupted: hand the result hook the values still kept on workers (the coffea
        executor merges what finished), fetched before their temps are dropped."""
        hook = getattr(self.rt, "result_hook", None)
        if hook is None:
            return
        deadline = time.monotonic() + SALVAGE_S
        failed: set[str | None] = set()  # a worker that did not answer is not asked again
        for key, held in list(self.kept.held.items()):
            if held.worker in failed or time.monotonic() > deadline:
                continue
            data = self.rt.fetch(held.file)
            if data is None:
                failed.add(held.worker)
            else:
                hook([], {key: cloudpickle.loads(data)})

    def _forget(self, task_id: int, *, succeeded: bool = False) -> Inflight | None:
        entry = self.inflight.pop(task_id, None)
        if entry is not None:
            self.rt.topology.returned(entry.target)
            if not succeeded:
                self.kept.failed(entry.plan)  # its outputs will never be there
        return entry

    def _handle(self, done: Finished) -> None:
        result = done.result
        entry = self._forget(done.id, succeeded=bool(result and
                                                     result.get("status") == remote.STATUS_OK))
        if entry is None:
            return  # a call cancelled earlier
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
            raise TaskLoadError(
                f"worker {where} could not load tasks {_shown(entry.bundle.keys)}: "
                f"{result.get('message')}. Install the module in the workers' environment, or "
                "send it by value: RunConfig(pickle_by_value=('module',)).\n"
                f"{result.get('traceback', '')}")
        else:
            self._raise_task_error(entry.bundle, result, where)

    def _accept(self, entry: Inflight, result: dict[str, Any], addrport: str | None) -> None:
        bundle = entry.bundle
        for key, blob in result["values"].items():
            self.values[key] = cloudpickle.loads(blob)
        sizes = {**{k: len(b) for k, b in result["values"].items()}, **result.get("stored", {})}
        for key, nbytes in sizes.items():
            self.kept.observe(self.graph.category(key), nbytes)
        self.kept.fetched(entry.plan, addrport)
        self.kept.made(entry.plan, result.get("stored", {}), result["values"], addrport)
        for key in bundle.keys:
            for dep in self.graph.dependencies[key]:
                users = self.consumers[dep]
                users.discard(key)
                if not users and dep not in self.graph.outputs:
                    self.values.pop(dep, None)
                    self.kept.consumed(dep)
        self.planner.complete(bundle)
        peak = float(result.get("peak_mb") or 0.0)
        worker = self._note_worker(result, addrport, bundle)
        self._note_memory(entry, peak)
        for category, (count, seconds) in result.get("timing", {}).items():
            self.rt.costs.observe(category, count, seconds)
            stats = self.summary.categories[category]
            stats.tasks += count
            stats.seconds += seconds
            stats.peak_mb = max(stats.peak_mb, peak)
            if entry.cap_mb:
                stats.cap_mb = entry.cap_mb
        t = round(time.monotonic() - self.start, 3)
        self.summary.completions.extend((t, k, worker) for k in bundle.keys)
        self.summary.worker_peak_mb[worker] = max(self.summary.worker_peak_mb.get(worker, 0.0),
                                                  peak)
        self.summary.tasks += len(bundle.keys)
        self.summary.hosts[result.get("host", "?")] += len(bundle.keys)
        self.progress.advance(len(bundle.keys))
        hook = getattr(self.rt, "result_hook", None)  # e.g. the coffea executor's progress
        if hook is not None:
            hook(bundle.keys, {k: self.values[k] for k in result["values"] if k in self.values})

    def _note_worker(self, result: dict[str, Any], addrport: str | None, bundle: Bundle) -> str:
        reads = result.get("reads", ())
        files = {r["lfn"] for r in reads} | {logical_name(f) for f in bundle.files}
        known = self.rt.topology.learn(result.get("worker"), result.get("rack"), addrport,
                                       files)
        worker = known.id if known is not None else "?"
        self.summary.add_reads(reads, result.get("rack"))
        now = time.monotonic()
        for r in reads:
            for server, _ in r.get("errors", ()):
                if server != "origin":
                    self.rt.shard_health.mark_failed(server, now)
        return worker

    def _note_memory(self, entry: Inflight, peak_mb: float) -> None:
        if self.rt.memory is not None and entry.cap_mb:
            self.rt.memory.record_peak(entry.category, peak_mb)

    def _overrun(self, entry: Inflight, result: dict[str, Any], where: str) -> None:
        memory = self.rt.memory
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
            raise MemoryCapError(entry.bundle.keys, entry.category, peak, cap, decision.reason)
        for key in entry.bundle.keys:  # a requeued task may come back in another bundle
            self.cap_override[key] = decision.cap_mb
        stats.cap_mb = decision.cap_mb
        self.summary.retries += 1
        self.planner.requeue(entry.bundle)

    def _input_failed(self, entry: Inflight, result: dict[str, Any], where: str) -> None:
        """A shard failed under a running read: cool it down and run the bundle again (its
        reads then fail over to the next shard)."""
        server = str(result.get("server"))
        self.rt.shard_health.mark_failed(server, time.monotonic())
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
        for task_id, entry in list(self.inflight.items()):
            if lost_set & entry.plan.fetch.keys() and self.rt.call_state(task_id) == TASK_READY:
                self.rt.cancel(task_id)
                self._forget(task_id)
                self.planner.requeue(entry.bundle)  # ready again once its inputs are
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
            raise TaskTimeLimitError(worst, self.graph.category(worst), limit,
                                     self.timed_out[worst], where)
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
            raise BundleFailedError(bundle.keys, bundle.attempts, reason)
        self.summary.retries += 1
        self.planner.requeue(bundle)

    def _raise_task_error(self, bundle: Bundle, result: dict[str, Any], where: str) -> None:
        key = result.get("key")
        tb = result.get("traceback", "")
        if key is None:  # the bundle's process died (a signal): name its tasks
            key = bundle.keys[0] if len(bundle.keys) == 1 else _shown(bundle.keys)
        note = f"datavine: task {key!r} failed on {where}; remote traceback:\n{tb}"
        blob = result.get("exception")
        if blob is not None:
            try:
                exc = cloudpickle.loads(blob)
            except Exception:
                exc = None
            if isinstance(exc, BaseException):
                exc.add_note(note)
                raise exc
        raise RemoteTaskError(key, result.get("message", "?"), tb, where)

    def _cancel_inflight(self) -> None:
        """Withdraw what was not dispatched yet, and stop the calls still running (a run that
        failed or timed out abandons them): TaskVine cannot cancel a function call (that
        confused the worker's slot: the next call hung), so the library is restarted, which
        kills them, and the cluster's slots are free for the next run at once."""
        running = []
        for task_id in list(self.inflight):
            if self.rt.call_state(task_id) == TASK_READY:
                self.rt.cancel(task_id)
            else:
                running.append(task_id)
        if running:
            self.summary.abandoned = len(running)
            self.rt.restart_library(tuple(running))
        for task_id in list(self.inflight):
            self._forget(task_id)  # after the calls are gone: their temps are undeclared


def _shown(keys: list[Key]) -> str:
    return ", ".join(repr(k) for k in keys[:3]) + (f" ... ({len(keys)} in all)"
                                                   if len(keys) > 3 else "")
