"""Worker side: the function the persistent TaskVine library runs for each bundle.

A bundle is a topologically ordered list of dask task-spec nodes plus the values of the
keys it needs from outside. It runs in the library process itself (TaskVine's 'direct'
mode: no fork per call, no 5 s reaping stall), or under a memory cap in a long-lived child
that the library forks (:mod:`datavine.worker.capped_child`).
The function never raises: it returns a :class:`datavine.protocol.BundleResult` (encoded:
the wire is :mod:`datavine.protocol`) that says what happened, so a failure names the dask
key and carries the remote traceback back to the manager.

This module is imported on workers: keep its imports light.
"""

from __future__ import annotations

import contextlib
import dataclasses
import functools
import importlib
import inspect
import os
import signal
import socket
import threading
import time
import traceback
from collections import defaultdict
from collections.abc import Collection, Iterable
from typing import TYPE_CHECKING, Protocol, cast

import cloudpickle

from datavine.io import column_cache, open_files
from datavine.io.reading import is_input_error, reading, shard_health
from datavine.protocol import BundleResult, BundleSpec, Key, ProtocolError, ReadRecordDict, Status
from datavine.scheduler import labels
from datavine.worker import memcap, prefetch, value_file
from datavine.worker import payload as payload_codec
from datavine.worker.alarm import alarm

if TYPE_CHECKING:
    from datavine.io.shards import ShardMap
    from datavine.worker.capped_child import CappedChild

DIRECT_SERVERS = ("local", "direct", "origin")
HARD_LIMIT_GRACE_S = 5.0  # a bundle's child is killed this long after its tasks' limits


class TaskNode(Protocol):
    """What a bundle's worker uses of a dask task-spec node (``dask._task_spec.GraphNode``):
    the keys it depends on, and calling it with the values computed so far."""

    @property
    def dependencies(self) -> Collection[Key]: ...

    def __call__(self, values: dict[Key, object], /) -> object: ...


class TaskTimeLimitExceeded(BaseException):
    """Raised inside a task that runs past its time limit (a BaseException, so that the
    task's own ``except Exception`` does not swallow it)."""


def library_started() -> dict[str, object]:
    """Run once in each library process as it starts (TaskVine's library context), before
    it serves calls: make the library the leader of its own process group. Returns the
    hook a library with patch 0018 calls as each call arrives
    (:func:`call_queued`; another poncho keeps it unused).

    ``vine_worker`` moves a library into a group of its own from the parent side only
    (``setpgid(pid, 0)`` after ``fork``); when the child has already ``exec``-ed by then the
    call fails, the library stays in the worker's group, and the worker's kill
    (``kill(-pid, SIGKILL)``) reaches nothing: the worker then blocks in ``waitpid`` until
    the library ends on its own, holding its slots (seen as a run after a timeout waiting
    30 s for a worker, 1 time in 6 on 2 cores). Doing it from the child as well closes the
    race (the worker waits 3 s after a library's start before it kills it), once the
    library's Python runs: at a load of ~100 a library was killed before that (TaskVine
    patch 0029 makes the group in the worker's child before it execs, and kills the process
    itself when its group is missing; this stays for a stock TaskVine). This is right
    only because the library is the process the worker started: the runtime has the
    worker's ``sh -c`` exec it (:func:`datavine.manager.runtime.exec_command`); a library
    under a shell that did not exec keeps the shell's group."""
    with contextlib.suppress(OSError):  # a session leader may not move: it leads one already
        if os.getpgid(0) != os.getpid() and _started_by_worker():
            os.setpgid(0, 0)
    return {"vine_call_queued": call_queued}


def _started_by_worker() -> bool:
    """Was this process started by ``vine_worker`` itself (``exec``-ed in place of its
    ``sh -c``), rather than by a shell or wrapper that the worker's kill aims at?"""
    try:
        with open(f"/proc/{os.getppid()}/comm") as f:
            return f.read().strip() == "vine_worker"
    except OSError:
        return False


def run_bundle(payload: bytes, cap_mb: float | None = None,
               preload: tuple[str, ...] = (), limit_s: float | None = None,
               reply_file: str | None = None) -> dict[str, object]:
    """Run one bundle; the entry point registered in the TaskVine library. Writes the
    encoded :class:`datavine.protocol.BundleResult` to ``reply_file`` when one is named (the
    call's standard output, which the worker sends to the manager: :func:`reply`) and
    returns :data:`REPLIED`; without one, returns the encoded result. (The library pickles
    what the function returns into the call's output file, which the manager never fetches:
    the result written there too cost a second pickle and write of it, for a large result
    its size again on the worker's disk.)

    ``payload`` is the pickled, encoded :class:`datavine.protocol.BundleSpec`
    (:mod:`datavine.worker.payload`).
    ``cap_mb``: the memory cap of the whole bundle, or None to run it here, in the library
    process. ``preload``: modules to import into the library first, so that the children it
    forks find them loaded. ``limit_s``: the sum of the bundle's task time limits (the
    spec's ``limits`` has each task's); a capped bundle's child is killed
    ``HARD_LIMIT_GRACE_S`` after it, should a task be stuck where Python's timer cannot
    interrupt it.
    Capped bundles run one after another in one long-lived child
    (:class:`datavine.worker.capped_child.CappedChild`), replaced when a bundle overruns its cap or
    crashes. The spec is unpickled where it runs, not by TaskVine, so that a task that cannot
    be loaded on this worker is reported instead of killing the library.
    """
    started = time.perf_counter()
    _preload(preload)
    if cap_mb:
        sandbox = os.getcwd()
        capped = _capped_child().run(execute_payload, (payload, sandbox), cap_mb=cap_mb,
                                     time_limit_s=_hard_limit(limit_s), sandbox=sandbox)
        result: BundleResult
        if capped.cancelled:  # nobody reads this: the worker dropped the call
            result = BundleResult(Status.ERROR, message="cancelled while it ran")
        elif capped.exceeded:
            result = BundleResult(Status.MEMORY,
                                  message=f"exceeded its memory cap of {cap_mb:.0f} MB")
        elif capped.timed_out:
            result = BundleResult(Status.TIME, limit_s=limit_s,
                                  message=f"killed {HARD_LIMIT_GRACE_S:g} s after its time "
                                          f"limits ({limit_s:g} s in all) ran out")
        elif capped.ok:
            result = cast(BundleResult, capped.value)  # execute_payload's
        elif capped.signal == signal.SIGKILL:  # not ours: the kernel's or the batch system's
            result = BundleResult(Status.MEMORY, oom=True,
                                  message="killed by SIGKILL below its cap of "
                                          f"{cap_mb:.0f} MB (an out-of-memory killer, most "
                                          "likely)")
        else:
            sig = f" (signal {capped.signal})" if capped.signal else ""
            result = BundleResult(Status.ERROR, message=f"{capped.error}{sig}",
                                  traceback=capped.traceback or "", crashed=True)
        peak_mb: float = capped.peak_mb
        if not result.ok:  # its retry gets a clean process: fresh caches (and the call
            _capped_child().close()  # sent ahead to this one starts again there)
        _learn_shard_failures(result.reads)
        if result.status is Status.INPUT and result.server:  # a child's health dies with it
            shard_health().mark_failed(result.server, time.monotonic())
    else:
        result = execute_payload(payload)
        peak_mb = memcap.peak_rss_kb() / 1024.0
    record = reply(_stamp(result, started, peak_mb, cap_mb or None).encode(), reply_file)
    return record if reply_file is None else dict(REPLIED)


_RUN_BUNDLE = inspect.signature(run_bundle)  # how a queued call's arguments bind (_bundle_call)

# what run_bundle returns (a copy of) once the result went as the call's reply
REPLIED: dict[str, object] = {"replied": True}


def reply(record: dict[str, object], reply_file: str | None) -> dict[str, object]:
    """Write a call's encoded result to ``reply_file`` in the call's sandbox (none: nothing),
    as :func:`datavine.worker.payload.reply_bytes`; one over TaskVine's limit becomes an error
    that says so. Returns ``record``. A sandbox that is gone (the call was cancelled) is
    left so: nobody waits for that result."""
    if reply_file is None:
        return record
    data = payload_codec.reply_bytes(record)
    if len(data) > payload_codec.REPLY_MAX:
        data = payload_codec.reply_bytes(dataclasses.replace(
            BundleResult.decode(record), status=Status.ERROR, values={}, stored={},
            message=f"the bundle's results take {len(data) / 2**20:,.0f} MiB as a reply, "
                    f"over TaskVine's {payload_codec.REPLY_MAX / 2**20:,.0f} MiB: keep large "
                    "values on workers (RunConfig.keep_on_workers) or make them "
                    "smaller").encode())
    with contextlib.suppress(OSError), open(reply_file, "wb") as f:
        f.write(data)
    return record


def execute_payload(payload: bytes, cwd: str | None = None) -> BundleResult:
    """Unpickle a bundle's spec, check it and execute it (see :func:`run_bundle`). ``cwd``:
    the call's sandbox, where its input and output files are (the capped child lives across
    calls)."""
    if cwd is not None:
        os.chdir(cwd)
    try:
        data = payload_codec.decode(payload)
    except BaseException as exc:
        return BundleResult(Status.LOAD, message=f"{type(exc).__name__}: {exc}",
                            traceback=traceback.format_exc())
    try:
        spec = BundleSpec.decode(data)
    except ProtocolError as exc:
        return BundleResult(Status.PROTOCOL, message=str(exc))
    with prefetch.bundle(cwd, spec.prefetch_mb):  # reads ahead of it are taken, and dropped
        return execute_bundle(spec)


# the library's capped child: made by its first call or the first hint (call_queued's thread),
# its process forked by the first capped bundle
_CHILD: CappedChild | None = None
_CHILD_LOCK = threading.Lock()
_PRELOADED: set[str] = set()  # tried once each, imported or not


def _capped_child() -> CappedChild:
    global _CHILD
    with _CHILD_LOCK:
        if _CHILD is None:
            from datavine.worker.capped_child import CappedChild

            _CHILD = CappedChild(hint_handler=prefetch.on_hint, make_room=make_room)
        return _CHILD


def make_room(limit_mb: float) -> int:
    """What a capped child runs before a call whose cap it idles too close to: the input
    files it keeps open closed (a tree's metadata: ~15 MB for CMS NanoAOD's), then the
    column cache's room made (:func:`datavine.io.column_cache.make_room`: the bytes it
    evicted)."""
    open_files.files().close()
    return column_cache.make_room(limit_mb)


def call_queued(function_id: int, function_name: str, sandbox: str) -> None:
    """poncho's ``vine_call_queued`` hook (patch 0018), on a thread of the library: a call
    arrived in its pipe. A bundle's sandbox goes to the capped child, which reads ahead for
    it (:mod:`datavine.worker.prefetch`; an uncapped bundle runs here and is not). The
    library's first calls arrive together, before a child process exists: the capped child
    keeps their hints for the process the first call starts. A capped bundle is also pickled
    for the child now (:meth:`CappedChild.queue`), to be sent to it the moment the call
    before it returns (:meth:`CappedChild.send_ahead`)."""
    if function_name != "run_bundle":
        return
    child = _capped_child()
    child.hint(sandbox.encode())
    call = _bundle_call(payload_codec.call_arguments(sandbox))
    if call is not None and call[1]:
        payload, cap_mb, limit_s = call
        child.queue(execute_payload, (payload, sandbox), cap_mb=cap_mb,
                    time_limit_s=_hard_limit(limit_s), sandbox=sandbox)


def _bundle_call(arguments: tuple[tuple[object, ...], dict[str, object]] | None,
                 ) -> tuple[bytes, float | None, float | None] | None:
    """(payload, cap_mb, limit_s) of a :func:`run_bundle` call's arguments, bound as
    :func:`run_bundle` takes them (None: none, or not a bundle call's)."""
    if arguments is None:
        return None
    try:
        bound = _RUN_BUNDLE.bind(*arguments[0], **arguments[1])
    except TypeError:
        return None
    bound.apply_defaults()
    given = bound.arguments
    payload, cap_mb, limit_s = given["payload"], given["cap_mb"], given["limit_s"]
    if not isinstance(payload, bytes):
        return None
    return payload, cast("float | None", cap_mb), cast("float | None", limit_s)


def _hard_limit(limit_s: float | None) -> float | None:
    """When a capped bundle's child is killed: ``HARD_LIMIT_GRACE_S`` after its tasks'
    limits (None: never)."""
    return None if limit_s is None else limit_s + HARD_LIMIT_GRACE_S


def _stamp(result: BundleResult, started: float, peak_mb: float,
           cap_mb: float | None) -> BundleResult:
    """Where, how long and how much: the worker's name and rack, its host, the library's
    PID, the bundle's memory peak and the cap it ran under (one replace of the record: it is
    made for every bundle)."""
    worker, rack = labels.here()
    return dataclasses.replace(result, worker=worker, rack=rack, host=socket.gethostname(),
                               pid=os.getpid(), wall_s=time.perf_counter() - started,
                               peak_mb=peak_mb, cap_mb=cap_mb)


def _preload(modules: Iterable[str]) -> None:
    """Import the graph's modules here, once, so that forked children find them loaded."""
    for name in modules:
        if name in _PRELOADED:
            continue
        _PRELOADED.add(name)
        try:
            importlib.import_module(name)
        except Exception:  # the task itself reports what is missing
            continue


def _learn_shard_failures(reads: list[ReadRecordDict]) -> None:
    """A shard that failed in a forked bundle cools down in this (the library) process too."""
    now = time.monotonic()
    for record in reads:
        for server, _ in record.get("errors", ()):
            if server != "origin":
                shard_health().mark_failed(server, now)


def execute_bundle(spec: BundleSpec) -> BundleResult:
    """Execute the nodes in order; keep intermediates only until their last in-bundle use.

    Inputs come inline (``spec.inputs``) or as files that TaskVine put in the call's
    sandbox (``spec.input_files``: key -> file name: values other bundles left on their
    workers; a file holds the values one bundle kept, by key: :mod:`datavine.worker.value_file`,
    mapped, not copied). Outputs named in ``spec.store`` over ``spec.inline_max`` bytes are
    written to the bundle's file there, which TaskVine keeps on this worker for the bundles
    that need them; other outputs come back inline."""
    values: dict[Key, object] = dict(spec.inputs)
    lost = _read_input_files(spec.input_files, values)
    if lost is not None:
        return lost
    outputs = set(spec.outputs)
    uses: dict[Key, int] = defaultdict(int)
    for _, node in spec.nodes:
        for dep in node.dependencies:
            uses[dep] += 1
    timing: dict[str, list[float]] = {}
    with reading(cast("ShardMap | None", spec.shardmap), spec.avoid, spec.cache_mb,
                 spec.cache_epoch, spec.cache_rss_mb, spec.input_cache_mb) as ctx:
        held = column_cache.cache().bytes  # before the bundle: its peak holds it too
        result = _execute(spec.nodes, values, outputs, spec.categories, uses, timing,
                          spec.limits)
        reads = [r.as_dict() for r in ctx.records()]
        cache_mb = held / column_cache.MB
        # a bundle that ran is packed with its reads: its record made once (a frozen
        # record's replace, twice per bundle, was ~10% of the time between two bundles)
        if result.ok:
            result = _pack(values, outputs, spec.store, spec.inline_max, timing, reads,
                           cache_mb)
        if not result.ok:  # a task failed, or an output did not serialise
            result = dataclasses.replace(result, reads=reads, cache_mb=cache_mb)
        shards = [opened[2] for opened in ctx.opened if opened[2] not in DIRECT_SERVERS]
    if result.status is Status.ERROR and result.os_error and shards:
        result = dataclasses.replace(result, status=Status.INPUT, server=shards[-1])
        shard_health().mark_failed(shards[-1], time.monotonic())
    return result


def _execute(nodes: list[tuple[Key, TaskNode]], values: dict[Key, object], outputs: set[Key],
             categories: dict[Key, str], uses: dict[Key, int],
             timing: dict[str, list[float]], limits: dict[Key, float]) -> BundleResult:
    for key, node in nodes:
        t0 = time.perf_counter()
        limit = limits.get(key)
        try:
            with alarm(limit, functools.partial(TaskTimeLimitExceeded, limit)):
                values[key] = node(values)
        except TaskTimeLimitExceeded:
            return BundleResult(Status.TIME, key=key, limit_s=limit,
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
    return BundleResult(Status.OK)


def _read_input_files(input_files: dict[Key, str], values: dict[Key, object],
                      ) -> BundleResult | None:
    """Take the values other bundles left on workers from the files TaskVine put in the
    sandbox (key -> file name; one file per bundle that kept them, mapped once) into
    ``values``; a LOST result naming the first that could not be read, else None."""
    opened: dict[str, value_file.ValueFile] = {}
    for key, name in input_files.items():
        try:
            if name not in opened:
                opened[name] = value_file.ValueFile.open(name)
            values[key] = opened[name].load(key)
        except (OSError, EOFError, KeyError, value_file.ValueFileError) as exc:
            # TaskVine lost the file, or did not deliver it whole
            return BundleResult(Status.LOST, key=key, message=f"input {name} of {key!r} could "
                                f"not be read: {exc!r}")
    return None


def _pack(values: dict[Key, object], outputs: set[Key], store: dict[Key, str], inline_max: int,
          timing: dict[str, list[float]], reads: list[ReadRecordDict] | None = None,
          cache_mb: float = 0.0) -> BundleResult:
    """The bundle's outputs: inline when not in ``store`` or at most ``inline_max`` bytes;
    the others in the file ``store`` names (one :mod:`datavine.worker.value_file` for the
    bundle, written even when it holds nothing, since TaskVine expects it), their sizes in
    ``stored``. A value bound for the file is pickled once, its arrays' memory written
    straight to the file; one that turns out small goes inline as that pickle when it has no
    buffer out of band, else pickled again, in band. ``reads`` and ``cache_mb`` go into the
    record as they are."""
    out: dict[Key, bytes] = {}
    stored: dict[Key, int] = {}
    files: dict[str, dict[Key, value_file.Pickled]] = {name: {} for name in store.values()}
    for key in outputs:
        name = store.get(key)
        try:
            kept = value_file.pickled(values[key]) if name is not None else None
            if kept is not None and kept.nbytes <= inline_max and not kept.buffers:
                out[key] = kept.stream
            elif name is None or kept is None or kept.nbytes <= inline_max:
                out[key] = payload_codec.dumps(values[key])
            else:
                files[name][key] = kept
                stored[key] = kept.nbytes
        except Exception as exc:
            return _error_result(key, TypeError(f"result of {key!r} cannot be serialised: {exc}"))
    for name, kept_values in files.items():
        value_file.write_values(name, kept_values)
    return BundleResult(Status.OK, values=out, stored=stored,
                        timing={c: (int(n), s) for c, (n, s) in timing.items()},
                        reads=reads if reads is not None else [], cache_mb=cache_mb)


def _error_result(key: Key, exc: BaseException) -> BundleResult:
    tb = "".join(traceback.format_exception(type(exc), exc, exc.__traceback__))
    try:
        pickled = cloudpickle.dumps(exc)
    except Exception:
        pickled = None
    return BundleResult(Status.ERROR, key=key, exception=pickled, message=repr(exc),
                        traceback=tb, os_error=is_input_error(exc))

