"""Worker side: the function the persistent TaskVine library runs for each bundle.

A bundle is a topologically ordered list of dask task-spec nodes plus the values of the
keys it needs from outside. It runs in the library process itself (TaskVine's 'direct'
mode: no fork per call, no 5 s reaping stall), or under a memory cap in a long-lived child
that the library forks (:mod:`datavine.worker.capped_child`).
The function never raises: it returns a plain dict that says what happened, so a failure
names the dask key and carries the remote traceback back to the manager.

This module is imported on workers: keep its imports light.
"""

from __future__ import annotations

import contextlib
import dataclasses
import importlib
import os
import signal
import socket
import threading
import time
import traceback
from collections import defaultdict
from typing import TYPE_CHECKING, Any

import cloudpickle

from datavine.io.reading import is_input_error, reading, shard_health
from datavine.scheduler import labels

if TYPE_CHECKING:
    from datavine.worker.capped_child import CappedChild

STATUS_OK = "ok"
STATUS_ERROR = "error"
STATUS_MEMORY = "memory"
STATUS_LOAD = "load"  # the bundle could not be unpickled here (a module missing, mostly)
STATUS_INPUT = "input"  # an OSError while a file read through a shard was open: retry elsewhere
STATUS_TIME = "time"  # a task ran past its time limit and was stopped
STATUS_LOST = "lost"  # an input another bundle left on a worker did not arrive
DIRECT_SERVERS = ("local", "direct", "origin")
HARD_LIMIT_GRACE_S = 5.0  # a bundle's child is killed this long after its tasks' limits


class TaskTimeLimitExceeded(BaseException):
    """Raised inside a task that runs past its time limit (a BaseException, so that the
    task's own ``except Exception`` does not swallow it)."""


def library_started() -> None:
    """Run once in each library process as it starts (TaskVine's library context), before
    it serves calls: make the library the leader of its own process group.

    ``vine_worker`` moves a library into a group of its own from the parent side only
    (``setpgid(pid, 0)`` after ``fork``); when the child has already ``exec``-ed by then the
    call fails, the library stays in the worker's group, and the worker's kill
    (``kill(-pid, SIGKILL)``) reaches nothing: the worker then blocks in ``waitpid`` until
    the library ends on its own, holding its slots (seen as a run after a timeout waiting
    30 s for a worker, 1 time in 6 on 2 cores). Doing it from the child as well closes the
    race (the worker waits 3 s after a library's start before it kills it). This is right
    only because the library is the process the worker started: the runtime has the
    worker's ``sh -c`` exec it (:func:`datavine.manager.runtime.exec_command`); a library
    under a shell that did not exec keeps the shell's group."""
    with contextlib.suppress(OSError):  # a session leader may not move: it leads one already
        if os.getpgid(0) != os.getpid() and _started_by_worker():
            os.setpgid(0, 0)


def _started_by_worker() -> bool:
    """Was this process started by ``vine_worker`` itself (``exec``-ed in place of its
    ``sh -c``), rather than by a shell or wrapper that the worker's kill aims at?"""
    try:
        with open(f"/proc/{os.getppid()}/comm") as f:
            return f.read().strip() == "vine_worker"
    except OSError:
        return False


def run_bundle(payload: bytes, cap_mb: float | None = None,
               preload: tuple[str, ...] = (), limit_s: float | None = None) -> dict[str, Any]:
    """Run one bundle; the entry point registered in the TaskVine library.

    ``payload`` is the cloudpickled spec: ``nodes`` ([(key, node)] in execution order),
    ``inputs`` ({key: value}), ``outputs`` (keys to send back), ``categories`` ({key:
    category}) and ``shardmap`` (for :mod:`datavine.io.reading`). ``cap_mb``: the memory cap of
    the whole bundle, or None to run it here, in the library process. ``preload``: modules to
    import into the library first, so that the children it forks find them loaded.
    ``limit_s``: the sum of the bundle's task time limits (``spec["limits"]`` has each
    task's); a capped bundle's child is killed ``HARD_LIMIT_GRACE_S`` after it, should a task
    be stuck where Python's timer cannot interrupt it.
    Capped bundles run one after another in one long-lived child
    (:class:`datavine.worker.capped_child.CappedChild`), replaced when a bundle overruns its cap or
    crashes. The spec is unpickled where it runs, not by TaskVine, so that a task that cannot
    be loaded on this worker is reported instead of killing the library.
    """
    started = time.perf_counter()
    _preload(preload)
    if cap_mb:
        hard = None if limit_s is None else limit_s + HARD_LIMIT_GRACE_S
        capped = _capped_child().run(execute_payload, (payload, os.getcwd()), cap_mb=cap_mb,
                                     time_limit_s=hard)
        if capped.exceeded:
            result = _result(STATUS_MEMORY, message=f"exceeded its memory cap of {cap_mb:.0f} MB")
        elif capped.timed_out:
            result = _result(STATUS_TIME, key=None, limit_s=limit_s,
                             message=f"killed {HARD_LIMIT_GRACE_S:g} s after its time limits "
                                     f"({limit_s:g} s in all) ran out")
        elif capped.ok:
            result = capped.value
        elif capped.signal == signal.SIGKILL:  # not ours: the kernel's or the batch system's
            result = _result(STATUS_MEMORY, oom=True,
                             message="killed by SIGKILL below its cap of "
                                     f"{cap_mb:.0f} MB (an out-of-memory killer, most likely)")
        else:
            sig = f" (signal {capped.signal})" if capped.signal else ""
            result = _result(STATUS_ERROR, key=None, message=f"{capped.error}{sig}",
                             traceback=capped.traceback or "", crashed=True)
        result["peak_mb"] = capped.peak_mb
        result["cap_mb"] = cap_mb
        if result.get("status") != STATUS_OK:  # its retry gets a clean process: fresh caches
            _capped_child().close()
        _learn_shard_failures(result.get("reads", ()))
        if result.get("status") == STATUS_INPUT:  # a child's health dies with it
            shard_health().mark_failed(result["server"], time.monotonic())
    else:
        result = execute_payload(payload)
        result["peak_mb"] = _peak_rss_mb()
    return _stamp(result, started)


def execute_payload(payload: bytes, cwd: str | None = None) -> dict[str, Any]:
    """Unpickle a bundle's spec and execute it (see :func:`run_bundle`). ``cwd``: the call's
    sandbox, where its input and output files are (the capped child lives across calls)."""
    if cwd is not None:
        os.chdir(cwd)
    try:
        spec = cloudpickle.loads(payload)
    except BaseException as exc:
        return _result(STATUS_LOAD, message=f"{type(exc).__name__}: {exc}",
                       traceback=traceback.format_exc())
    return execute_bundle(spec)


_CHILD: CappedChild | None = None  # the library's capped child, made on the first capped bundle
_PRELOADED: set[str] = set()  # tried once each, imported or not


def _capped_child() -> CappedChild:
    global _CHILD
    if _CHILD is None:
        from datavine.worker.capped_child import CappedChild

        _CHILD = CappedChild()
    return _CHILD


def _stamp(result: dict[str, Any], started: float) -> dict[str, Any]:
    result["worker"], result["rack"] = labels.here()
    result["host"] = socket.gethostname()
    result["pid"] = os.getpid()
    result["wall_s"] = time.perf_counter() - started
    return result


def _preload(modules: Any) -> None:
    """Import the graph's modules here, once, so that forked children find them loaded."""
    for name in modules:
        if name in _PRELOADED:
            continue
        _PRELOADED.add(name)
        try:
            importlib.import_module(name)
        except Exception:  # the task itself reports what is missing
            continue


def _learn_shard_failures(reads: Any) -> None:
    """A shard that failed in a forked bundle cools down in this (the library) process too."""
    now = time.monotonic()
    for record in reads:
        for server, _ in record.get("errors", ()):
            if server != "origin":
                shard_health().mark_failed(server, now)


def execute_bundle(spec: dict[str, Any]) -> dict[str, Any]:
    """Execute the nodes in order; keep intermediates only until their last in-bundle use.

    Inputs come inline (``spec["inputs"]``) or as files that TaskVine put in the call's
    sandbox (``spec["input_files"]``: key -> file name: values other bundles left on their
    workers). Outputs named in ``spec["store"]`` are written to files there, which TaskVine
    keeps on this worker for the bundles that need them; those of at most
    ``spec["inline_max"]`` bytes also come back inline. Other outputs come back inline."""
    values: dict[Any, Any] = dict(spec["inputs"])
    for key, name in spec.get("input_files", {}).items():
        try:
            with open(name, "rb") as f:
                values[key] = cloudpickle.load(f)
        except (OSError, EOFError) as exc:  # TaskVine lost or did not deliver it
            return _result(STATUS_LOST, key=key, message=f"input {name} of {key!r} could not "
                           f"be read: {exc!r}")
    nodes = spec["nodes"]
    outputs = set(spec["outputs"])
    categories = spec.get("categories", {})
    limits = spec.get("limits", {})
    uses: dict[Any, int] = defaultdict(int)
    for _, node in nodes:
        for dep in node.dependencies:
            uses[dep] += 1
    timing: dict[str, list[float]] = {}
    with reading(spec.get("shardmap")) as ctx:
        result = _execute(nodes, values, outputs, categories, uses, timing, limits)
        if result["status"] == STATUS_OK:
            result = _pack(values, outputs, spec.get("store", {}), spec.get("inline_max", 0),
                           timing)
        result["reads"] = [dataclasses.asdict(r) for r in ctx.records()]
        shards = [opened[2] for opened in ctx.opened if opened[2] not in DIRECT_SERVERS]
    if result["status"] == STATUS_ERROR and result.get("os_error") and shards:
        result["status"] = STATUS_INPUT
        result["server"] = shards[-1]
        shard_health().mark_failed(shards[-1], time.monotonic())
    return result


def _execute(nodes: list[tuple[Any, Any]], values: dict[Any, Any], outputs: set[Any],
             categories: dict[Any, str], uses: dict[Any, int],
             timing: dict[str, list[float]], limits: dict[Any, float]) -> dict[str, Any]:
    for key, node in nodes:
        t0 = time.perf_counter()
        limit = limits.get(key)
        try:
            with time_limit(limit):
                values[key] = node(values)
        except TaskTimeLimitExceeded:
            return _result(STATUS_TIME, key=key, limit_s=limit,
                           message=f"ran past its time limit of {limit:g} s",
                           traceback=traceback.format_exc())
        except BaseException as exc:  # reported, never raised: the manager decides
            return _error_result(key, exc)
        cat = categories.get(key, "task")
        slot = timing.setdefault(cat, [0, 0.0])
        slot[0] += 1
        slot[1] += time.perf_counter() - t0
        for dep in node.dependencies:
            uses[dep] -= 1
            if uses[dep] == 0 and dep not in outputs:
                values.pop(dep, None)
    return _result(STATUS_OK)


def _pack(values: dict[Any, Any], outputs: set[Any], store: dict[Any, str], inline_max: int,
          timing: dict[str, list[float]]) -> dict[str, Any]:
    """The bundle's outputs: files for ``store`` (sizes in ``stored``), inline otherwise or
    when small."""
    out: dict[Any, bytes] = {}
    stored: dict[Any, int] = {}
    for key in outputs:
        try:
            blob = cloudpickle.dumps(values[key])
        except Exception as exc:
            return _error_result(key, TypeError(f"result of {key!r} cannot be serialised: {exc}"))
        name = store.get(key)
        if name is not None:
            with open(name, "wb") as f:
                f.write(blob)
            stored[key] = len(blob)
        if name is None or len(blob) <= inline_max:
            out[key] = blob
    return _result(STATUS_OK, values=out, stored=stored, timing=timing)


@contextlib.contextmanager
def time_limit(seconds: float | None) -> Any:
    """Raise :class:`TaskTimeLimitExceeded` in the block after ``seconds`` (a real-time
    timer: it interrupts Python code and sleeps, not a C call that never returns; capped
    bundles have the child's hard limit for that). Main thread only; None: no limit."""
    if seconds is None or threading.current_thread() is not threading.main_thread():
        yield
        return

    def expired(signum: int, frame: Any) -> None:
        raise TaskTimeLimitExceeded(seconds)

    previous = signal.signal(signal.SIGALRM, expired)
    signal.setitimer(signal.ITIMER_REAL, seconds)
    try:
        yield
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, previous)


def _error_result(key: Any, exc: BaseException) -> dict[str, Any]:
    tb = "".join(traceback.format_exception(type(exc), exc, exc.__traceback__))
    try:
        pickled = cloudpickle.dumps(exc)
    except Exception:
        pickled = None
    return _result(STATUS_ERROR, key=key, exception=pickled, message=repr(exc), traceback=tb,
                   os_error=is_input_error(exc))


def _result(status: str, **fields: Any) -> dict[str, Any]:
    return {"status": status, **fields}


def _peak_rss_mb() -> float:
    import resource

    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024.0
