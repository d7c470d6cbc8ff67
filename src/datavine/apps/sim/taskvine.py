"""A simulated TaskVine manager: calls wait for a free core of a worker their features allow.

What it models, as TaskVine does it for datavine's function calls (one core each): a call
with the feature ``worker:<id>`` runs only there, one with ``rack:<r>`` on any worker of
that rack, one without features anywhere; among calls a freed core could take, the oldest
goes first; a call without a feature lands on a free core chosen at random (TaskVine ranks
workers by the call's cached inputs, and function calls declare none). The manager is one
thread: sending a call and taking its result each occupy it for a while
(:class:`~datavine.apps.sim.spec.ManagerCost`), and so do datavine's decisions (:meth:`busy`);
the call's bytes and the result's cross the manager's NIC. Both are resources that saturate
(:class:`~datavine.apps.sim.manager.ManagerHost`, where the thread takes results, sends calls
and decides in turn): a result waits to be taken, holding its core, and a call waits to be
sent, while the manager is busy.
"""

from __future__ import annotations

import random
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from datavine.apps.sim.events import EventQueue
from datavine.apps.sim.manager import ManagerHost
from datavine.apps.sim.spec import ManagerCost


@dataclass
class SimWorker:
    id: str
    rack: str
    cores: int
    busy: int = 0
    host: str = ""  # the host it runs on ("": its id)


@dataclass
class SimCall:
    """One function call: ``payload`` is the driver's, ``worker``/``rack`` its features,
    ``nbytes`` what the manager sends for it."""

    seq: int
    payload: Any
    worker: str | None = None
    rack: str | None = None
    nbytes: float = 0.0
    ran_on: SimWorker | None = field(default=None, repr=False)


class _FreeSet:
    """Workers with a free core: O(1) add, remove and random choice."""

    def __init__(self) -> None:
        self.items: list[str] = []
        self.pos: dict[str, int] = {}

    def add(self, wid: str) -> None:
        if wid not in self.pos:
            self.pos[wid] = len(self.items)
            self.items.append(wid)

    def discard(self, wid: str) -> None:
        i = self.pos.pop(wid, None)
        if i is None:
            return
        last = self.items.pop()
        if last != wid:
            self.items[i] = last
            self.pos[last] = i

    def __len__(self) -> int:
        return len(self.items)


class SimTaskVine:
    """Workers, waiting calls and the manager's host (its one thread and its NIC, of
    ``nic_bytes_per_s``; 0: the NIC's time is not modelled).

    ``on_start(call, t)``: the call begins on its worker at ``t``; the driver answers with
    :meth:`finish` when it ends. ``on_result(call, t)``: the manager took the result at ``t``.
    """

    def __init__(self, q: EventQueue, workers: list[SimWorker], cost: ManagerCost,
                 on_start: Callable[[SimCall, float], None],
                 on_result: Callable[[SimCall, float], None], seed: int = 0,
                 nic_bytes_per_s: float = 0.0) -> None:
        self.q = q
        self.cost = cost
        self.workers = {w.id: w for w in workers}
        self.rng = random.Random(seed)
        self.on_start, self.on_result = on_start, on_result
        self.free: dict[str, _FreeSet] = {}
        for w in workers:
            self.free.setdefault(w.rack, _FreeSet()).add(w.id)
        self.waiting_worker: dict[str, deque[SimCall]] = {}
        self.waiting_rack: dict[str, deque[SimCall]] = {}
        self.waiting_any: deque[SimCall] = deque()
        self.manager = ManagerHost(q, nic_bytes_per_s)
        self.dispatched = 0
        self._seq = 0
        self._cores = sum(w.cores for w in workers)  # the workers are known at the start

    @property
    def cores(self) -> int:
        return self._cores

    @property
    def busy_cores(self) -> int:
        return sum(w.busy for w in self.workers.values())

    def busy(self, seconds: float) -> None:
        """Occupy the manager's thread for ``seconds`` (datavine's decisions), in turn
        with taking results and sending calls."""
        self.manager.think(seconds)

    def submit(self, payload: Any, worker: str | None = None, rack: str | None = None,
               nbytes: float = 0.0) -> SimCall:
        """A call of ``nbytes`` (its spec, as sent) for ``worker``, ``rack`` or anywhere."""
        self._seq += 1
        call = SimCall(self._seq, payload, worker, rack, nbytes)
        target = self._free_for(call)
        if target is not None:
            self._dispatch(call, target)
        elif worker is not None:
            self.waiting_worker.setdefault(worker, deque()).append(call)
        elif rack is not None:
            self.waiting_rack.setdefault(rack, deque()).append(call)
        else:
            self.waiting_any.append(call)
        return call

    def finish(self, call: SimCall, result_bytes: float = 0.0) -> None:
        """The call's work ended on its worker now; its result (``result_bytes``) crosses
        the manager's NIC and the manager takes it."""
        self.manager.take(self.cost.result_s, result_bytes, lambda: self._taken(call))

    def _taken(self, call: SimCall) -> None:
        worker = call.ran_on
        assert worker is not None
        worker.busy -= 1
        self.free[worker.rack].add(worker.id)
        nxt = self._next_for(worker)
        if nxt is not None:
            self._dispatch(nxt, worker)
        self.on_result(call, self.q.now)

    def _free_for(self, call: SimCall) -> SimWorker | None:
        if call.worker is not None:
            w = self.workers.get(call.worker)
            return w if w is not None and w.busy < w.cores else None
        racks = [call.rack] if call.rack is not None else list(self.free)
        sizes = [len(self.free.get(r, ())) for r in racks]
        total = sum(sizes)
        if total == 0:
            return None
        pick = self.rng.randrange(total)
        for rack, size in zip(racks, sizes, strict=True):
            if pick < size:
                return self.workers[self.free[rack].items[pick]]
            pick -= size
        return None

    def _next_for(self, worker: SimWorker) -> SimCall | None:
        queues = [q for q in (self.waiting_worker.get(worker.id),
                              self.waiting_rack.get(worker.rack), self.waiting_any) if q]
        if not queues:
            return None
        return min(queues, key=lambda d: d[0].seq).popleft()

    def _dispatch(self, call: SimCall, worker: SimWorker) -> None:
        worker.busy += 1
        if worker.busy >= worker.cores:
            self.free[worker.rack].discard(worker.id)
        call.ran_on = worker
        self.dispatched += 1
        self.manager.send(self.cost.dispatch_s, call.nbytes, lambda: self._sent(call))

    def _sent(self, call: SimCall) -> None:
        """The call left the manager: its work starts after the latency and the start."""
        self.q.after(self.cost.latency_s + self.cost.start_s, self._begin, call)

    def _begin(self, call: SimCall) -> None:
        self.on_start(call, self.q.now)
