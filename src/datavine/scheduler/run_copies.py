"""Backup copies of bundles, as part of the run's state machine: which calls out get a copy,
sending it, and the first result winning (:class:`BackupCopies`, a part of
:class:`datavine.scheduler.run_state.RunState`).

The decisions are :mod:`datavine.scheduler.speculation`'s (pure); this module keeps the
copies out (``backups``, ``copy_of``, ``copied_from``) and each worker's lane of calls
(``lanes``), and turns a copy's result or its first copy's end into instructions. A call
gets one copy at most; the first result wins, the other is cancelled (``Withdraw``,
``running=True``: patch 0015 stops it where it waits or runs), and the bundle is done once.
The lanes and the calls' expected times also tell placement how long a worker stays busy
(``_backlog_s``: a held bundle weighs its holder's against a free worker's).
"""

from __future__ import annotations

from collections.abc import Hashable, Mapping
from dataclasses import replace

from datavine.protocol import BundleResult
from datavine.scheduler.bundling import Bundle, Planner
from datavine.scheduler.inflight import Inflight
from datavine.scheduler.intermediates import Plan
from datavine.scheduler.run_messages import CallDone, Instruction, Withdraw
from datavine.scheduler.run_parts import RunParts
from datavine.scheduler.speculation import (
    Lanes,
    OutCall,
    choose,
    late,
    outrun_s,
    worth_copying,
)
from datavine.scheduler.topology import Target

Key = Hashable
# backup copies are looked for at most this often: each look walks the calls out (up to 2 a
# core), ~13% of the manager's CPU at 256 workers when it ran at every loop turn of a tail
SPECULATE_EVERY_S = 0.05
# ... and at most every this long per call out: a look costs ~2 us a call (~0.5 ms at 256
# workers), so many calls out are looked at less often (every 0.26 s at 256), each look's
# share of a core stays ~0.2%, and a straggler (seconds late) is still found in time
SPECULATE_PER_CALL_S = 0.001


def speculate_every(calls_out: int) -> float:
    """Seconds between two looks for backup copies with ``calls_out`` calls out (pure)."""
    return max(SPECULATE_EVERY_S, SPECULATE_PER_CALL_S * calls_out)


class BackupCopies(RunParts):
    """The backup-copy part of the run's state (see the module docstring); the rest of
    the state is :class:`~datavine.scheduler.run_state.RunState`'s."""

    planner: Planner
    copy_of: dict[int, int]  # call -> its copy
    _unmeasured: dict[int, int]  # bundle -> its calls stopped while they ran, not bounded yet
    lanes: Lanes
    _out: list[Instruction]

    # RunState's, used here
    def _send(self, bundle: Bundle, plan: Plan, target: Target, cap_mb: float | None,
              categories: Mapping[Key, str], avoid: tuple[str, ...] = ()) -> int:
        raise NotImplementedError

    def _forget(self, call: int, *, succeeded: bool = False,
                why: str = "its first copy ended",
                result: BundleResult | None = None) -> Inflight | None:
        raise NotImplementedError

    def _accept(self, entry: Inflight, result: BundleResult, addrport: str | None,
                where: str, how: str = "") -> None:
        raise NotImplementedError

    def _cores_of(self, worker: str) -> int:
        known = self.learned.topology.workers.get(worker)
        return max(1, known.cores) if known is not None else 1

    def _speculate(self, now: float, free: int) -> None:
        """Nothing more to send and ``free`` cores idle: copy calls that wait behind another
        in a busy worker's library, run far past their expected time, or run on a worker so
        slow that an idle one would end them sooner, onto idle workers."""
        out, pace = [], self.learned.worker_pace
        slow = set(self.learned.shard_health.slow(now))
        for call, entry in self.inflight.items():
            worker = self.lanes.on.get(call)
            if worker is None or entry.again is not None or call in self.copy_of:
                continue
            queued = self.lanes.queued(call)
            through_slow = entry.shard in slow  # sent before its shard was found slow
            if queued and not through_slow and not self._behind_late(worker, now) and (
                    not self.cfg.speculation_waiting or self._held_on(entry.bundle, worker)):
                continue  # (held: its worker holds its columns, it runs there soon)
            out.append(OutCall(call, worker, queued, self.lanes.began.get(call),
                               self._expected(entry.bundle), self._files_rack(entry.bundle),
                               pace.of(worker), through_slow))
        after, slack = self.cfg.speculation_after, self.cfg.speculation_slack_s
        fastest = pace.fastest()
        if not any(worth_copying(c, now, fastest, late_factor=after, late_slack_s=slack)
                   for c in out):
            return  # (the idle workers, a walk over every worker, are not needed)
        racks = {w.id: w.rack for w in self.learned.topology.workers.values()}
        for chosen, worker in choose(out, self.lanes.idle(racks, pace.of), now,
                                     late_factor=after, late_slack_s=slack)[:free]:
            self._copy(chosen, worker)

    def _behind_late(self, worker: str, now: float) -> bool:
        """Whether a call running on ``worker`` is late: the calls waiting behind it there
        wait for a straggler, and are copied even without ``speculation_waiting``."""
        for call in self.lanes.lane.get(worker, ())[:self._cores_of(worker)]:
            entry = self.inflight.get(call) or self.backups.get(call)
            if entry is not None and late(
                    OutCall(call, worker, False, self.lanes.began.get(call),
                            self._expected(entry.bundle)),
                    now, self.cfg.speculation_after, self.cfg.speculation_slack_s):
                return True
        return False

    def _held_on(self, bundle: Bundle, worker: str) -> bool:
        """Whether ``worker``'s column cache holds a piece its bundle reads: a copy
        elsewhere would decode what that worker serves from memory."""
        known = self.learned.topology.workers.get(worker)
        if known is None or not bundle.files:
            return False
        return any(piece in known.files_read for key in bundle.keys
                   for piece in self.dispatch.pieces_of(key))

    def _backlog_s(self, worker: str) -> float | None:
        """How long ``worker`` is expected to stay busy with the calls out to it: each
        one's expected time (:meth:`_call_expected`), less what a running one has run; None
        when one's cost is not known."""
        total, lanes = 0.0, self.lanes
        for call in lanes.lane.get(worker, ()):
            entry = self.inflight.get(call) or self.backups.get(call)
            expected = self._call_expected(entry) if entry is not None else None
            if expected is None:
                return None
            began = lanes.began.get(call)
            total += expected if began is None else max(0.0, expected - (self.now - began))
        return total

    def _call_expected(self, entry: Inflight) -> float | None:
        """A call's expected time: its reading tasks at a cold read's time for each piece
        its worker did not hold when it was sent, a hit's for the others (once the two are
        learned, :class:`~datavine.scheduler.hit_saving.HitSaving`), its other tasks at
        their category's mean; None when a cost is not known. (The mean alone puts a call
        that starts with a cold read at a third of its time: its worker looked free while
        it decoded.)"""
        bundle, graph = entry.bundle, self.graph
        reader = graph.category(self.planner.reader(bundle)) if bundle.files else None
        costs = self.learned.hit_saving.costs(reader) if reader is not None else None
        if costs is None:
            return self._expected(bundle)
        total, reads = 0.0, 0
        for key in bundle.keys:
            category = graph.category(key)
            if category == reader:
                reads += 1
            elif (estimate := self.learned.costs.estimate(category)) is not None:
                total += estimate
            else:
                return None
        cold = min(reads, len(set(self.dispatch.bundle_pieces(bundle)).intersection(
            entry.expected)))
        return total + cold * costs.cold_s + (reads - cold) * costs.hit_s

    def _expected(self, bundle: Bundle) -> float | None:
        """The bundle's expected run time from its tasks' measured costs (None: unknown)."""
        total = 0.0
        for key in bundle.keys:
            estimate = self.learned.costs.estimate(self.graph.category(key))
            if estimate is None:
                return None
            total += estimate
        return total

    def _files_rack(self, bundle: Bundle) -> str | None:
        """The rack of the shard its first file is read from now (None: no files or no
        shard map)."""
        if not bundle.files or self.cfg.shardmap is None:
            return None
        return self.dispatch.rack_now(bundle.files[0], self.now)

    def _copy(self, chosen: OutCall, worker: str) -> None:
        """Send a copy of ``chosen``'s bundle to ``worker``, reading around the shards its
        first copy reads from."""
        entry = self.inflight[chosen.call]
        bundle, graph = entry.bundle, self.graph
        # a late copy reads around its first copy's shard, which may be the slow part; a
        # copy of a call that only waits behind another reads where the first would; a copy
        # of one sent through a shard found slow since reads around that one (_send adds
        # every slow shard), through the shard its files have now
        shards = ([self.dispatch.shard_now(f, self.now) for f in bundle.files]
                  if self.cfg.shardmap is not None and not chosen.queued
                  and not chosen.slow_shard else [])
        avoid = tuple(sorted({s.name for s in shards if s is not None and not s.is_origin}))
        plan = self.kept.plan(list(entry.plan.store), bundle.inputs)  # temps of its own
        topology = self.learned.topology
        target = topology.named(worker)
        call = self._send(bundle, plan, target, entry.cap_mb,
                          {k: graph.category(k) for k in bundle.keys}, avoid)
        self.backups[call] = Inflight(bundle, target, entry.category, entry.cap_mb, plan)
        self.copy_of[chosen.call], self.copied_from[call] = call, chosen.call
        topology.sent(target)
        self.lanes.place(call, worker, self.now)
        is_late = late(chosen, self.now, self.cfg.speculation_after,
                       self.cfg.speculation_slack_s)
        sooner = outrun_s(chosen, self.now, self.learned.worker_pace.of(worker))
        why = (f"it reads through shard {entry.shard}, found slow since it was sent"
               if chosen.slow_shard else
               "it waits behind another call of its worker" if chosen.queued else
               f"it has run {self.now - (chosen.began or self.now):.2f} s, "
               f"{self.cfg.speculation_after:g} x its expected {chosen.expected_s or 0:.2f} s "
               "and more" if is_late else
               f"its worker runs at {chosen.pace:.1f} x the expected time: a copy on "
               f"{worker} ends {sooner:.2f} s sooner")
        self.life.note(bundle.keys, self.now, f"bundle {bundle.id}: a backup copy (call {call}) "
                       f"sent to worker {worker}: its call {chosen.call} on "
                       f"{chosen.worker} {why}")
        backups = self.summary.backups
        backups.started += 1
        if chosen.slow_shard:
            backups.slow_shard += 1
        elif chosen.queued:
            backups.queued += 1
        elif is_late:
            backups.late += 1
        else:
            backups.outrun += 1

    def _forget_copy(self, copy: int, *, succeeded: bool = False) -> Inflight | None:
        """A backup copy is no longer out: its slot is free, and unless it ``succeeded``
        the temps it was to make will never be."""
        entry = self.backups.pop(copy, None)
        call = self.copied_from.pop(copy, None)
        if call is not None:
            self.copy_of.pop(call, None)
        if entry is not None:
            self.learned.topology.returned(entry.target)
            self.lanes.remove(copy, self.now)
            if not succeeded:
                self.kept.failed(entry.plan)
        return entry

    def _stopped_running(self, bundle: Bundle) -> None:
        """A call of ``bundle`` is stopped while it runs: what it read is reported by no
        result. Counted now; bounded by its winner's reads (:meth:`_unmeasured_reads`)."""
        self.summary.backups.unmeasured += 1
        self._unmeasured[bundle.id] = self._unmeasured.get(bundle.id, 0) + 1

    def _unmeasured_reads(self, bundle: Bundle, result: BundleResult) -> None:
        """``result`` wins for ``bundle``: each of its calls stopped while running read at
        most what it read (the same chunks)."""
        stopped = self._unmeasured.pop(bundle.id, 0)
        if stopped:
            read = sum(int(r.get("bytes", 0)) for r in result.reads
                       if r.get("server") != "memory")
            self.summary.backups.unmeasured_bytes += stopped * read

    def _cancel_copy(self, call: int, why: str) -> None:
        """``call`` ended: its backup copy, if any, is cancelled (stopped where it runs)."""
        copy = self.copy_of.get(call)
        if copy is None:
            return
        self._out.append(Withdraw(copy, running=True))  # before its temps are dropped
        running = copy in self.lanes.began
        entry = self._forget_copy(copy)
        self.summary.backups.cancelled += 1
        if entry is not None:
            if running:
                self._stopped_running(entry.bundle)
            self.life.note(entry.bundle.keys, self.now,
                           f"bundle {entry.bundle.id}: its backup copy (call {copy}) was "
                           f"cancelled: {why}")

    def _copy_done(self, done: CallDone) -> None:
        """A backup copy came back: the first result wins (its first copy is cancelled and
        the bundle is done once); a failed copy is dropped, its first copy goes on."""
        call = self.copied_from.get(done.call)
        result = done.result
        won = result is not None and result.ok and call in self.inflight
        entry = self._forget_copy(done.call, succeeded=won)
        if entry is None or call is None:
            return
        if not won:
            self.summary.backups.failed += 1
            why = (done.failure or "its worker died") if result is None else (
                result.message or str(result.status))
            self.life.note(entry.bundle.keys, self.now,
                           f"bundle {entry.bundle.id}: its backup copy (call {done.call}) "
                           f"failed ({why}); its call {call} goes on")
            return
        self._out.append(Withdraw(call, running=True))  # before its temps are dropped
        if call in self.lanes.began:
            self._stopped_running(entry.bundle)
        first = self._forget(call)  # its temps will never be made: the copy's are
        assert first is not None and result is not None
        self.summary.backups.won += 1
        where = f"{result.worker or done.addrport} ({result.host or '?'})"
        self._accept(replace(first, plan=entry.plan), result, done.addrport, where,
                     f"its backup copy (call {done.call}) came first; call {call} cancelled")
