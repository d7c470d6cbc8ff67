"""The interface of a worker pool: a way to get TaskVine workers connected to a manager.

A pool is started, watched and stopped; it is a context manager. Backends subclass
:class:`WorkerPool` (``vine_factory`` pools in :mod:`datavine.deploy.pools.factory_pool`);
:meth:`WorkerPool.wait_for_workers` works for any backend through :meth:`status`.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from types import TracebackType
from typing import Self

from datavine.errors import DatavineError


class PoolError(DatavineError):
    """A pool could not be started, stopped or asked; the message says which and why."""


class PoolTimeoutError(PoolError):
    """Fewer workers than asked for connected within the time allowed."""


@dataclass(frozen=True)
class PoolStatus:
    """What a pool looks like now.

    Attributes:
        name, batch, manager: which pool, of which kind, serving which manager (host:port).
        running: the pool's own process (the factory) is alive.
        workers_connected: workers connected to the manager, from any pool (the manager
            does not tell whose they are); ``None`` when it could not be asked.
        jobs: this pool's batch jobs by state (``idle``, ``running``, ``held``...), or its
            worker processes (``running``) for a local pool; ``None`` when unknown.
        detail: why something is unknown, or other remarks.
    """

    name: str
    batch: str
    manager: str
    running: bool
    workers_connected: int | None
    jobs: dict[str, int] | None = field(default_factory=dict)
    detail: str = ""

    @property
    def ready_workers(self) -> int:
        """This pool's workers connected to the manager, as far as can be told: the
        manager's count, capped by the pool's running jobs when those are known."""
        connected = self.workers_connected or 0
        if self.jobs is None:
            return connected
        return min(connected, self.jobs.get("running", 0))

    def summary(self) -> str:
        state = "running" if self.running else "stopped"
        connected = "?" if self.workers_connected is None else str(self.workers_connected)
        if self.jobs is None:
            jobs = "unknown"
        else:
            jobs = ", ".join(f"{n} {s}" for s, n in sorted(self.jobs.items())) or "none"
        line = (f"{self.name} ({self.batch}): factory {state}, manager {self.manager}, "
                f"{connected} worker(s) connected, jobs: {jobs}")
        return f"{line} [{self.detail}]" if self.detail else line


class WorkerPool:
    """Base of all pools. Subclasses implement :meth:`start`, :meth:`stop`, :meth:`status`."""

    name: str = "pool"

    def start(self) -> Self:
        raise NotImplementedError(f"{type(self).__name__}.start")

    def stop(self) -> None:
        raise NotImplementedError(f"{type(self).__name__}.stop")

    def status(self) -> PoolStatus:
        raise NotImplementedError(f"{type(self).__name__}.status")

    def wait_for_workers(self, n: int, timeout_s: float, poll_s: float = 0.5) -> PoolStatus:
        """Return once ``n`` workers are connected to the manager, else raise.

        The manager must be serving connections meanwhile (its owner inside ``wait()``).
        """
        deadline = time.monotonic() + timeout_s
        while True:
            status = self.status()
            if status.ready_workers >= n:
                return status
            if not status.running:
                raise PoolError(f"pool {status.name!r} stopped while waiting for {n} workers: "
                                f"{status.summary()}")
            if time.monotonic() >= deadline:
                raise PoolTimeoutError(
                    f"only {status.ready_workers} of {n} worker(s) connected to the "
                    f"manager at {status.manager} after {timeout_s:.0f} s "
                    f"(pool {status.name!r}: {status.summary()})")
            time.sleep(poll_s)

    def __enter__(self) -> Self:
        return self.start()

    def __exit__(self, exc_type: type[BaseException] | None, exc: BaseException | None,
                 tb: TracebackType | None) -> None:
        self.stop()
