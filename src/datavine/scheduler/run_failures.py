"""What a failed call costs, as part of the run's state machine (:class:`FailedCalls`, a
part of :class:`datavine.scheduler.run_state.RunState`).

A bundle that went over its memory cap runs again under the cap the memory policy gives
(:mod:`datavine.scheduler.memory`); one whose shard failed under a read runs again, its reads
failing over to the next shard; a task past its time limit runs once more, anywhere; values
kept on a worker that left are made again with what they need; any other failure is retried
up to ``RunConfig.max_retries``. Each ends in the bundle's phase
(:mod:`datavine.scheduler.lifecycle`) and a line in the run's summary; a failure that cannot
succeed again fails the run naming the task (:func:`task_error` rebuilds a task's own error).
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Hashable
from typing import NoReturn

import cloudpickle

from datavine.errors import BundleFailedError, MemoryCapError, RemoteTaskError, TaskTimeLimitError
from datavine.protocol import BundleResult
from datavine.scheduler.bundling import Bundle, Planner
from datavine.scheduler.inflight import Again, Inflight
from datavine.scheduler.lifecycle import Phase, Reason
from datavine.scheduler.memory import GiveUp
from datavine.scheduler.run_parts import RunParts

Key = Hashable


class FailedCalls(RunParts):
    """The failure-handling part of the run's state (see the module docstring); the rest of
    the state is :class:`~datavine.scheduler.run_state.RunState`'s."""

    planner: Planner
    values: dict[Key, object]
    cap_override: dict[Key, float]
    attempts: Counter[Key]
    timed_out: Counter[Key]

    # RunState's, used here (the others it calls: RunParts)
    def _fail(self, error: BaseException, bundle: Bundle | None = None,
              reason: Reason | None = None, detail: str = "") -> NoReturn:
        raise NotImplementedError

    def _overrun(self, entry: Inflight, result: BundleResult, where: str) -> None:
        memory = self.learned.memory
        peak = result.peak_mb
        cap = float(entry.cap_mb or result.cap_mb or 0.0)
        stats = self.summary.categories[entry.category]
        stats.overruns += 1
        stats.peak_mb = max(stats.peak_mb, peak)
        how = (f"were killed by SIGKILL under their {cap:.0f} MB cap (an out-of-memory killer)"
               if result.oom else f"went over their {cap:.0f} MB cap")
        failure = f"tasks {shown(entry.bundle.keys)} {how} on {where} (peak {peak:.0f} MB)"
        self.summary.failures.append(failure)
        assert memory is not None
        decision = memory.after_overrun(entry.category, cap, peak)
        if isinstance(decision, GiveUp):
            self._fail(MemoryCapError(entry.bundle.keys, entry.category, peak, cap,
                                      decision.reason), entry.bundle, Reason.MEMORY, failure)
        for key in entry.bundle.keys:  # a requeued task may come back in another bundle
            self.cap_override[key] = decision.cap_mb
        stats.cap_mb = decision.cap_mb
        self.summary.retries += 1
        self._move(entry.bundle, Phase.RETRIED, reason=Reason.MEMORY,
                   detail=f"{how} on {where} (peak {peak:.0f} MB): next under "
                          f"{decision.cap_mb:.0f} MB")
        self.planner.requeue(entry.bundle)

    def _input_failed(self, entry: Inflight, result: BundleResult, where: str) -> None:
        """A shard failed under a running read: cool it down and run the bundle again (its
        reads then fail over to the next shard)."""
        server = str(result.server)
        self.learned.shard_health.mark_failed(server, self.now)
        error = f"{server}: {result.message or '?'}"
        self.summary.reads.failovers += 1
        self.summary.reads.failover_errors.append(
            f"tasks {shown(entry.bundle.keys)} on {where}: {error}")
        self._retry(entry.bundle, Reason.INPUT,
                    f"input server failed during a read ({error}) on {where}",
                    to=Phase.FAILED_OVER)

    def _recover(self, lost: list[Key]) -> None:
        """Values kept on a worker that left are gone: run their producers again (and what
        those need whose values are gone too); calls waiting to fetch them are withdrawn
        and planned again once the values exist."""
        if not lost:
            return
        undone = self.planner.undo(lost, self._available)
        lost_set = set(lost)
        self.life.note(sorted(lost_set & undone, key=self.graph.priority.__getitem__),
                       self.now, "its value, kept on a worker, was lost with it: run again")
        self.life.note(sorted(undone - lost_set, key=self.graph.priority.__getitem__),
                       self.now, "run again: its value is needed to make a lost one again")
        for call, entry in list(self.inflight.items()):
            if lost_set & entry.plan.fetch.keys():  # ready again once its inputs are
                self._withdraw(call, Again(Reason.REQUEUED, "an input it fetches was lost "
                                            "with the worker that kept it", retry=False))
        for copy, entry in list(self.backups.items()):
            if lost_set & entry.plan.fetch.keys() and copy in self.copied_from:
                self._cancel_copy(self.copied_from[copy], "an input it fetches was lost")
        self.summary.recomputed += len(undone)
        self.summary.failures.append(
            f"{len(lost)} values kept on lost workers: {len(undone)} tasks run again "
            f"({shown(sorted(undone, key=self.graph.priority.__getitem__))})")

    def _available(self, key: Key) -> bool:
        return key in self.values or key in self.kept.held

    def _over_time(self, entry: Inflight, result: BundleResult, where: str) -> None:
        """A task ran past its time limit and was stopped: once more elsewhere (a stalled
        read may not stall twice), then the run fails naming it."""
        key = result.key
        keys = [key] if key in entry.bundle.keys else entry.bundle.keys
        self.timed_out.update(keys)
        limit = float(result.limit_s or 0.0)
        self.summary.timeouts += 1
        failure = f"tasks {shown(keys)} on {where}: {result.message}"
        self.summary.failures.append(failure)
        worst = max(keys, key=self.timed_out.__getitem__)
        if self.timed_out[worst] > 1:
            self._fail(TaskTimeLimitError(worst, self.graph.category(worst), limit,
                                          self.timed_out[worst], where), entry.bundle,
                       Reason.TIME_LIMIT, failure)
        self.summary.retries += 1
        self._move(entry.bundle, Phase.RETRIED, reason=Reason.TIME_LIMIT,
                   detail=f"{failure}; once more, anywhere")
        self.dispatch.anywhere.update(entry.bundle.keys)
        self.planner.requeue(entry.bundle)

    def _retry(self, bundle: Bundle, why: Reason, reason: str, *, to: Phase = Phase.RETRIED,
               anywhere: bool = False) -> None:
        """Its tasks back to the planner, an attempt counted (``to``: the phase the bundle
        ends in); the run fails once a task has had ``RunConfig.max_retries`` retries."""
        if anywhere:
            self.dispatch.anywhere.update(bundle.keys)
        self.attempts.update(bundle.keys)
        bundle.attempts = max(self.attempts[k] for k in bundle.keys)
        self.summary.failures.append(f"bundle {bundle.id} ({len(bundle.keys)} tasks): {reason}")
        if bundle.attempts > self.cfg.max_retries:
            self._fail(BundleFailedError(bundle.keys, bundle.attempts, reason), bundle, why,
                       reason)
        self.summary.retries += 1
        self._move(bundle, to, reason=why,
                   detail=f"{reason} (attempt {bundle.attempts} of {self.cfg.max_retries + 1})")
        self.planner.requeue(bundle)


def task_error(bundle: Bundle, result: BundleResult, where: str) -> BaseException:
    """The error a failed task raised (unpickled, with a note naming the task and the remote
    traceback), or a :class:`RemoteTaskError` when it cannot be rebuilt here."""
    key = result.key
    tb = result.traceback
    if key is None:  # the bundle's process died (a signal): name its tasks
        key = bundle.keys[0] if len(bundle.keys) == 1 else shown(bundle.keys)
    blob = result.exception
    if blob is not None:
        try:
            exc = cloudpickle.loads(blob)
        except Exception:
            exc = None
        if isinstance(exc, BaseException):
            exc.add_note(f"datavine: task {key!r} failed on {where}; remote traceback:\n{tb}")
            return exc
    return RemoteTaskError(key, result.message or "?", tb, where)


def shown(keys: list[Key]) -> str:
    return ", ".join(repr(k) for k in keys[:3]) + (f" ... ({len(keys)} in all)"
                                                   if len(keys) > 3 else "")
