"""One embedded cluster per executor: started on first use, shared by the executor's copies.

``Runner`` copies its executor for each call (``executor.copy(desc="Preprocessing")``, then
for processing), and a user may call ``Runner`` many times: starting a ``LocalCluster`` per
call cost ~1.5 s each (workers connecting, libraries importing coffea). An
:class:`EmbeddedCluster` is a field of :class:`~datavine.coffea.DatavineExecutor` that
``copy`` passes on as is, so the executor and all its copies use one cluster. It is stopped
by :meth:`EmbeddedCluster.close` (``executor.close()``, or the end of ``with executor:``),
when the last executor sharing it is garbage-collected, or at interpreter exit
(``weakref.finalize``): its workers never outlive the process.
"""

from __future__ import annotations

import contextlib
import gc
import threading
import weakref
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING

from datavine.deploy.reaper import temporary_directory

if TYPE_CHECKING:
    from datavine.manager.cluster import Cluster


class EmbeddedCluster:
    """A lazily started :class:`datavine.LocalCluster`, stopped once, whoever asks first."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._cluster: Cluster | None = None
        self._finalizer: weakref.finalize | None = None
        self.starts = 0  # how many clusters this holder started (tests, reports)

    @property
    def cluster(self) -> Cluster | None:
        """The running cluster, or None."""
        return self._cluster

    def get(self, make: Callable[[Path], Cluster]) -> Cluster:
        """The running cluster; ``make(run_dir)`` builds one (not started) when there is none."""
        with self._lock:
            if self._cluster is None:
                stack = contextlib.ExitStack()
                try:
                    run_dir = stack.enter_context(temporary_directory("datavine-coffea-"))
                    cluster = make(run_dir)
                    stack.enter_context(cluster)
                except BaseException:
                    stack.close()
                    raise
                self._cluster = cluster
                self.starts += 1
                # Not a method of self: the finalizer must not keep the holder alive.
                self._finalizer = weakref.finalize(self, _stop, stack)
            return self._cluster

    def close(self) -> None:
        """Stop the cluster (its workers, its manager) now; a later call starts a new one."""
        with self._lock:
            finalizer, self._finalizer, self._cluster = self._finalizer, None, None
        if finalizer is not None:
            finalizer()

    def __repr__(self) -> str:  # shown in the executor's repr
        return f"EmbeddedCluster(running={self._cluster is not None}, starts={self.starts})"


def _stop(stack: contextlib.ExitStack) -> None:
    stack.close()
    gc.collect()  # the TaskVine manager writes its last logs when collected
