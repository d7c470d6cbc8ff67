"""The manager's host as resources that saturate: its one core and its NIC.

Each is a :class:`Server` on simulated time: one piece of work at a time; work that arrives
while it is busy waits. When work arrives faster than the server does it, the queues grow
and everything in them waits: results wait to be taken (their worker's core stays taken),
calls wait to be sent (free cores idle). That is how a manager at its limit shows in a
facility: dispatch latency grows and workers idle.

:class:`ManagerHost` is the core (TaskVine's and datavine's one thread) and the NIC. The
core takes turns between three queues, as TaskVine's wait loop does (a cycle takes one
result or sends one call): results to take, calls to send, datavine's own decisions; in
each queue the oldest first. The NIC is full duplex: results come in on one
:class:`Server`, calls go out on another; a NIC of 0 bytes/s is not modelled (its bytes
are counted, its time is 0).
"""

from __future__ import annotations

from collections import deque
from collections.abc import Callable

from datavine.apps.sim.events import EventQueue

RESULT, SEND, THINK = "result", "send", "think"  # the core's queues

Then = Callable[[], None] | None


class Server:
    """One resource doing one piece of work at a time: its queues take turns (round
    robin among those with work waiting), the oldest first within a queue. ``then`` is
    called when a piece of work is done."""

    def __init__(self, q: EventQueue, queues: tuple[str, ...] = ("work",)) -> None:
        self.q = q
        self.order = queues
        self.queues: dict[str, deque[tuple[float, Then]]] = {name: deque() for name in queues}
        self.charged_s = 0.0  # all work given to it, done or waiting
        self._turn = 0  # the queue to look at first
        self._busy = False
        self._start = self._length = 0.0
        self._done_s = 0.0  # work of the pieces finished

    def submit(self, seconds: float, then: Then = None, queue: str | None = None) -> None:
        """Work of ``seconds`` arrives now in ``queue`` (default: the first)."""
        self.queues[queue or self.order[0]].append((seconds, then))
        self.charged_s += seconds
        if not self._busy:
            self._next()

    def done_by(self, t: float) -> float:
        """Seconds of work done by ``t`` (now, or later within the piece under way)."""
        if self._busy and t > self._start:
            return self._done_s + min(t - self._start, self._length)
        return self._done_s

    @property
    def waiting(self) -> int:
        return sum(len(queue) for queue in self.queues.values())

    def _next(self) -> None:
        n = len(self.order)
        for i in range(n):
            name = self.order[(self._turn + i) % n]
            queue = self.queues[name]
            if queue:
                self._turn = (self._turn + i + 1) % n
                seconds, then = queue.popleft()
                self._busy, self._start, self._length = True, self.q.now, seconds
                self.q.after(seconds, self._finish, then)
                return

    def _finish(self, then: Then) -> None:
        self._done_s += self._length
        self._busy = False
        if then is not None:
            then()  # may submit more, and start it
        if not self._busy:
            self._next()


class ManagerHost:
    """The manager's core and its NIC (``nic_bytes_per_s`` each way; 0: not modelled)."""

    def __init__(self, q: EventQueue, nic_bytes_per_s: float = 0.0) -> None:
        if nic_bytes_per_s < 0:
            raise ValueError(f"the manager's NIC speed must be >= 0, got {nic_bytes_per_s}")
        self.cpu = Server(q, (RESULT, SEND, THINK))
        self.nic_in = Server(q)
        self.nic_out = Server(q)
        self.nic_bytes_per_s = nic_bytes_per_s
        self.nic_bytes = 0.0  # bytes through the NIC, both ways (sent, or waiting to be)
        self.sent_bytes = 0.0  # of which calls
        self.result_bytes = 0.0  # of which results

    def _nic_s(self, nbytes: float) -> float:
        return nbytes / self.nic_bytes_per_s

    def take(self, cpu_s: float, nbytes: float, then: Then) -> None:
        """A result of ``nbytes`` comes in over the NIC, then the core takes it; ``then``
        when it is taken."""
        self.nic_bytes += nbytes
        self.result_bytes += nbytes
        if self.nic_bytes_per_s > 0:
            self.nic_in.submit(self._nic_s(nbytes),
                               lambda: self.cpu.submit(cpu_s, then, RESULT))
        else:
            self.cpu.submit(cpu_s, then, RESULT)

    def send(self, cpu_s: float, nbytes: float, then: Then) -> None:
        """The core sends a call of ``nbytes``, then its bytes go out over the NIC;
        ``then`` when they are out."""
        self.nic_bytes += nbytes
        self.sent_bytes += nbytes
        if self.nic_bytes_per_s > 0:
            self.cpu.submit(cpu_s, lambda: self.nic_out.submit(self._nic_s(nbytes), then),
                            SEND)
        else:
            self.cpu.submit(cpu_s, then, SEND)

    def think(self, cpu_s: float) -> None:
        """Core time of datavine's own (its decisions), in turn with the rest."""
        if cpu_s > 0:
            self.cpu.submit(cpu_s, None, THINK)
