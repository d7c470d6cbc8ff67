"""What a look at the pool changes, as part of the run's state machine (:class:`PoolWatch`,
a part of :class:`datavine.scheduler.run_state.RunState`).

Once a second the driver samples the pool (:class:`~datavine.scheduler.run_messages.PoolSample`):
its size, the workers that left or were lost, each call's TaskVine state and worker, and the
libraries' starts. From it: calls whose worker or library died under them run again at once
(withdrawn when TaskVine would hold them back), calls pinned to a worker that left are
withdrawn, copies on it cancelled, values kept on lost workers made again, each call joins
its worker's lane, and workers whose library does not start are dropped for the network
(:mod:`datavine.scheduler.network`).
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterable, Mapping

from datavine.scheduler.inflight import Again
from datavine.scheduler.lifecycle import Phase, Reason
from datavine.scheduler.network import Finding
from datavine.scheduler.run_messages import Instruction, Network, PoolSample
from datavine.scheduler.run_parts import Key, RunParts
from datavine.scheduler.speculation import Lanes

TASK_READY = "READY"  # TaskVine's state of a call submitted and not dispatched to a worker


class PoolWatch(RunParts):
    """The pool part of the run's state (see the module docstring); the rest of the state is
    :class:`~datavine.scheduler.run_state.RunState`'s."""

    start: float
    lanes: Lanes
    _out: list[Instruction]

    # FailedCalls', used here (the others it calls: RunParts)
    def _recover(self, lost: list[Key]) -> None:
        raise NotImplementedError

    def _sample(self, sample: PoolSample) -> None:
        """Record the pool's size; calls whose worker or library died under them, and calls
        pinned to a worker that left, run again at once anywhere; values kept on workers
        that left are made again. A tail look (not ``full``) only says where calls run."""
        topology = self.learned.topology
        if sample.full:
            self.summary.samples.append((round(sample.now - self.start, 3), sample.workers,
                                         sample.cores))
            self.summary.lost_workers.extend(sorted(
                set(sample.gone) | {topology.who_left(a) for a in sample.lost_addr}))
        if sample.lost_addr:
            self._recover(self.kept.lost_on(set(sample.lost_addr)))
        # TaskVine's log names the calls it put back; a call seen running that TaskVine says
        # is waiting again was put back too. A withdrawing call is left to its withdrawal or
        # its result. Calls the sample has no state of are where ``where`` says.
        requeued = {c for c in sample.requeued if c in self.inflight}
        for call, state in sample.states.items():
            entry = self.inflight.get(call)
            if entry is None:
                continue
            phase = self.life.phase(entry.bundle.id)
            if phase is Phase.RUNNING and state == TASK_READY:
                requeued.add(call)
            elif phase is Phase.SENT and state != TASK_READY:
                where = sample.where.get(call)
                self._move(entry.bundle, Phase.RUNNING, detail=f"on {where}" if where else "")
        for call in sorted(requeued):
            entry = self.inflight[call]
            if self.life.phase(entry.bundle.id) is Phase.WITHDRAWING:
                continue
            if self.life.phase(entry.bundle.id) is Phase.RUNNING:
                self._move(entry.bundle, Phase.SENT, reason=Reason.LOST_WORKER,
                           detail="TaskVine put it back: its worker or library died under it")
            if sample.states.get(call) == TASK_READY:
                # TaskVine would hold it back for its transient-error interval (~15 s):
                # withdraw it, and run it again at once where there is room.
                self._withdraw(call, Again(Reason.LOST_WORKER,
                                            "its worker or library died under it"))
            else:  # TaskVine sent it to another worker already: count the retry
                self.summary.retries += 1
                self.summary.failures.append(
                    f"bundle {entry.bundle.id} ({len(entry.bundle.keys)} tasks): its worker or "
                    "library died under it; TaskVine sent it to another worker")
        if sample.gone:
            for call, entry in list(self.inflight.items()):
                if entry.target.worker in sample.gone and sample.states.get(call) == TASK_READY:
                    self._withdraw(call, Again(Reason.LOST_WORKER,
                                                f"worker {entry.target.worker} left"))
            for copy, entry in list(self.backups.items()):
                if entry.target.worker in sample.gone:
                    self._cancel_copy(self.copied_from[copy],
                                      f"worker {entry.target.worker} left")
        placed = sample.where
        for call in placed if sample.moved is None else sample.moved & placed.keys():
            known = topology.at(placed[call])
            if known is not None and (call in self.inflight or call in self.backups):
                self.lanes.place(call, known.id, sample.now)
        if sample.full:
            self._watch_network(sample)

    def _watch_network(self, sample: PoolSample) -> None:
        """Workers whose library does not start are dropped, their calls sent elsewhere
        (not counted as attempts: the bundle did nothing wrong); TaskVine is told what to
        block and whether to stop peer transfers (:mod:`datavine.scheduler.network`)."""
        if self.learned.network.quiet(sample.libraries):
            return
        workers = self.learned.topology.workers.values()
        names = {w.addrport: w.id for w in workers if w.addrport}
        held = Counter(addr for call, addr in sample.where.items() if call in self.inflight)
        actions = self.learned.network.libraries(
            sample.libraries, sample.now, self.cfg.library_start_timeout_s, names,
            len(self.kept.held), self.start, held)
        for call, addr in sorted(sample.where.items()) if actions.stalled else ():
            if addr in actions.stalled and call in self.inflight:
                why = f"its worker {names.get(addr, addr)}'s library did not start"
                self._withdraw(call, Again(Reason.REQUEUED, why, retry=False, anywhere=True),
                               running=True)
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
                self._withdraw(call, Again(Reason.REQUEUED,
                                            f"{where} was dropped for the network",
                                            retry=False, anywhere=True))

    def _say(self, findings: Iterable[Finding]) -> None:
        self.summary.network.extend(f.as_dict() for f in findings)
