"""The workers as they come and go: who connected, who left, which calls TaskVine requeued.

:class:`WorkerWatch` keeps the topology (:class:`datavine.scheduler.topology.Topology`) in step
with TaskVine's list of connected workers, read only when its counters say a worker joined
or left (and at most every :data:`STATUS_EVERY_S`), and with the workers datavine started
itself (``liveness``); it names the workers that left and the addresses that disconnected,
so that their calls run elsewhere, and the calls TaskVine put back in its queue by itself
(from its transactions log, :class:`datavine.manager.library_log.LibraryLog`). Every TaskVine
call goes through :class:`datavine.manager.taskvine_port.TaskVinePort`.
"""

from __future__ import annotations

import time
from collections.abc import Callable

from datavine.errors import NoWorkersError
from datavine.manager.library_log import LibraryLog
from datavine.manager.taskvine_port import TaskVinePort
from datavine.scheduler.topology import Topology

STATUS_EVERY_S = 1.0


class WorkerWatch:
    """The workers of one manager (see the module docstring).

    ``liveness``: for workers datavine started itself, a callable returning the names of
    those still running, so that bundles sent to a dead one are sent elsewhere at once.
    """

    def __init__(self, port: TaskVinePort, topology: Topology, libraries: LibraryLog, *,
                 liveness: Callable[[], set[str]] | None = None) -> None:
        self.port = port
        self.topology = topology
        self.libraries = libraries
        self.liveness = liveness
        self._addrports: set[str] = set()  # workers connected at the last status
        self._worker_counters: tuple[int, int] | None = None  # (joined, removed) then
        self._last_status = 0.0
        # liveness' last answer and the workers known then: the known workers are searched
        # for the dead only when either changed (a walk over them every second, for
        # nothing, at 256 workers)
        self._alive: tuple[set[str], int] | None = None

    def wait_for_workers(self, n: int, timeout_s: float, *, waited_s: float = 0.0) -> int:
        """Block until ``n`` workers are connected; raise NoWorkersError after ``timeout_s``
        (``waited_s``: how long the caller waited for them already, for the message)."""
        deadline = time.monotonic() + timeout_s
        while self.port.connected_workers() < n:
            if time.monotonic() > deadline:
                raise NoWorkersError(
                    f"only {self.port.connected_workers()} of {n} workers connected to the "
                    f"manager on port {self.port.port} within {waited_s + timeout_s:.0f} s")
            self.port.wait_task(1)  # also accepts connecting workers
        return self.port.connected_workers()

    def drop_lost_workers(self) -> tuple[set[str], set[str]]:
        """Forget workers that left: (their names, the addresses that disconnected since the
        last look). Calls sent to a named worker that left, or running on a lost address,
        must run elsewhere. Workers that joined become known to the topology with their
        host, rack, name and cores, before any bundle ran on them (:meth:`Topology.see`)."""
        now = time.monotonic()
        gone: set[str] = set()
        lost_addr: set[str] = set()
        alive = self.liveness() if self.liveness is not None else None
        if alive is not None and (alive, len(self.topology.workers)) != self._alive:
            gone |= {w.id for w in self.topology.workers.values()
                     if w.named and w.id.startswith("local-") and w.id not in alive}
            self._alive = (alive, len(self.topology.workers) - len(gone))
            for wid in gone:
                known = self.topology.forget(wid)
                if known is not None and known.addrport:
                    lost_addr.add(known.addrport)
        if now - self._last_status >= STATUS_EVERY_S:
            self._last_status = now
            workers = self._worker_list_if_changed()
            if isinstance(workers, list):
                entries = [w for w in workers if isinstance(w, dict)]
                alive_addr = {a for w in entries if (a := w.get("addrport"))}
                lost_addr |= self._addrports - alive_addr
                self._addrports = alive_addr
                gone |= set(self.topology.forget_missing(alive_addr))
                if self.topology.see(entries):
                    # a worker that has not reported its features and resources yet (they
                    # follow its hello): look again at the next status, joined or not
                    self._worker_counters = None
        return gone, lost_addr

    def _worker_list_if_changed(self) -> object:
        """TaskVine's list of connected workers (a list of dicts, as TaskVine gives it), or
        None when no worker joined or left since the last look (the list costs ~10 ms at 256
        workers; the counters nothing)."""
        counters = self.port.worker_counters()
        if counters == self._worker_counters:
            return None
        try:
            workers = self.port.worker_list()
        except Exception:  # a status call must never break a run
            return None
        self._worker_counters = counters
        return workers

    def look_again(self) -> None:
        """Have the next :meth:`drop_lost_workers` read TaskVine's worker list, whatever the
        time since the last look and the counters say."""
        self._last_status, self._worker_counters = 0.0, None

    def named_workers(self) -> dict[str, int]:
        """The connected workers that said their name (``worker:``) when they connected, with
        their cores (at least 1), as TaskVine's worker list says now."""
        self.look_again()
        self.drop_lost_workers()
        return {w.id: max(1, w.cores) for w in self.topology.workers.values()
                if w.named and w.addrport}

    def requeued(self, now: float) -> list[int]:
        """Task ids TaskVine put back in its queue by itself since the last look (their
        worker or library died), from its transactions log (read once for this and the
        libraries' states)."""
        return self.libraries.requeued(now)
