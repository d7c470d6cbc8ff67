"""The imperative shell around TaskVine: the only module that drives ``ndcctools.taskvine``.

``Runtime`` owns one TaskVine manager (password, optional SSL) and one persistent library
whose single function, :func:`datavine.remote.run_bundle`, runs bundles of dask tasks in
'direct' mode. ``Runtime.get`` is a dask scheduler: it normalises the graph, asks the
planner for bundles, submits them as function calls, feeds results back, retries what
failed outside user code, and bounds every wait.
"""

from __future__ import annotations

import time
import uuid
from collections.abc import Callable, Hashable
from pathlib import Path
from typing import Any

import cloudpickle

from datavine import graph as graphs
from datavine import remote
from datavine.bundling import Bundle, CostModel, Planner
from datavine.config import ManagerConfig, RunConfig
from datavine.errors import (
    BundleFailedError,
    NoWorkersError,
    RemoteTaskError,
    RunTimeoutError,
    TaskvineMissingError,
)
from datavine.inputs import task_files
from datavine.progress import RunProgress
from datavine.summary import RunSummary

Key = Hashable

# Thread pools inside a 1-core library slot only fight each other (FINDINGS: OpenBLAS).
LIBRARY_ENV = {"OPENBLAS_NUM_THREADS": "1", "OMP_NUM_THREADS": "1", "MKL_NUM_THREADS": "1",
               "NUMBA_NUM_THREADS": "1"}


def import_taskvine() -> Any:
    try:
        import ndcctools.taskvine as vine
    except ImportError as exc:
        raise TaskvineMissingError(exc) from exc
    return vine


class Runtime:
    """A TaskVine manager that runs dask graphs. Use ``get`` as the dask scheduler."""

    def __init__(self, manager: ManagerConfig | None = None, run: RunConfig | None = None,
                 *, library_hook: Callable[[Any], None] | None = None) -> None:
        self.manager_config = manager or ManagerConfig()
        self.run_config = run or RunConfig()
        self._vine = import_taskvine()
        run_dir = Path(self.manager_config.run_dir).resolve()
        run_dir.mkdir(parents=True, exist_ok=True)
        self._m = self._vine.Manager(
            port=self.manager_config.port,
            ssl=self.manager_config.ssl,
            run_info_path=str(run_dir / "vine-run-info"),
            staging_path=str(run_dir),
        )
        if self.manager_config.password_file:
            self._m.set_password_file(str(self.manager_config.password_file))
        self._m.tune("watch-library-logfiles", 1)
        self._library_hook = library_hook
        self._library: str | None = None
        self.costs = CostModel()
        self.last_summary: RunSummary | None = None

    # ----------------------------------------------------------------------------------------
    @property
    def port(self) -> int:
        return int(self._m.port)

    @property
    def manager(self) -> Any:
        """The underlying ``ndcctools.taskvine.Manager`` (for pools and diagnostics)."""
        return self._m

    def connected_workers(self) -> int:
        return int(self._m.stats.workers_connected)

    def connected_cores(self) -> int:
        return int(self._m.stats.total_cores)

    def wait_for_workers(self, n: int, timeout_s: float) -> int:
        """Block until ``n`` workers are connected; raise NoWorkersError after ``timeout_s``."""
        deadline = time.monotonic() + timeout_s
        while self.connected_workers() < n:
            if time.monotonic() > deadline:
                raise NoWorkersError(
                    f"only {self.connected_workers()} of {n} workers connected to the manager on "
                    f"port {self.port} within {timeout_s:.0f} s")
            self._m.wait(1)  # also accepts connecting workers
        return self.connected_workers()

    def close(self) -> None:
        if getattr(self, "_m", None) is not None:
            del self._m
            self._m = None

    # ----------------------------------------------------------------------------------------
    def _ensure_library(self) -> str:
        if self._library is None:
            name = f"datavine-{uuid.uuid4().hex[:8]}"
            lib = self._m.create_library_from_functions(
                name, remote.run_bundle, add_env=False, exec_mode="direct")
            lib.set_cores(1)
            lib.set_function_slots(1)
            for var, value in LIBRARY_ENV.items():
                lib.set_env_var(var, value)
            if self._library_hook:
                self._library_hook(lib)
            self._m.install_library(lib)
            self._library = name
        return self._library

    def get(self, dsk: Any, keys: Any, **kwargs: Any) -> Any:
        """dask scheduler entry point: ``dask.compute(x, scheduler=runtime.get)``."""
        graph = graphs.build(dsk, keys)
        values = _Run(self, graph, self.run_config).execute()
        return graphs.pack_results(keys, values)


class _Run:
    """State of one ``get`` call; nothing of it outlives the call."""

    def __init__(self, rt: Runtime, graph: graphs.TaskGraph, cfg: RunConfig) -> None:
        self.rt = rt
        self.m = rt.manager
        self.graph = graph
        self.cfg = cfg
        files = {k: task_files(n) for k, n in graph.nodes.items()}
        self.files = files
        self.planner = Planner(graph, files=files.__getitem__, costs=rt.costs,
                               target_s=cfg.target_bundle_s, max_tasks=cfg.max_bundle_tasks)
        self.values: dict[Key, Any] = {}
        self.consumers = {k: set(d) for k, d in graph.dependents.items()}
        self.inflight: dict[int, tuple[Bundle, Any]] = {}
        self.summary = RunSummary()
        self.progress = RunProgress(len(graph), enabled=cfg.progress)

    def execute(self) -> dict[Key, Any]:
        library = self.rt._ensure_library()
        start = time.monotonic()
        last_worker = start
        try:
            with self.progress:
                while not self.planner.finished:
                    self._submit(library)
                    task = self.m.wait(1)
                    if task is not None:
                        self._handle(task)
                    now = time.monotonic()
                    if self.rt.connected_workers() > 0:
                        last_worker = now
                    elif now - last_worker > self.cfg.no_worker_timeout_s:
                        raise NoWorkersError(
                            f"{self.planner.n_ready + len(self.inflight)} bundles waiting and no "
                            f"worker connected to the manager on port {self.rt.port} for "
                            f"{self.cfg.no_worker_timeout_s:.0f} s (RunConfig.no_worker_timeout_s)")
                    if self.cfg.timeout_s and now - start > self.cfg.timeout_s:
                        raise RunTimeoutError(
                            f"run of {len(self.graph)} tasks did not finish within "
                            f"{self.cfg.timeout_s:.0f} s (RunConfig.timeout_s); "
                            f"{len(self.planner.done)} tasks done")
        finally:
            self._cancel_inflight()
            self.summary.wall_s = time.monotonic() - start
            self.summary.workers = self.rt.connected_workers()
            self.rt.last_summary = self.summary
            if self.cfg.progress:
                self.progress.print_summary(self.summary)
        return {k: self.values[k] for k in self.graph.outputs}

    def _submit(self, library: str) -> None:
        slots = max(1, self.rt.connected_cores())
        room = slots * self.cfg.bundles_per_slot - len(self.inflight)
        for bundle in self.planner.next_bundles(max(0, room)):
            self._submit_bundle(library, bundle)

    def _submit_bundle(self, library: str, bundle: Bundle) -> None:
        spec = {
            "nodes": [(k, self.graph.nodes[k]) for k in bundle.keys],
            "inputs": {k: self.values[k] for k in bundle.inputs},
            "outputs": sorted(bundle.outputs, key=self.graph.priority.__getitem__),
            "categories": {k: self.graph.category(k) for k in bundle.keys},
            "cap_mb": None,
        }
        call = self.rt._vine.FunctionCall(library, "run_bundle", spec)
        call.set_cores(1)
        task_id = self.m.submit(call)
        self.inflight[task_id] = (bundle, call)
        self.summary.bundles += 1

    def _handle(self, task: Any) -> None:
        entry = self.inflight.pop(task.id, None)
        if entry is None:
            return  # a call cancelled by an earlier run
        bundle, call = entry
        result = call.output if task.successful() else None
        if not isinstance(result, dict):
            self._retry(bundle, self._failure_reason(task, result))
            return
        where = f"{result.get('host', '?')} (pid {result.get('pid', '?')})"
        if result["status"] == remote.STATUS_OK:
            self._accept(bundle, result)
        elif result["status"] == remote.STATUS_ERROR:
            self._raise_task_error(result, where)
        else:
            self._retry(bundle, f"{result.get('message', 'unknown failure')} on {where}")

    def _accept(self, bundle: Bundle, result: dict[str, Any]) -> None:
        for key, blob in result["values"].items():
            self.values[key] = cloudpickle.loads(blob)
        for key in bundle.keys:
            for dep in self.graph.dependencies[key]:
                users = self.consumers[dep]
                users.discard(key)
                if not users and dep not in self.graph.outputs:
                    self.values.pop(dep, None)
        self.planner.complete(bundle)
        for category, (count, seconds) in result.get("timing", {}).items():
            self.rt.costs.observe(category, count, seconds)
            stats = self.summary.categories[category]
            stats.tasks += count
            stats.seconds += seconds
            stats.peak_mb = max(stats.peak_mb, result.get("peak_mb") or 0.0)
        self.summary.tasks += len(bundle.keys)
        self.summary.hosts[result.get("host", "?")] += len(bundle.keys)
        self.progress.advance(len(bundle.keys))

    def _retry(self, bundle: Bundle, reason: str) -> None:
        bundle.attempts += 1
        self.summary.failures.append(f"bundle {bundle.id} ({len(bundle.keys)} tasks): {reason}")
        if bundle.attempts > self.cfg.max_retries:
            raise BundleFailedError(bundle.keys, bundle.attempts, reason)
        self.summary.retries += 1
        self.planner.requeue(bundle)

    def _failure_reason(self, task: Any, output: Any) -> str:
        host = getattr(task, "hostname", None) or "?"
        if isinstance(output, Exception):
            return f"{type(output).__name__} on {host}: {task.result_string}"
        return f"TaskVine result {task.result_string!r} on {host} (exit {task.exit_code})"

    def _raise_task_error(self, result: dict[str, Any], where: str) -> None:
        key = result.get("key")
        tb = result.get("traceback", "")
        note = f"datavine: task {key!r} failed on {where}; remote traceback:\n{tb}"
        blob = result.get("exception")
        if blob is not None:
            try:
                exc = cloudpickle.loads(blob)
            except Exception:
                exc = None
            if isinstance(exc, BaseException):
                exc.add_note(note)
                raise exc
        raise RemoteTaskError(key, result.get("message", "?"), tb, where)

    def _cancel_inflight(self) -> None:
        for task_id in list(self.inflight):
            self.m.cancel_by_task_id(task_id)
        self.inflight.clear()
