"""The shards' pace, as part of the run's state machine (:class:`ShardWatch`, a part of
:class:`datavine.scheduler.run_state.RunState`).

Each finished call says how fast the XCache shards served it (its clocked reads, its run
time through one shard: :meth:`ShardWatch._note_pace`); every :data:`PACE_EVERY_S` the
judgement of :mod:`datavine.scheduler.shard_pace` looks at those and at the calls still
running (:meth:`ShardWatch._pace_shards`). A shard found slow is read around for a while
(``ShardHealth.read_around``): placement and the next calls' reads go to the next shard in
line (:meth:`ShardWatch._read_around`), the calls waiting in a worker's library to read
through it are sent again around it, and the summary says so.
"""

from __future__ import annotations

from datavine.io.shards import logical_name
from datavine.protocol import BundleResult
from datavine.scheduler.bundling import Bundle
from datavine.scheduler.inflight import Again
from datavine.scheduler.lifecycle import Reason
from datavine.scheduler.run_parts import RunParts
from datavine.scheduler.speculation import Lanes

PACE_EVERY_S = 0.25  # the shards' pace is judged at most this often (shard_pace.py)


class ShardWatch(RunParts):
    """The shard part of the run's state (see the module docstring); the rest of the state
    is :class:`~datavine.scheduler.run_state.RunState`'s."""

    start: float
    lanes: Lanes
    copy_of: dict[int, int]
    _paced_at: float

    def _one_shard(self, bundle: Bundle) -> str | None:
        """The one XCache shard a bundle's files are read through now (None: no shards,
        several, or the origin)."""
        if not bundle.files or self.cfg.shardmap is None:
            return None
        shards = {self.dispatch.shard_now(logical_name(f), self.now) for f in bundle.files}
        shard = shards.pop() if len(shards) == 1 else None
        return shard.name if shard is not None and not shard.is_origin else None

    def _read_around(self, avoid: tuple[str, ...]) -> tuple[str, ...]:
        """A call's shards to read around: its own (a backup copy's), and every shard the
        manager reads around now for being slow (:meth:`_pace_shards`; a failed one, the
        workers' reads find out by themselves and fail over)."""
        if self.cfg.shardmap is None:
            return avoid
        slow = self.learned.shard_health.slow(self.now)
        return tuple(sorted({*avoid, *slow})) if slow else avoid

    def _pace_shards(self, now: float) -> None:
        """Judge the shards' pace (:mod:`datavine.scheduler.shard_pace`): a shard whose
        bundles take ``factor`` x the others' is read around for a while; the summary says
        so. Placement (held bundles are decided again) and the next calls' reads go to the
        next shard in line."""
        self._paced_at = now
        pace, health = self.learned.shard_pace, self.learned.shard_health
        began, on = self.lanes.began, self.lanes.on
        running: list[tuple[str, str, float]] = []  # every call out through one shard
        stuck: list[tuple[str, str, float, str]] = []  # of those, the ones seen on a worker
        for call, e in self.inflight.items():
            if e.shard is None:
                continue
            running.append((e.category, e.shard, now - began.get(call, e.sent)))
            if call in began and call in on:
                stuck.append((e.category, e.shard, now - began[call], on[call]))
        for slow in pace.judge(running, skip=health.failed(now), stuck=stuck):
            health.read_around(slow.shard, now + pace.hold_s)
            pace.forget(slow.shard)
            resent = self._resend_waiting(slow.shard)
            self.summary.reads.slow_shards.append(
                f"at {now - self.start:.1f} s: {slow.describe()} for {pace.hold_s:.0f} s"
                + (f"; {resent} calls waiting to read through it sent again" if resent else ""))

    def _resend_waiting(self, shard: str) -> int:
        """The calls sent to read through ``shard`` (just found slow) that wait in their
        worker's library behind another are withdrawn, their tasks planned again: they go
        where the shard's files are read now, around it. A call the manager's view has
        waiting may have started (the view lags by a result): withdrawn, it is stopped, and
        what it read through the slow shard is read again around it. Calls running there get
        backup copies as cores idle (``backups.slow_shard``). Returns how many."""
        waiting = [call for call, entry in self.inflight.items()
                   if entry.shard == shard and entry.again is None
                   and call not in self.copy_of and self.lanes.queued(call)]
        for call in waiting:
            self._withdraw(call, Again(Reason.REQUEUED, f"it waited to read through shard "
                                                        f"{shard}, found slow", retry=False),
                           running=True)
        return len(waiting)

    def _note_pace(self, category: str, shard: str | None, result: BundleResult) -> None:
        """What a finished call says of the shards' pace: each clocked read of a shard its
        rate; a call that read through one shard only, its run time (what calls still
        running are compared with; and, where its reads were not clocked, its evidence)."""
        shardmap = self.cfg.shardmap
        if shardmap is None:
            return
        pace, clocked, names = self.learned.shard_pace, False, shardmap.names()
        for r in result.reads:
            seconds = r.get("read_s", 0.0)
            if seconds > 0 and r["server"] in names:
                pace.observe_read(r["server"], seconds, r["bytes"] - r.get("prefetched", 0))
                clocked = True
        if shard is None:
            return
        servers = {r["server"] for r in result.reads}
        if servers - {"memory"} == {shard}:  # the column cache's records are no shard's
            pace.observe_wall(category, shard, result.wall_s)
        if not clocked and servers == {shard}:
            pace.observe(category, shard, result.wall_s)
