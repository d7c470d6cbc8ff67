"""One ``get`` call: the driver that carries events from TaskVine to the run's state machine
and its instructions back.

:class:`GraphRun` owns no decision: :class:`datavine.scheduler.run_state.RunState` decides what to
submit, retry, withdraw, drop or raise. The driver reads the clock, samples the pool through
the runtime's port (:class:`datavine.manager.port.RunPort`: connected cores, calls' states, calls
TaskVine requeued, workers lost, the library's health), waits for calls (every wait bounded),
and maps the state's call and temp numbers onto TaskVine's tasks and files. It also does the
I/O the state cannot: progress on the terminal, the result hook (``on_results``: the coffea
executor's progress and partial merge), fetching kept values after Ctrl-C, and stopping the
calls of a run that failed.
"""

from __future__ import annotations

import contextlib
import gc
import sys
import time
from collections import deque
from collections.abc import Callable, Hashable, Iterable, Iterator, Mapping

from datavine.config import RunConfig
from datavine.dashboard.events import NO_SINK, NullSink
from datavine.manager.port import ResultHook, RunPort
from datavine.manager.progress import RunProgress
from datavine.protocol import loaded
from datavine.scheduler import graph as graphs
from datavine.scheduler.network import LibraryState
from datavine.scheduler.run_messages import (
    CallDone,
    CallWithdrawn,
    Deliver,
    DropTemp,
    Event,
    Fail,
    Instruction,
    Network,
    PoolSample,
    Submit,
    Tick,
    Withdraw,
)
from datavine.scheduler.run_pool import TASK_READY
from datavine.scheduler.run_state import RunState
from datavine.scheduler.summary import network_line
from datavine.worker import value_file
from datavine.worker.payload import BundleEncoder

Key = Hashable
SALVAGE_S = 15.0  # at most this long fetching kept values after Ctrl-C
REFRESH_S = 1.0  # how often the pool is sampled and the library's health is checked
TAIL_LOOK_S = 0.02  # ... and at a run's tail, a look at where the unplaced calls run


@contextlib.contextmanager
def frozen_heap() -> Iterator[None]:
    """Python's collector leaves alone what the process holds when a run starts (the graph,
    the run's state, the user's objects) until the run ends: a full collection walked all of
    it (~40 ms at 768 tasks, in one run of three: ~50 us per bundle of the manager's CPU,
    more with larger graphs), and a run makes few cycles of its own. Nothing when the
    process froze objects itself (its freeze is not ours to undo)."""
    if gc.get_freeze_count():
        yield
        return
    gc.freeze()
    try:
        yield
    finally:
        gc.unfreeze()  # back to the oldest generation: collected as before


class GraphRun:
    """Drive one ``get`` call's :class:`RunState` through a :class:`RunPort` (a runtime, or a
    fake of it); ``on_results(keys, values)`` after each delivery, and with the values kept on
    workers when the run is interrupted (None: no one listens, nothing is fetched)."""

    def __init__(self, rt: RunPort, graph: graphs.TaskGraph, cfg: RunConfig,
                 clock: Callable[[], float] = time.monotonic, sink: NullSink = NO_SINK,
                 on_results: ResultHook | None = None) -> None:
        self.rt = rt
        self.sink = sink  # the run's events, for the live view (datavine.dashboard.events)
        self.on_results = on_results
        self.clock = clock
        self.state = RunState(graph, cfg, rt.learned, now=clock(), port=rt.port)
        self.cfg = cfg
        self.tasks: dict[int, int] = {}  # the state's call -> TaskVine task id
        self.calls: dict[int, int] = {}  # TaskVine task id -> call
        self.temps: dict[int, object] = {}  # the state's temp -> TaskVine file
        self.unwithdrawn: set[int] = set()  # calls the state withdrew while they ran
        self.encoder = BundleEncoder()  # the run's functions pickled once (worker/payload.py)
        self.progress = RunProgress(len(graph), enabled=cfg.progress)
        self.bytes_at_start = rt.file_bytes()
        self.library = ""
        self.said = 0  # network findings printed so far
        # (workers, cores) connected, as last sampled: every turn's Tick reads it, and a
        # look at TaskVine's statistics walks every worker (~0.1 ms at 256), so the pool is
        # looked at with the rest of the sample (REFRESH_S), not once per result
        self.pool: tuple[int, int] = (0, 0)
        # where each call TaskVine sent to a worker runs (its address), as far as the looks
        # saw: a look asks TaskVine only about the other calls (those waiting in its queue,
        # and those its log says it put back), so its cost follows what changed, not the
        # calls out (256 at 256 workers, a look a second: most of the manager's own CPU)
        self.placed: dict[int, str] = {}
        self.libraries: Mapping[str, LibraryState] = {}  # as the last full look read them

    def execute(self) -> dict[Key, object]:
        self.library = self.rt.ensure_library()
        state = self.state
        assert state.files_of is not None  # RunState sets it when none is given
        self.sink.run_started(state.graph, state.files_of, self.cfg.shardmap)
        # the first turn samples the pool: workers that connected before the run are
        # known, with their hosts and racks, before its first bundles are placed
        last_sample = last_look = state.start - REFRESH_S
        try:
            with self.progress, frozen_heap():
                while not state.finished:
                    now = self.clock()
                    events: list[Event] = []
                    since, since_look = now - last_sample, now - last_look
                    if since >= REFRESH_S:
                        events.append(self._sample(now))
                        last_sample = last_look = now
                    elif since_look >= TAIL_LOOK_S and state.wants_look:
                        events.append(self._sample(now, full=False))
                        last_look = now
                    events.append(Tick(now, *self.pool))
                    self._apply(state.handle(*events))
                    if self.unwithdrawn:  # asked to withdraw while they ran: waiting again?
                        self._apply([Withdraw(call) for call in sorted(self.unwithdrawn)])
                    done = self.rt.wait(int(self.cfg.wait_s))
                    call = self.calls.pop(done.id, None) if done is not None else None
                    if done is not None and call is not None:
                        del self.tasks[call]
                        self.placed.pop(call, None)
                        answer = state.handle(CallDone.received(
                            call, done.result, done.addrport, self.clock(), done.failure))
                        again = frozenset().union(*(i.again for i in answer
                                                    if isinstance(i, Deliver)))
                        self.sink.done(call, done, again)  # before what the answer sends
                        self._apply(answer)
        except KeyboardInterrupt:
            self._salvage()
            raise
        finally:
            self._close()
        return state.results()

    def _sample(self, now: float, full: bool = True) -> PoolSample:
        """A look at the pool: ``full`` once a second (workers lost, calls TaskVine put
        back, libraries, the pool's size), else only where the calls not yet placed run (at
        a run's tail, for backup copies). Either way TaskVine is asked only about calls not
        known to be on a worker, and those its log says it put back (see ``placed``)."""
        gone: set[str] = set()
        lost_addr: set[str] = set()
        requeued: frozenset[int] = frozenset()
        if full:
            gone, lost_addr = self.rt.drop_lost_workers()
            requeued = frozenset(c for t in self.rt.requeued(now)
                                 if (c := self.calls.get(t)) is not None)
            self.rt.check_library()  # raises once the library keeps dying
            self.pool = self.rt.pool_size()
            self.libraries = self.rt.library_states(now)
        for call in requeued:
            self.placed.pop(call, None)
        placed = self.placed
        ask = [task for call, task in self.tasks.items() if call not in placed]
        states: dict[int, str] = {}
        moved: list[int] = []
        for task, (now_state, addr) in self.rt.call_places(ask).items():
            call = self.calls[task]
            states[call] = now_state
            if now_state not in (TASK_READY, "") and addr:
                placed[call] = addr
                moved.append(call)
        sample = PoolSample(now, *self.pool, states, requeued, frozenset(gone),
                            frozenset(lost_addr), self.libraries, dict(placed),
                            moved=frozenset(moved), full=full)
        if full:  # the live view's pool: once a second is what its pages show
            self.sink.pool(sample, self.state.learned.topology.workers.values())
        return sample

    # --- instructions ----------------------------------------------------------------------
    def _apply(self, instructions: Iterable[Instruction]) -> None:
        """Carry out ``instructions`` (and those their answers call for); a :class:`Fail` is
        raised after the rest, so no temp is left declared."""
        pending = deque(instructions)
        failure: BaseException | None = None
        while pending:
            ins = pending.popleft()
            if isinstance(ins, Submit):
                self._submit(ins)
            elif isinstance(ins, Withdraw):
                task = self.tasks.get(ins.call)
                self.unwithdrawn.discard(ins.call)
                if task is not None and (ins.running or self.rt.call_state(task) == TASK_READY):
                    self.rt.cancel(task)
                    self.sink.gone(ins.call)
                    del self.tasks[ins.call], self.calls[task]
                    self.placed.pop(ins.call, None)
                    pending.extend(self.state.handle(CallWithdrawn(ins.call)))
                elif task is not None:  # left running; withdrawn once TaskVine puts it back to
                    self.unwithdrawn.add(ins.call)  # wait (for an input lost with a worker)
            elif isinstance(ins, DropTemp):
                file = self.temps.pop(ins.temp, None)
                if file is not None:
                    self.rt.undeclare(file)
            elif isinstance(ins, Deliver):
                self.progress.advance(len(ins.keys) - len(ins.again))  # each task once
                if self.on_results is not None:  # e.g. the coffea executor's
                    self.on_results(ins.keys, {k: loaded(v) for k, v in ins.values.items()})
            elif isinstance(ins, Network):
                self.rt.network_fallback(ins.block, ins.unblock, ins.peers_off)
            elif isinstance(ins, Fail):
                failure = failure or ins.error
        self._say_network()
        if failure is not None:
            raise failure

    def _say_network(self) -> None:
        """Say at once, on stderr, what the run found wrong with the network and did (the
        summary says it again at the end)."""
        found = self.state.summary.network
        for finding in found[self.said:]:
            print(f"datavine: network: {network_line(finding)}", file=sys.stderr, flush=True)
        self.said = len(found)

    def _submit(self, ins: Submit) -> None:
        for temp in ins.store.values():
            if temp not in self.temps:
                self.temps[temp] = self.rt.declare_temp()
        task = self.rt.submit_bundle(
            self.encoder.dumps(ins.spec.encode()), ins.cap_mb, ins.preload, ins.limit_s,
            list(ins.features),
            fetch={name: self.temps[t] for name, t in ins.fetch.items()},
            store={name: self.temps[t] for name, t in ins.store.items()})
        self.tasks[ins.call], self.calls[task] = task, ins.call
        self.sink.sent(ins, self.state.inflight.get(ins.call),
                       copy=ins.call in self.state.copied_from)

    # --- the end ---------------------------------------------------------------------------
    def _salvage(self) -> None:
        """Interrupted: hand the result hook the values still kept on workers (the coffea
        executor merges what finished), fetched before their temps are dropped."""
        hook = self.on_results
        if hook is None:
            return
        deadline = self.clock() + SALVAGE_S
        failed: set[str | None] = set()  # a worker that did not answer is not asked again
        files: dict[int, dict[Key, object]] = {}  # a bundle's file holds several values
        for key, held in list(self.state.kept.held.items()):
            file = self.temps.get(held.file)
            if file is None or held.worker in failed or self.clock() > deadline:
                continue
            if held.file not in files:
                data = self.rt.fetch(file)
                if data is None:
                    failed.add(held.worker)
                    continue
                files[held.file] = value_file.loads_values(data)
            hook([], {key: files[held.file][key]})

    def _close(self) -> None:
        """Withdraw what was not dispatched yet, and stop the calls still running (a run that
        failed or timed out abandons them): TaskVine cannot cancel a function call (that
        confused the worker's slot: the next call hung), so the library is restarted, which
        kills them, and the cluster's slots are free for the next run at once. Then every
        temp still declared is dropped, and the summary written."""
        running = []
        for task in self.tasks.values():
            if self.rt.call_state(task) == TASK_READY:
                self.rt.cancel(task)
            else:
                running.append(task)
        if running:
            self.state.summary.abandoned = len(running)
            self.rt.restart_library(tuple(running))
        self.tasks.clear()
        self.calls.clear()
        self.placed.clear()
        for ins in self.state.close():  # after the calls are gone: only DropTemp
            file = self.temps.pop(ins.temp, None) if isinstance(ins, DropTemp) else None
            if file is not None:
                self.rt.undeclare(file)
        (out_now, in_now), (out_then, in_then) = self.rt.file_bytes(), self.bytes_at_start
        summary = self.state.summarize(self.clock() - self.state.start,
                                       self.rt.connected_workers(), out_now - out_then,
                                       in_now - in_then)
        self.rt.last_summary = summary
        self.sink.run_ended(summary)
        if self.cfg.progress:
            self.progress.print_summary(summary)
