"""Worker side: run one call in a forked child under a memory cap, and measure its peak.

In the persistent TaskVine library ('direct' mode: the library process itself calls
``remote.run_bundle``) one call that grows without bound would take the library down, so
the call runs in a child made by ``os.fork()``. The parent drains the child's result pipe
(results of any size cannot deadlock), polls the RSS of the child's process group every
``poll_s`` and SIGKILLs the group once it is over the cap. Peak = max(polled maximum, the
child's ``ru_maxrss`` from ``os.wait4``). The child starts with the library's anonymous
pages (``baseline_mb``): a cap reads "the process would show this RSS", as ``ps`` and
TaskVine's resource monitor count it. A call that passes its cap and ends between two polls
keeps its result; ``peak_mb > cap_mb`` tells, and :mod:`datavine.scheduler.memory` learns from it.

:func:`run_capped` forks a child per call; the library keeps one child for many calls
(:mod:`datavine.worker.capped_child`), which shares the watching, the frame protocol (one frame per
call, child to parent) and the child's first steps defined here.

Fork safety (only the forking thread survives in the child):
* No other thread may hold a lock at the fork (it would stay locked in the child): run the
  library with ``OPENBLAS_NUM_THREADS=1 OMP_NUM_THREADS=1`` (``library.LIBRARY_ENV``).
  Python resets its own locks (GIL, imports, logging) in the child.
* The child computes and writes its pipe only, never the parent's connections (TaskVine's
  pipes to the worker, sockets opened in the library). It dies with the thread that forked
  it (``PR_SET_PDEATHSIG``): fork from the library's main thread. The library's SIGCHLD
  handler is reset in the child (in the parent it sees our child exit: harmless).
* ``gc.freeze()`` around the fork keeps the child's collections off the library's objects
  (a full collection would otherwise copy most of the library's heap: 100s of ms).
Imported on workers: keep the imports light.
"""

from __future__ import annotations

import contextlib
import fcntl
import gc
import os
import resource
import select
import signal
import struct
import sys
import time
import traceback
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from typing import Literal, NoReturn, TypeVar

import cloudpickle

from datavine.errors import DatavineError

_PAGE_KB = os.sysconf("SC_PAGE_SIZE") // 1024
# One frame per call, child to parent: kind (value or exception), flags, the child's own peak
# RSS in kB during the call (0: not measured), traceback bytes, pickle bytes.
FRAME = struct.Struct("!BBQQQ")
_VALUE, _EXCEPTION = 0, 1
LEFT_BEHIND = 1  # flag: the call left processes running (a long-lived child is replaced)
_PIPE_BYTES = 1 << 20  # fewer wake-ups for large results; capped by /proc/sys/fs/pipe-max-size
_F_SETPIPE_SZ = getattr(fcntl, "F_SETPIPE_SZ", 1031)
_GONE = os.WEXITED | os.WNOHANG | os.WNOWAIT  # has it exited? (it stays a zombie)
# whether the kernel lists each thread's children (CONFIG_PROC_CHILDREN): the group's RSS is
# then read from the watched child's descendants, not from a scan of every process
_CHILDREN_LISTED = os.path.exists(f"/proc/self/task/{os.getpid()}/children")
T = TypeVar("T")
# libc prctl, loaded in the parent so that the child does not pay for it (False: none there)
_prctl: Callable[..., int] | Literal[False] | None = None


class ChildFailedError(DatavineError):
    """The forked call ended without a usable result (signal, exit, unpicklable data)."""


@dataclass(frozen=True)
class CappedResult:
    """How one forked call ended. ``ok``: ``value`` is its return value; else ``error`` is its
    exception (re-created here) or a :class:`ChildFailedError`, with the child's formatted
    ``traceback``. ``exceeded``: killed for going over ``cap_mb``. Sizes in MB (2**20 B);
    ``baseline_mb``: the library's RSS at the fork; ``signal``: what ended the child."""

    ok: bool
    value: object  # fn's return value (unpickled: the caller knows its type)
    error: BaseException | None
    traceback: str | None
    peak_mb: float
    exceeded: bool
    cap_mb: float | None
    wall_s: float
    baseline_mb: float = 0.0
    signal: int | None = None
    timed_out: bool = False
    cancelled: bool = False  # stopped because the call was cancelled (Watch.gone)


def run_capped(fn: Callable[..., object], args: tuple[object, ...] = (),
               kwargs: Mapping[str, object] | None = None, *, cap_mb: float | None,
               poll_s: float = 0.02, scan_every_s: float = 0.25,
               time_limit_s: float | None = None) -> CappedResult:
    """Run ``fn(*args, **kwargs)`` in a forked child, killed once over ``cap_mb`` MB.

    ``cap_mb=None`` only measures. The child's RSS is read every ``poll_s``; the rest of its
    process group (its descendants, :func:`descendants`) every ``scan_every_s``, or more
    rarely when that is slow (keeping it under ~5% of a core). A call still running after
    ``time_limit_s`` is killed too. Never raises for what happens in the child; an exception
    in the parent (KeyboardInterrupt) kills the child and propagates."""
    prepare_fork()
    started = time.perf_counter()
    parent = os.getpid()
    baseline_kb = statm_kb(f"/proc/{parent}/statm")
    r, w = os.pipe()  # not inheritable: exec'd grandchildren do not keep it open
    with contextlib.suppress(OSError):
        set_pipe_size(w)
    gc.freeze()  # the child's collections then skip the library's objects: no mass COW copy
    pid = os.fork()
    if pid == 0:
        os.close(r)
        _child(fn, args, kwargs or {}, w, parent)
    gc.unfreeze()
    os.close(w)
    with contextlib.suppress(OSError):
        os.setpgid(pid, pid)  # the child does the same: whoever runs first makes the group
    watch = Watch(pid, cap_mb, scan_every_s, time_limit_s)
    try:
        frame = collect(r, watch, poll_s)
    except BaseException:
        kill_group(pid)
        raise
    finally:
        os.close(r)
        status, maxrss_kb = reap(pid)
    return capped_result(frame, status, watch, max(watch.peak_kb, maxrss_kb), started,
                         baseline_kb)


def capped_result(frame: bytearray, status: int, watch: Watch, peak_kb: float,
                  started: float, baseline_kb: float) -> CappedResult:
    """How a watched call ended: killed over its cap or past its time limit, or as its frame
    (else its wait ``status``) tells. ``started``: ``time.perf_counter()`` when it began."""
    peak_mb = peak_kb / 1024.0
    if watch.exceeded:
        outcome = failed(f"killed after exceeding its memory cap: {peak_mb:.0f} MB > "
                         f"{watch.cap_mb:.0f} MB")
    elif watch.timed_out:
        outcome = failed(f"killed after running past its time limit of {watch.time_limit_s:g} s")
    elif watch.cancelled:
        outcome = failed("stopped: the call was cancelled (its sandbox is gone)")
    else:
        outcome = decode(frame, status)
    return CappedResult(*outcome, peak_mb=peak_mb, exceeded=watch.exceeded, cap_mb=watch.cap_mb,
                        wall_s=time.perf_counter() - started, baseline_mb=baseline_kb / 1024.0,
                        signal=os.WTERMSIG(status) if os.WIFSIGNALED(status) else None,
                        timed_out=watch.timed_out, cancelled=watch.cancelled)


def measure_peak(fn: Callable[..., T], args: tuple[object, ...] = (),
                 kwargs: Mapping[str, object] | None = None) -> tuple[T, float]:
    """Run ``fn`` here (no fork): its value and this process's peak RSS (MB) during the call.
    The peak mark is reset first (``/proc/self/clear_refs``); where that is refused, the
    lifetime peak is returned, an upper bound. Exceptions of ``fn`` propagate."""
    reset_peak()
    value = fn(*args, **(kwargs or {}))
    return value, peak_rss_kb() / 1024.0


def peak_rss_kb() -> int:
    """This process's peak RSS (kB) since its mark was last reset (:func:`reset_peak`):
    ``ru_maxrss`` follows VmHWM in a process that did not exec since it forked, ~1 us
    against ~20-60 us for reading VmHWM from ``/proc/self/status`` (the capped child's path
    between two calls)."""
    return int(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss)


def reset_peak() -> None:
    """Reset this process's peak RSS mark (VmHWM, which ru_maxrss follows) to its current RSS,
    where the kernel allows it."""
    with contextlib.suppress(OSError), open("/proc/self/clear_refs", "w") as f:
        f.write("5")


def prepare_fork() -> None:
    """Before a fork: load libc's prctl here (the child would pay for it), flush stdio (or the
    child would write the parent's buffered output a second time)."""
    global _prctl
    if _prctl is None:
        libc = __import__("ctypes").CDLL(None)
        _prctl = libc.prctl if hasattr(libc, "prctl") else False
    flush_stdio()


def set_pipe_size(fd: int) -> None:
    """Larger pipe buffers: fewer wake-ups for large results (OSError where refused)."""
    fcntl.fcntl(fd, _F_SETPIPE_SZ, _PIPE_BYTES)


def exited(pid: int) -> bool:
    """Whether our child ``pid`` has exited (it stays a zombie until reaped)."""
    try:
        return os.waitid(os.P_PID, pid, _GONE) is not None
    except ChildProcessError:
        return True


# --- parent side ------------------------------------------------------------------------------
class Watch:
    """RSS of the child's process group: the child every poll, the others every scan; and
    the call's time, against ``time_limit_s`` (None: unlimited)."""

    def __init__(self, pid: int, cap_mb: float | None, scan_every_s: float,
                 time_limit_s: float | None = None, sandbox: str | None = None) -> None:
        self.pid = pid
        self.sandbox = sandbox  # the call's folder: the worker removes it when it cancels
        self.cancelled = False
        self.cap_mb = cap_mb
        self.cap_kb = None if cap_mb is None else cap_mb * 1024.0
        self.scan_every_s = scan_every_s
        self.next_scan = time.monotonic() + scan_every_s
        self.others_kb = self.peak_kb = 0
        self.exceeded = False
        self.time_limit_s = time_limit_s
        self.deadline = None if time_limit_s is None else time.monotonic() + time_limit_s
        self.timed_out = False
        self.parent = os.getppid()  # in a worker's library: the vine_worker

    def over_time(self) -> bool:
        self.timed_out = self.deadline is not None and time.monotonic() > self.deadline
        return self.timed_out

    def gone(self) -> bool:
        """Whether the call was cancelled: the worker removed its sandbox (TaskVine cannot
        stop a call inside its library; a stat every poll is the cheapest way to learn it)."""
        self.cancelled = self.sandbox is not None and not os.path.isdir(self.sandbox)
        return self.cancelled

    def orphaned(self) -> bool:
        """Whether this (the watching) process lost its parent: for a library, its worker
        died, and nobody will ever read the call's result."""
        return os.getppid() != self.parent

    def over_cap(self) -> bool:
        own = statm_kb(f"/proc/{self.pid}/statm")
        now = time.monotonic()
        if now >= self.next_scan:
            self.others_kb = _group_rss_kb(self.pid)
            self.next_scan = now + max(self.scan_every_s, 20 * (time.monotonic() - now))
        total = own + self.others_kb
        self.peak_kb = max(self.peak_kb, total)
        self.exceeded = self.cap_kb is not None and total > self.cap_kb
        return self.exceeded


def collect(r: int, watch: Watch, poll_s: float) -> bytearray:
    """Read the child's frame (into a buffer of its size) while checking its memory every
    ``poll_s``. Returns what arrived: empty when the child was killed for its memory."""
    frame, pos = bytearray(), 0
    poller = select.poll()
    poller.register(r, select.POLLIN)
    next_check = time.monotonic() + poll_s
    while True:
        if poller.poll(max(0.0, next_check - time.monotonic()) * 1000.0):
            if not frame:  # the header: written at once, and pipes keep small writes whole
                head = os.read(r, FRAME.size)
                if len(head) < FRAME.size:
                    return frame
                *_, tb_len, blob_len = FRAME.unpack(head)
                frame = bytearray(FRAME.size + tb_len + blob_len)
                frame[:FRAME.size], got = head, FRAME.size
            else:
                got = os.readv(r, [memoryview(frame)[pos:]])
            pos += got
            if pos == len(frame):
                return frame
            if not got:  # EOF: the child ended or died before its frame was whole
                return frame[:pos]
        if time.monotonic() >= next_check:
            next_check = time.monotonic() + poll_s
            if watch.over_cap() or watch.over_time() or watch.gone():
                kill_group(watch.pid)
                return bytearray()
            if watch.orphaned():  # the library's worker died: end the call and the library
                kill_group(watch.pid)
                os._exit(0)
            if not poller.poll(0) and os.waitid(os.P_PID, watch.pid, _GONE) is not None:
                return frame[:pos]  # it is gone and a forked descendant holds the pipe


Outcome = tuple[bool, object, BaseException | None, str | None]  # ok, value, error, traceback


def frame_complete(frame: bytearray) -> bool:
    """Whether ``frame`` holds a whole frame (header and both parts)."""
    if len(frame) < FRAME.size:
        return False
    *_, tb_len, blob_len = FRAME.unpack_from(frame)
    return len(frame) == FRAME.size + int(tb_len) + int(blob_len)


def frame_header(frame: bytearray) -> tuple[int, int]:
    """(flags, the child's peak RSS in kB) of a whole frame; (0, 0) for a partial one."""
    if not frame_complete(frame):
        return 0, 0
    _, flags, hwm_kb, _, _ = FRAME.unpack_from(frame)
    return flags, hwm_kb


def frame_returned(frame: bytearray) -> bool:
    """Whether a whole frame carries the call's value (not an exception it raised)."""
    return frame_complete(frame) and FRAME.unpack_from(frame)[0] == _VALUE


def decode(frame: bytearray, status: int) -> Outcome:
    """The outcome told by the child's frame, or else (a partial frame) by its exit status."""
    if frame_complete(frame):
        kind, _, _, tb_len, _ = FRAME.unpack_from(frame)
        tb = frame[FRAME.size:FRAME.size + tb_len].decode(errors="replace") or None
        try:
            obj = cloudpickle.loads(memoryview(frame)[FRAME.size + tb_len:])
        except Exception as exc:
            what = "result" if kind == _VALUE else "exception"
            return failed(f"the call's {what} could not be unpickled: {exc!r}", tb)
        return (True, obj, None, None) if kind == _VALUE else (False, None, obj, tb)
    if os.WIFSIGNALED(status):
        sig = signal.Signals(os.WTERMSIG(status))
        oom = " (out of memory? the kernel's OOM killer sends SIGKILL)" * (sig == signal.SIGKILL)
        return failed(f"the call's process was killed by {sig.name}{oom}")
    return failed(f"the call's process exited with status {os.waitstatus_to_exitcode(status)} "
                  "without sending a result")


def failed(message: str, tb: str | None = None) -> Outcome:
    return False, None, ChildFailedError(message), tb


def kill_group(pid: int) -> None:
    try:
        os.killpg(pid, signal.SIGKILL)
    except OSError:  # no group yet: the child alone
        with contextlib.suppress(OSError):
            os.kill(pid, signal.SIGKILL)


def reap(pid: int) -> tuple[int, int]:
    """Wait for the child, kill what is left of its group (descendants the call left
    behind), reap it: (status, ru_maxrss kB). Reaped last, the zombie child keeps its pid
    (the group's id) from being taken by an unrelated process while the group is killed."""
    os.waitid(os.P_PID, pid, os.WEXITED | os.WNOWAIT)  # retried on EINTR by Python
    kill_group(pid)
    _, status, usage = os.wait4(pid, 0)
    return status, usage.ru_maxrss


def _group_rss_kb(pgid: int) -> int:
    """Resident kB of the processes in group ``pgid`` other than its leader: found among the
    leader's descendants (:func:`descendants`; the leader is a subreaper, so a call's
    orphans are among them), or by a ``/proc`` scan where the kernel lists no children."""
    if not _CHILDREN_LISTED:
        return _scanned_group_rss_kb(pgid)
    return _in_group_kb((fields for _, fields in descendants(pgid)), pgid)


def _scanned_group_rss_kb(pgid: int) -> int:
    """:func:`_group_rss_kb` by a scan of every process (kernels without
    ``CONFIG_PROC_CHILDREN``; the tests compare it with the walk)."""
    found = (fields for e in os.scandir("/proc") if e.name.isdigit() and int(e.name) != pgid
             if (fields := _stat_fields(int(e.name))) is not None)
    return _in_group_kb(found, pgid)


def _in_group_kb(found: Iterable[list[bytes]], pgid: int) -> int:
    """Resident kB of the processes among ``found`` (their ``stat`` fields) in group
    ``pgid``."""
    # field 5 (index 2 from field 3): pgrp; field 24 (index 21): rss in pages
    return sum(int(f[21]) for f in found if int(f[2]) == pgid) * _PAGE_KB


def _stat_fields(pid: int) -> list[bytes] | None:
    """``/proc/<pid>/stat``'s fields from field 3 (``state``) on; None once it exited."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            fields = f.read().rsplit(b")", 1)[1].split()
    except (OSError, IndexError):
        return None
    return fields if len(fields) > 21 else None


def descendants(pid: int) -> list[tuple[int, list[bytes]]]:
    """Every live descendant of ``pid``: its pid and its ``/proc/<pid>/stat`` fields (from
    field 3, ``state``), walked through ``/proc/<pid>/task/<tid>/children`` (a process that
    exits meanwhile is left out). The walk costs ~15 us for a childless call; a scan of
    every process's ``stat`` costs ~12-16 us a process, each poll (~0.8 ms on an idle
    66-process VM, ~16 ms at 1,000 processes, four times a second in each library)."""
    out: list[tuple[int, list[bytes]]] = []
    parents, seen = [pid], {pid}
    while parents:
        parent = parents.pop()
        try:
            tids = os.listdir(f"/proc/{parent}/task")
        except OSError:  # it exited meanwhile: its children went to the subreaper
            continue
        for tid in tids:
            try:
                with open(f"/proc/{parent}/task/{tid}/children", "rb") as f:
                    kids = [int(k) for k in f.read().split()]
            except OSError:
                continue
            for kid in kids:
                if kid not in seen and (fields := _stat_fields(kid)) is not None:
                    seen.add(kid)
                    out.append((kid, fields))
                    parents.append(kid)
    return out


def statm_kb(path: str) -> int:
    try:
        with open(path, "rb") as f:
            return int(f.read().split()[1]) * _PAGE_KB
    except (OSError, IndexError):
        return 0  # it exited meanwhile


def flush_stdio() -> None:
    for stream in (sys.stdout, sys.stderr):
        with contextlib.suppress(AttributeError, OSError, ValueError):
            stream.flush()


# --- child side -------------------------------------------------------------------------------
def enter_child(parent: int) -> bool:
    """First steps in a forked child: its own process group, death with the parent's forking
    thread, the default SIGCHLD. False when the parent is already gone."""
    with contextlib.suppress(OSError):
        os.setpgid(0, 0)
    if _prctl:
        _prctl(1, signal.SIGKILL, 0, 0, 0)  # PR_SET_PDEATHSIG
    if os.getppid() != parent:  # the parent died before the line above
        return False
    signal.signal(signal.SIGCHLD, signal.SIG_DFL)
    with contextlib.suppress(Exception):
        import faulthandler  # a crash is the parent's to report, not the child's to print

        faulthandler.disable()
    return True


def answer(w: int, fn: Callable[..., object], args: tuple[object, ...],
           kwargs: Mapping[str, object],
           after: Callable[[], tuple[int, int]] | None = None) -> None:
    """Run the call and write its frame to ``w``; ``after()`` gives (flags, peak kB)."""
    try:
        kind, tb, blob = _VALUE, b"", _dumps(fn(*args, **kwargs))
    except BaseException as exc:
        tb = "".join(traceback.format_exception(exc)).encode(errors="replace")
        kind, blob = _EXCEPTION, _dumps(exc)
    flags, hwm_kb = after() if after is not None else (0, 0)
    write_all(w, [FRAME.pack(kind, flags, hwm_kb, len(tb), len(blob)), tb, blob])
    flush_stdio()


def write_all(w: int, parts: list[bytes]) -> None:
    """Write ``parts`` to ``w`` with as few ``writev`` calls as the pipe takes: a frame
    that fits goes in one, and its reader wakes once, with all of it there. (A write per
    part woke the library for the header alone; on 2 busy cores each wake took the
    writer's core, and the child waited ~0.2 ms more for its next call.)"""
    views = [memoryview(p) for p in parts if p]
    while views:
        done = os.writev(w, views)
        while views and done >= len(views[0]):
            done -= len(views[0])
            views.pop(0)
        if done:
            views[0] = views[0][done:]


def become_subreaper() -> None:
    """Orphaned descendants are re-parented here rather than to init (PR_SET_CHILD_SUBREAPER),
    so that :func:`reap_descendants` sees the processes a call left behind."""
    if _prctl:
        _prctl(36, 1, 0, 0, 0)


def reap_descendants() -> bool:
    """Reap the exited children of this process; True when some are still running. One
    ``waitpid`` says it (it waits for the children of every thread of the process, the
    orphans a subreaper adopted among them): "none exited" while some are left, ECHILD when
    none is (a walk of ``/proc/self/task/*/children`` cost ~0.1 ms a call)."""
    try:
        while os.waitpid(-1, os.WNOHANG)[0]:
            pass
    except ChildProcessError:
        return False
    return True


def _child(fn: Callable[..., object], args: tuple[object, ...], kwargs: Mapping[str, object],
           w: int, parent: int) -> NoReturn:
    """Run the call and send one frame; never returns into the caller's code."""
    code = 70  # unless the frame is sent
    try:
        if enter_child(parent):
            become_subreaper()  # orphans of the call stay its descendants, to be counted
            answer(w, fn, args, kwargs)
            code = 0
    finally:
        os._exit(code)


def _dumps(obj: object) -> bytes:
    """Pickle a result or an exception; what cannot be pickled becomes a ChildFailedError."""
    blob: bytes
    try:
        blob = cloudpickle.dumps(obj)
        return blob
    except Exception as exc:
        if not isinstance(obj, BaseException):
            raise ChildFailedError(f"the call's result ({type(obj).__name__}) cannot be "
                                   f"pickled: {exc!r}") from exc
        blob = cloudpickle.dumps(ChildFailedError(
            f"{type(obj).__name__}: {obj} (this exception cannot be pickled)"))
        return blob
