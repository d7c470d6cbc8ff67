"""Memory and CPU of the processes on this host, for the live view (psutil).

The view's server reads, at most every :data:`EVERY_S` and only while a page is open, the
resident memory and CPU of each local worker's processes (the ``vine_worker``, its library
and the library's capped child: the tree under the PID the cluster started), the manager's
process, and this host's memory and CPU, and hands them to the board as a ``usage`` record
(:meth:`datavine.dashboard.model.Board.apply`). Workers on other hosts are not read here:
their memory is what their bundles report (each bundle's peak). The run pays nothing for
this: it runs in the server's process.
"""

from __future__ import annotations

import contextlib
import time
from collections.abc import Callable, Iterable, Mapping

import psutil

from datavine.dashboard.records import UsageRecord

EVERY_S = 1.5  # under the pages' refresh (2 s): each update brings new figures
MB = 2**20


class Usage:
    """Reads the processes a board names; keeps each process's ``psutil.Process`` so that
    its CPU is measured between two reads."""

    def __init__(self, every_s: float = EVERY_S,
                 clock: Callable[[], float] = time.monotonic) -> None:
        self.every_s = every_s
        self.clock = clock
        self.last = -every_s
        self._procs: dict[int, psutil.Process] = {}
        psutil.cpu_percent(None)  # the first call starts the host's CPU measure

    def record(self, workers: Mapping[str, int], manager: int | None) -> UsageRecord | None:
        """A ``usage`` record, or None when the last is younger than ``every_s``."""
        now = self.clock()
        if now - self.last < self.every_s:
            return None
        self.last = now
        children = _children()
        seen: set[int] = set()
        out: UsageRecord = {"k": "usage", "t": round(time.time(), 3), "workers": {},
                            "host": []}
        for name, pid in workers.items():
            figures = self._tree(pid, children, seen)
            if figures is not None:
                out["workers"][name] = figures
        if manager is not None:
            figures = self._read([manager], seen)
            if figures is not None:
                out["manager"] = figures
        memory = psutil.virtual_memory()
        out["host"] = [round((memory.total - memory.available) / MB), round(memory.total / MB),
                       psutil.cpu_percent(None)]
        for pid in set(self._procs) - seen:  # gone, or no longer asked for
            del self._procs[pid]
        return out

    def _tree(self, root: int, children: Mapping[int, list[int]],
              seen: set[int]) -> list[float] | None:
        pids, todo = [], [root]
        while todo:
            pid = todo.pop()
            pids.append(pid)
            todo.extend(children.get(pid, ()))
        return self._read(pids, seen)

    def _read(self, pids: Iterable[int], seen: set[int]) -> list[float] | None:
        rss = cpu = 0.0
        found = False
        for pid in pids:
            proc = self._procs.get(pid)
            try:
                if proc is None:
                    proc = self._procs[pid] = psutil.Process(pid)
                    proc.cpu_percent(None)  # measured from now on
                with proc.oneshot():
                    rss += proc.memory_info().rss
                    cpu += proc.cpu_percent(None)
            except (psutil.NoSuchProcess, psutil.AccessDenied, psutil.ZombieProcess):
                self._procs.pop(pid, None)
                continue
            seen.add(pid)
            found = True
        return [round(rss / MB, 1), round(cpu, 1)] if found else None


def _children() -> dict[int, list[int]]:
    """PID -> its children's PIDs, from one pass over the process table."""
    out: dict[int, list[int]] = {}
    for proc in psutil.process_iter(["ppid"]):
        with contextlib.suppress(psutil.Error):
            ppid = proc.info["ppid"]
            if ppid:
                out.setdefault(ppid, []).append(proc.pid)
    return out
