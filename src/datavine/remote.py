"""Worker side: the function the persistent TaskVine library runs for each bundle.

A bundle is a topologically ordered list of dask task-spec nodes plus the values of the
keys it needs from outside. It runs in the library process itself (TaskVine's 'direct'
mode: no fork per call, no 5 s reaping stall), or in a forked child under a memory cap.
The function never raises: it returns a plain dict that says what happened, so a failure
names the dask key and carries the remote traceback back to the manager.

This module is imported on workers: keep its imports light.
"""

from __future__ import annotations

import os
import socket
import time
import traceback
from collections import defaultdict
from typing import Any

import cloudpickle

STATUS_OK = "ok"
STATUS_ERROR = "error"
STATUS_MEMORY = "memory"


def run_bundle(spec: dict[str, Any]) -> dict[str, Any]:
    """Run one bundle; the entry point registered in the TaskVine library.

    ``spec`` holds ``nodes`` ([(key, node)] in execution order), ``inputs`` ({key: value}),
    ``outputs`` (keys to send back), ``categories`` ({key: category}) and ``cap_mb``
    (memory cap for the whole bundle, or None).
    """
    started = time.perf_counter()
    cap_mb = spec.get("cap_mb")
    if cap_mb:
        from datavine.memcap import run_capped

        capped = run_capped(execute_bundle, (spec,), cap_mb=cap_mb)
        if capped.exceeded:
            result = _result(STATUS_MEMORY, message=f"exceeded its memory cap of {cap_mb:.0f} MB")
        elif capped.ok:
            result = capped.value
        else:
            result = _result(
                STATUS_ERROR,
                key=None,
                message=str(capped.error),
                traceback=capped.traceback or "",
            )
        result["peak_mb"] = capped.peak_mb
        result["cap_mb"] = cap_mb
    else:
        result = execute_bundle(spec)
        result["peak_mb"] = _peak_rss_mb()
    result["host"] = socket.gethostname()
    result["pid"] = os.getpid()
    result["wall_s"] = time.perf_counter() - started
    return result


def execute_bundle(spec: dict[str, Any]) -> dict[str, Any]:
    """Execute the nodes in order; keep intermediates only until their last in-bundle use."""
    values: dict[Any, Any] = dict(spec["inputs"])
    nodes = spec["nodes"]
    outputs = set(spec["outputs"])
    categories = spec.get("categories", {})
    uses: dict[Any, int] = defaultdict(int)
    for _, node in nodes:
        for dep in node.dependencies:
            uses[dep] += 1
    timing: dict[str, list[float]] = {}
    for key, node in nodes:
        t0 = time.perf_counter()
        try:
            values[key] = node(values)
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
    out: dict[Any, bytes] = {}
    for key in outputs:
        try:
            out[key] = cloudpickle.dumps(values[key])
        except Exception as exc:
            return _error_result(key, TypeError(f"result of {key!r} cannot be serialised: {exc}"))
    return _result(STATUS_OK, values=out, timing=timing)


def _error_result(key: Any, exc: BaseException) -> dict[str, Any]:
    tb = "".join(traceback.format_exception(type(exc), exc, exc.__traceback__))
    try:
        pickled = cloudpickle.dumps(exc)
    except Exception:
        pickled = None
    return _result(STATUS_ERROR, key=key, exception=pickled, message=repr(exc), traceback=tb)


def _result(status: str, **fields: Any) -> dict[str, Any]:
    return {"status": status, **fields}


def _peak_rss_mb() -> float:
    import resource

    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024.0
