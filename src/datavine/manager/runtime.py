"""A TaskVine manager that runs dask graphs: the three jobs of the manager's shell, composed.

:class:`Runtime` puts together the TaskVine port
(:class:`datavine.manager.taskvine_port.TaskVinePort`: the one manager, every TaskVine call),
the library's lifecycle (:class:`datavine.manager.library.DatavineLibrary`) and the watch on
the workers (:class:`datavine.manager.worker_watch.WorkerWatch`), with what a manager learns
across runs (task costs, memory peaks per category, the workers it has seen: one
:class:`datavine.scheduler.learned.Learned`). ``Runtime.get`` is a dask scheduler; each call
is one :class:`datavine.manager.execution.GraphRun`, which drives one
:class:`datavine.scheduler.run_state.RunState` through the runtime as a
:class:`datavine.manager.port.RunPort`; the values each run delivers go to the hooks
subscribed with :meth:`Runtime.subscribe_results`.
"""

from __future__ import annotations

import contextlib
import importlib
from collections.abc import Callable, Hashable, Iterable, Iterator, Mapping, Sequence
from pathlib import Path
from typing import Any

import cloudpickle

from datavine.config import ManagerConfig, RunConfig
from datavine.dashboard.events import NO_SINK, NullSink
from datavine.io.shards import ShardHealth
from datavine.manager.environment import PackedEnv
from datavine.manager.execution import GraphRun
from datavine.manager.library import DatavineLibrary
from datavine.manager.library_log import LibraryLog
from datavine.manager.listen import local_host
from datavine.manager.port import Finished, ResultHook
from datavine.manager.taskvine_port import TaskVinePort
from datavine.manager.taskvine_types import VineManager
from datavine.manager.worker_watch import WorkerWatch
from datavine.scheduler import graph as graphs
from datavine.scheduler.bundling import CostModel
from datavine.scheduler.learned import Learned
from datavine.scheduler.memory import MemoryState
from datavine.scheduler.network import LibraryState
from datavine.scheduler.summary import RunSummary
from datavine.scheduler.topology import Topology


class Runtime:
    """A TaskVine manager that runs dask graphs. Use ``get`` as the dask scheduler.

    ``liveness``: for workers datavine started itself, a callable returning the names of
    those still running, so that bundles sent to a dead one are sent elsewhere at once.
    ``environment``: a packed Python environment (:mod:`datavine.manager.environment`) the library
    runs in, for workers without the project's Python; shared between workers peer-to-peer.
    ``library_hook``: sees the TaskVine LibraryTask before it is installed.
    """

    def __init__(self, manager: ManagerConfig | None = None, run: RunConfig | None = None,
                 *, library_hook: Callable[[object], None] | None = None,
                 liveness: Callable[[], set[str]] | None = None,
                 environment: PackedEnv | None = None) -> None:
        self.manager_config = manager or ManagerConfig()
        run_config = run or RunConfig()
        self.taskvine = TaskVinePort(self.manager_config)
        self.libraries = LibraryLog(self.taskvine.info_dir / "vine-logs" / "transactions")
        self.learned = Learned.fresh(run_config, here=local_host())  # handed to each run
        self.library = DatavineLibrary(self.taskvine, run_config, self.libraries,
                                       self.learned.topology, liveness=liveness,
                                       environment=environment, hook=library_hook)
        self.watch = WorkerWatch(self.taskvine, self.learned.topology, self.libraries,
                                 liveness=liveness)
        self._run_config = run_config
        self.environment = environment
        self.last_summary: RunSummary | None = None
        self.event_sink: NullSink = NO_SINK  # runs' events for the live view (a cluster's)
        self._result_hooks: list[ResultHook] = []
        for module in run_config.pickle_by_value:
            cloudpickle.register_pickle_by_value(importlib.import_module(module))

    @property
    def run_config(self) -> RunConfig:
        """The settings of the next run (and of the library's lifecycle)."""
        return self._run_config

    @run_config.setter
    def run_config(self, run: RunConfig) -> None:
        self._run_config = run
        self.library.run_config = run

    # --- what runs learned ------------------------------------------------------------------
    @property
    def costs(self) -> CostModel:
        return self.learned.costs

    @property
    def memory(self) -> MemoryState | None:
        return self.learned.memory

    @property
    def topology(self) -> Topology:
        return self.learned.topology

    @property
    def shard_health(self) -> ShardHealth:
        return self.learned.shard_health

    # --- the manager ------------------------------------------------------------------------
    @property
    def port(self) -> int:
        return self.taskvine.port

    @property
    def listen_address(self) -> str | None:
        """The local address the manager listens on (None: every interface)."""
        return self.taskvine.listen_address

    @property
    def contact_host(self) -> str:
        """The address a process on this host reaches the manager by."""
        return self.taskvine.contact_host

    @property
    def manager(self) -> VineManager:
        """The underlying ``ndcctools.taskvine.Manager`` (for pools and diagnostics)."""
        return self.taskvine.manager

    @property
    def info_dir(self) -> Path:
        """TaskVine's run directory of this manager (its logs, the libraries' logs)."""
        return self.taskvine.info_dir

    def close(self) -> None:
        """Shut the manager down now (not whenever the garbage collector gets to it)."""
        self.library.close()
        self.taskvine.close()

    # --- the pool before runs ---------------------------------------------------------------
    def wait_for_workers(self, n: int, timeout_s: float, *, waited_s: float = 0.0) -> int:
        """Block until ``n`` workers are connected (:meth:`WorkerWatch.wait_for_workers`)."""
        return self.watch.wait_for_workers(n, timeout_s, waited_s=waited_s)

    def warm_up(self, workers: dict[str, int], timeout_s: float) -> set[tuple[str, int]]:
        """Start the library on the named workers (:meth:`DatavineLibrary.warm_up`)."""
        return self.library.warm_up(workers, timeout_s)

    def warm_connected(self, timeout_s: float) -> set[tuple[str, int]]:
        """:meth:`warm_up` every connected worker that said its name (``worker:``) when it
        connected: learned from TaskVine's worker list, read now."""
        named = self.watch.named_workers()
        return self.warm_up(named, timeout_s) if named else set()

    def library_failures(self) -> list[Path]:
        """Logs of library instances that died with a traceback (TaskVine restarts them)."""
        return self.library.failures()

    # --- the runs ---------------------------------------------------------------------------
    @contextlib.contextmanager
    def subscribe_results(self, hook: ResultHook) -> Iterator[None]:
        """``hook(keys, values)`` after each delivery of the runs started within the block:
        the keys of the tasks that finished and the values delivered with them; on Ctrl-C,
        the values still kept on workers (fetched for the hooks before they are dropped)."""
        self._result_hooks.append(hook)
        try:
            yield
        finally:
            self._result_hooks.remove(hook)

    @property
    def result_hooks(self) -> tuple[ResultHook, ...]:
        """The hooks subscribed now, in order."""
        return tuple(self._result_hooks)

    def _publish(self, keys: list[Hashable], values: dict[Hashable, object]) -> None:
        for hook in tuple(self._result_hooks):
            hook(keys, values)

    def get(self, dsk: object, keys: object, **kwargs: object) -> Any:
        """dask scheduler entry point: ``dask.compute(x, scheduler=runtime.get)``: ``dsk``
        a dask graph, ``keys`` the (nested) keys to compute; their values come back in the
        same nesting (user values: the edge)."""
        graph = graphs.build(dsk, keys)
        self.library.rewarm(self.run_config.no_worker_timeout_s)
        run = GraphRun(self, graph, self.run_config, sink=self.event_sink,
                       on_results=self._publish if self._result_hooks else None)
        # what this TaskVine lacks, in the summary's notes (datavine doctor says the same)
        run.state.summary.notes.extend(self.taskvine.capability_lines())
        values = run.execute()
        return graphs.pack_results(keys, values)

    # --- the run's port (datavine.manager.port.RunPort) -------------------------------------
    def submit_bundle(self, payload: bytes, cap_mb: float | None, preload: tuple[str, ...],
                      limit_s: float | None, features: Sequence[str] = (),
                      fetch: Mapping[str, object] | None = None,
                      store: Mapping[str, object] | None = None) -> int:
        self.library.ensure()
        return self.taskvine.submit_bundle(payload, cap_mb, preload, limit_s, features,
                                           fetch, store)

    def wait(self, timeout_s: int) -> Finished | None:
        return self.taskvine.wait(timeout_s)

    def cancel(self, task_id: int) -> None:
        self.taskvine.cancel(task_id)

    def call_state(self, task_id: int) -> str:
        return self.taskvine.call_state(task_id)

    def call_worker(self, task_id: int) -> str | None:
        return self.taskvine.call_worker(task_id)

    def call_places(self, task_ids: Iterable[int]) -> dict[int, tuple[str, str | None]]:
        return self.taskvine.call_places(task_ids)

    def declare_temp(self) -> object:
        return self.taskvine.declare_temp()

    def fetch(self, file: object) -> bytes | None:
        return self.taskvine.fetch(file)

    def undeclare(self, file: object) -> None:
        self.taskvine.undeclare(file)

    def file_bytes(self) -> tuple[int, int]:
        return self.taskvine.file_bytes()

    def pool_size(self) -> tuple[int, int]:
        return self.taskvine.pool_size()

    def connected_workers(self) -> int:
        return self.taskvine.connected_workers()

    def network_fallback(self, block: Sequence[str], unblock: Sequence[str],
                         peers_off: bool) -> None:
        self.taskvine.network_fallback(block, unblock, peers_off)

    def dumps(self, spec: Mapping[str, object]) -> bytes:
        return self.taskvine.dumps(spec)

    def ensure_library(self) -> str:
        return self.library.ensure()

    def check_library(self) -> None:
        self.library.check()

    def restart_library(self, calls: tuple[int, ...] = ()) -> None:
        self.library.restart(calls)

    def library_states(self, now: float) -> dict[str, LibraryState]:
        return self.library.states(now)

    def drop_lost_workers(self) -> tuple[set[str], set[str]]:
        return self.watch.drop_lost_workers()

    def requeued(self, now: float) -> list[int]:
        return self.watch.requeued(now)
