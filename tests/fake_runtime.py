"""A fake :class:`datavine.manager.port.RunPort`, the port a run drives, for fast tests of the
run loop (:class:`datavine.manager.execution.GraphRun`).

It runs each submitted bundle in this process with the real worker-side code
(:func:`datavine.worker.remote.execute_payload`) in a sandbox directory, keeps the temp files
bundles store in a per-worker cache, and lets a test script what TaskVine and the workers
would do instead: a result replaced (a memory overrun, a shard error, a time limit), a call
lost with its worker, a worker gone with the values it held. No TaskVine, no processes.
"""

from __future__ import annotations

import itertools
import os
import shutil
import tempfile
import weakref
from collections import deque
from collections.abc import Callable, Iterable
from dataclasses import replace
from pathlib import Path
from typing import Any

import cloudpickle

from datavine.config import RunConfig
from datavine.manager.port import Finished
from datavine.protocol import BundleResult, Status
from datavine.scheduler.learned import Learned
from datavine.worker import remote

# script(call number, encoded spec) -> the fields of a BundleResult to return instead (a
# dict), "lost" (the worker died under the call), or None (run it for real)
Script = Callable[[int, dict[str, Any]], Any]


class FakeFile:
    """A TaskVine temp file: its bytes live in one worker's cache once made."""

    ids = itertools.count()

    def __init__(self) -> None:
        self.id = next(self.ids)


def owned_sandbox(owner: object, prefix: str) -> Path:
    """A temporary folder for a fake pool's calls, removed when ``owner`` is collected."""
    sandbox = Path(tempfile.mkdtemp(prefix=prefix))
    weakref.finalize(owner, shutil.rmtree, sandbox, True)
    return sandbox


def execute_in(sandbox: Path, payload: bytes) -> BundleResult:
    """Run a bundle's payload as the library would, in ``sandbox``; this process's folder is
    the same after (the sandbox goes with its fake pool)."""
    cwd = os.getcwd()
    try:
        return remote.execute_payload(payload, str(sandbox))
    finally:
        os.chdir(cwd)


class FakeRuntime:
    """The port :class:`datavine.manager.execution.GraphRun` drives (a :class:`RunPort`,
    checked by tests/test_run_loop.py), on ``workers`` fake workers."""

    def __init__(self, run: RunConfig, workers: int = 2, script: Script | None = None) -> None:
        self.run_config = run
        self.workers = [f"127.0.0.1:{9000 + i}" for i in range(workers)]
        self.script = script or (lambda n, spec: None)
        self.learned = Learned.fresh(run)
        self.last_summary: Any = None
        self.port = 9123
        self.declared: set[FakeFile] = set()
        self.cache: dict[FakeFile, tuple[str, bytes]] = {}  # file -> (worker, bytes)
        self.queue: deque[tuple[int, dict[str, Any], dict[str, Any], dict[str, Any]]] = deque()
        self.states: dict[int, str] = {}
        self.calls = 0
        self.lost: set[str] = set()  # workers that left, reported at the next refresh
        self.restarts = 0
        self._ids = itertools.count(1)
        self._sandbox = owned_sandbox(self, "datavine-fake-")

    # --- what GraphRun reads -------------------------------------------------------------
    def requeued(self, now: float) -> list[int]:
        return []  # nothing is ever requeued by "TaskVine" here

    def ensure_library(self) -> str:
        return "fake-library"

    def connected_workers(self) -> int:
        return len(self.workers)

    def pool_size(self) -> tuple[int, int]:
        return self.connected_workers(), len(self.workers)

    def check_library(self) -> None:
        pass

    def file_bytes(self) -> tuple[int, int]:
        return 0, 0

    def dumps(self, spec: dict[str, Any]) -> bytes:
        return cloudpickle.dumps(spec)

    def drop_lost_workers(self) -> tuple[set[str], set[str]]:
        lost, self.lost = self.lost, set()
        return set(), lost

    def restart_library(self, calls: tuple[int, ...] = ()) -> None:
        self.restarts += 1

    def library_states(self, now: float) -> dict[str, Any]:
        return {}  # every library starts at once here

    def network_fallback(self, block: Any, unblock: Any, peers_off: bool) -> None:
        raise AssertionError("no network fault in the fake runtime")

    # --- the port --------------------------------------------------------------------------
    def submit_bundle(self, payload: bytes, cap_mb: float | None, preload: tuple[str, ...],
                      limit_s: float | None, features: Any = (), fetch: Any = None,
                      store: Any = None) -> int:
        task_id = next(self._ids)
        self.queue.append((task_id, cloudpickle.loads(payload), dict(fetch or {}),
                           dict(store or {})))
        self.states[task_id] = "READY"
        return task_id

    def wait(self, timeout_s: int) -> Finished | None:
        while self.queue:
            task_id, spec, fetch, store = self.queue.popleft()
            if self.states.pop(task_id, None) is None:
                continue  # cancelled
            self.calls += 1
            worker = self.workers[self.calls % len(self.workers)]
            scripted = self.script(self.calls, spec)
            if scripted == "lost":
                return Finished(task_id, None, worker, f"worker {worker} lost")
            if scripted is not None:  # the fields of a BundleResult, as the library sends it
                return Finished(task_id, BundleResult(**{"worker": worker, **scripted}).encode(),
                                worker)
            return Finished(task_id, self._execute(spec, fetch, store, worker), worker)
        return None

    def _execute(self, spec: dict[str, Any], fetch: dict[str, Any], store: dict[str, Any],
                 worker: str) -> dict[str, Any]:
        sandbox = Path(tempfile.mkdtemp(dir=self._sandbox))
        key_of = {name: key for key, name in spec.get("input_files", {}).items()}
        for name, file in fetch.items():
            if file not in self.cache:  # as the library reports an input that did not come
                return BundleResult(Status.LOST, key=key_of[name],
                                    message=f"input {name} is gone").encode()
            (sandbox / name).write_bytes(self.cache[file][1])
        result = execute_in(sandbox, cloudpickle.dumps(spec))
        for name, file in store.items():
            if (sandbox / name).exists() and file in self.declared:
                self.cache[file] = (worker, (sandbox / name).read_bytes())
        return replace(result, peak_mb=result.peak_mb or 10.0, worker=None).encode()

    def cancel(self, task_id: int) -> None:
        self.states.pop(task_id, None)

    def call_state(self, task_id: int) -> str:
        return self.states.get(task_id, "")

    def call_worker(self, task_id: int) -> str | None:
        return None

    def call_places(self, task_ids: Iterable[int]) -> dict[int, tuple[str, str | None]]:
        return {t: (self.call_state(t), self.call_worker(t)) for t in task_ids}

    def declare_temp(self) -> FakeFile:
        file = FakeFile()
        self.declared.add(file)
        return file

    def fetch(self, file: FakeFile) -> bytes | None:
        """The bytes a call stored in ``file``, or None when its worker lost them."""
        held = self.cache.get(file)
        return held[1] if held is not None else None

    def undeclare(self, file: FakeFile) -> None:
        self.declared.remove(file)
        self.cache.pop(file, None)

    # --- faults ----------------------------------------------------------------------------
    def lose_worker(self, worker: str) -> None:
        """The worker leaves: the values in its cache are gone."""
        self.lost.add(worker)
        for file in [f for f, (w, _) in self.cache.items() if w == worker]:
            del self.cache[file]
