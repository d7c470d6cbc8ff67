"""Worker side: one long-lived forked child that runs capped calls one after another.

:func:`datavine.worker.memcap.run_capped` forks a fresh child per call. That is safe but slow for
short calls: a fresh child's heap is new or copy-on-write, so every large array faults its
pages in again (a 100k-event ZSTD chunk: ~100 ms in a fresh child against ~65 ms in a warm
process, with 4x the page faults). :class:`CappedChild` keeps one child alive between calls,
so its allocator, imports and caches stay warm, and watches it the same way during each call:

* the parent (the TaskVine library) sends each call down a pipe; the child runs it and answers
  with a :mod:`datavine.worker.memcap` frame that also carries its own peak RSS during the call
  (``VmHWM``, reset before each call through ``/proc/self/clear_refs``);
* during a call the parent polls the RSS of the child's process group against that call's
  cap, and SIGKILLs the group when it goes over: only that call is lost, and the next call
  gets a fresh child;
* a child that dies (a crash, the OOM killer), leaves processes running after a call, or idles
  at more than ``recycle_fraction`` of the next call's cap (memory its allocator kept) is
  replaced before the next call: :func:`needs_fresh_child` decides, a pure function;
* with a ``hint_handler``, :meth:`CappedChild.hint` passes short messages to the child while
  a call runs (a third pipe, read by a thread of the child that calls the handler): the
  library names the calls queued behind the running one, which the child reads ahead
  (:mod:`datavine.worker.prefetch`). A hint given while there is no child (the library's
  first calls arrive together, before its first call starts one) waits for the next child
  (:data:`PENDING_HINTS` at most; not the one naming the call that starts it, its
  ``sandbox``); one is dropped when the pipe is full.
* with a ``make_room`` function, a child that idles too close to the next call's cap (a
  bundle under a larger cap let its caches grow) first runs ``make_room(mb)`` and is replaced
  only when it still idles over the fraction: what it holds on purpose (a column cache) is
  handed back instead of the process with all of it (a new child also takes ~0.3 s to start
  here: seen when a run's last merges, under the floor's cap, followed chunks under a learned
  larger one);
* with :meth:`CappedChild.queue`, a call queued behind the running one is pickled ahead, and
  ``run`` sends it (:meth:`CappedChild.send_ahead`) the moment the running one's value is in,
  before the library reads and writes that value out and the worker and the manager wake to
  take it (on 2 cores those took the freed core first: ~2-3 ms between a child's calls).
  ``run`` for that call then finds it running and watches it from there. A call sent ahead
  whose ``run`` never comes (the worker cancelled it: its sandbox is gone) is waited for by
  the next ``run`` for up to :data:`CANCELLED_GRACE_S`, then stopped with the child.

A cap therefore reads as it does for :func:`~datavine.worker.memcap.run_capped`: "the process would
show this RSS", what ``ps`` and TaskVine's resource monitor count. The child's
``PR_SET_PDEATHSIG`` ties it to the thread that forked it: use one instance per process, from
its main thread. Imported on workers: keep the imports light.
"""

from __future__ import annotations

import contextlib
import gc
import os
import select
import struct
import threading
import time
from collections import deque
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import NoReturn

import cloudpickle

from datavine.worker import memcap
from datavine.worker.memcap import CappedResult

_LENGTH = struct.Struct("!Q")  # a request: its length, then cloudpickle((fn, args, kwargs))
# A learned cap is >= 1.25 x the largest peak (MemoryPolicy.headroom), and a peak includes
# what the child held before the call, so a child that keeps its usual memory between calls
# idles under 0.8 x its cap: only one that grew (a leak, caches) beyond that is replaced.
RECYCLE_FRACTION = 0.8
PENDING_HINTS = 16  # hints kept for a child not started yet, at most
# calls kept pickled for send_ahead, at most: the first ones (the next to run); a library
# queues about one a core, and one beyond these runs the usual way
QUEUED_AHEAD = 8
QUEUED_MAX_BYTES = 16 << 20  # a larger request (inline inputs) is not kept twice: no ahead
# how long a call sent ahead and then cancelled may go on (it keeps the child and its cache)
CANCELLED_GRACE_S = 1.0
# a child asked to make room for a call (CappedChild's make_room) aims at this share of the
# RSS at which it would be replaced: 0.7 of the cap at the default RECYCLE_FRACTION, the
# bound a column cache keeps its process under after a bundle (config.CACHE_RSS_SHARE)
ROOM_MARGIN = 0.875
ROOM_TIME_LIMIT_S = 10.0  # what making room may take before the child is stopped


def needs_fresh_child(alive: bool, idle_mb: float, cap_mb: float | None,
                      recycle_fraction: float) -> bool:
    """Whether the next call under ``cap_mb`` must start in a new child: there is none, or the
    one there already holds more than ``recycle_fraction`` of the cap while idle."""
    if not alive:
        return True
    return cap_mb is not None and idle_mb > recycle_fraction * cap_mb


@dataclass(frozen=True, slots=True)
class Queued:
    """A call queued behind the running one (:meth:`CappedChild.queue`): its request,
    pickled, and what ``run`` would watch it with."""

    sandbox: str
    request: bytes
    cap_mb: float | None
    time_limit_s: float | None


@dataclass(frozen=True, slots=True)
class SentAhead:
    """A queued call that went to the child before its ``run`` (:meth:`CappedChild.send_ahead`):
    the child's RSS before it, and when it went."""

    call: Queued
    idle_kb: int
    sent: float


def ahead_fits(queued: Queued, alive: bool, idle_kb: int, recycle_fraction: float) -> bool:
    """Whether ``queued`` (its sandbox still there: :meth:`CappedChild.send_ahead` passes
    over a cancelled call's) may go to the child now, ahead of its ``run``: the child is
    alive and would not be replaced for it (:func:`needs_fresh_child`). Pure."""
    return not needs_fresh_child(alive, idle_kb / 1024.0, queued.cap_mb, recycle_fraction)


class CappedChild:
    """A reusable child process for capped calls (see the module's docstring).

    ``run`` has :func:`datavine.worker.memcap.run_capped`'s contract (a call over its cap or past
    ``time_limit_s`` is killed): it never raises for what happens in the child, and returns
    a :class:`~datavine.worker.memcap.CappedResult` whose
    ``baseline_mb`` is the child's RSS before the call. ``close`` ends the child."""

    def __init__(self, *, poll_s: float = 0.02, scan_every_s: float = 0.25,
                 recycle_fraction: float = RECYCLE_FRACTION,
                 hint_handler: Callable[[bytes], None] | None = None,
                 make_room: Callable[[float], object] | None = None) -> None:
        self.poll_s = poll_s
        self.hint_handler = hint_handler
        self.make_room = make_room  # run in the child (by reference) with the MB to idle under
        self.rooms_made = 0  # children kept by make_room rather than replaced
        self._hints = -1  # the write end of the hint pipe (-1: none)
        self._pending: list[bytes] = []  # hints given while there was no child
        self._hint_lock = threading.Lock()  # hint() runs on another thread than run()
        self.scan_every_s = scan_every_s
        self.recycle_fraction = recycle_fraction
        self.pid: int | None = None
        self.started = 0  # children forked so far
        self.sent_ahead = 0  # calls sent before their run (send_ahead)
        self._requests = self._results = -1
        self._queued: deque[Queued] = deque()  # by queue(), in order
        # the sandboxes of the last calls run: poncho hands a call to the library's loop
        # before its hook sees it, so a call's queue() may come after its run()
        self._ran: deque[str] = deque(maxlen=4 * QUEUED_AHEAD)
        self._queue_lock = threading.Lock()  # queue() runs on the library's reading thread
        self._ahead: SentAhead | None = None  # the call the child runs before its run()

    def run(self, fn: Callable[..., object], args: tuple[object, ...] = (),
            kwargs: Mapping[str, object] | None = None, *, cap_mb: float | None,
            time_limit_s: float | None = None, sandbox: str | None = None) -> CappedResult:
        """``sandbox``: the call's folder; the call is stopped once it is gone (the worker
        removed it: the call was cancelled, :meth:`datavine.worker.memcap.Watch.gone`)."""
        started = time.perf_counter()
        self._unqueue(sandbox)
        ahead, self._ahead = self._ahead, None
        if ahead is not None and (sandbox is None or ahead.call.sandbox != sandbox):
            self._end_ahead(ahead)  # its run never came: cancelled, or a run of another call
            ahead = None
        if ahead is not None:  # already running: watch it from here
            idle_kb = ahead.idle_kb
        else:
            request = cloudpickle.dumps((fn, args, kwargs or {}))
            alive = self.pid is not None and not memcap.exited(self.pid)
            idle_kb = memcap.statm_kb(f"/proc/{self.pid}/statm") if alive else 0
            fresh = needs_fresh_child(alive, idle_kb / 1024.0, cap_mb, self.recycle_fraction)
            if fresh and alive and cap_mb is not None and self.make_room is not None:
                alive, idle_kb = self._room_for(cap_mb, idle_kb)
                fresh = needs_fresh_child(alive, idle_kb / 1024.0, cap_mb,
                                          self.recycle_fraction)
                self.rooms_made += not fresh
            if fresh:
                self.close()
                self._start(sandbox)
                idle_kb = memcap.statm_kb(f"/proc/{self.pid}/statm")
        assert self.pid is not None
        watch = memcap.Watch(self.pid, cap_mb, self.scan_every_s, time_limit_s, sandbox)
        return self._collect(watch, None if ahead is not None else request, started, idle_kb,
                             then_next=True)

    def _room_for(self, cap_mb: float, idle_kb: int) -> tuple[bool, int]:
        """Ask the child to idle under :data:`ROOM_MARGIN` of the RSS at which a call under
        ``cap_mb`` would replace it (``make_room``); (alive, its idle kB) after. A child that
        fails at it, or runs past :data:`ROOM_TIME_LIMIT_S`, is stopped (then replaced)."""
        assert self.pid is not None and self.make_room is not None
        room_mb = ROOM_MARGIN * self.recycle_fraction * cap_mb
        request = cloudpickle.dumps((self.make_room, (room_mb,), {}))
        watch = memcap.Watch(self.pid, None, self.scan_every_s, ROOM_TIME_LIMIT_S)
        made = self._collect(watch, request, time.perf_counter(), idle_kb)
        if not made.ok:
            self.close()
        if self.pid is None:
            return False, 0
        return True, memcap.statm_kb(f"/proc/{self.pid}/statm")

    def queue(self, fn: Callable[..., object], args: tuple[object, ...] = (),
              kwargs: Mapping[str, object] | None = None, *, cap_mb: float | None,
              time_limit_s: float | None = None, sandbox: str) -> None:
        """A call ``run`` will be asked for later (the library has it queued behind the
        running one): pickled now, off the running call's path, for :meth:`send_ahead`.
        Thread-safe; beyond :data:`QUEUED_AHEAD` waiting, it is not kept (the first ones
        are the next to run), nor is one over :data:`QUEUED_MAX_BYTES` (the library would
        hold its inline inputs twice)."""
        with self._queue_lock:
            if sandbox in self._ran or len(self._queued) >= QUEUED_AHEAD:
                return  # it runs, or ran, already; or others go before it
        request = cloudpickle.dumps((fn, args, kwargs or {}))
        if len(request) > QUEUED_MAX_BYTES:
            return
        with self._queue_lock:
            if sandbox not in self._ran:  # its run may have begun while it was pickled
                self._queued.append(Queued(sandbox, request, cap_mb, time_limit_s))

    def send_ahead(self) -> bool:
        """Send the first queued call (:meth:`queue`) to the child now, if the child may run
        it (:func:`ahead_fits`); its ``run`` watches it from then on. ``run`` does this as
        soon as a call's value is in, before it is unpickled: a caller that then finds the
        value bad and :meth:`close`-s the child ends the call sent ahead with it (its own
        ``run`` then starts it again, in a fresh child). Returns whether one went."""
        if self._ahead is not None or self.pid is None:
            return False
        with self._queue_lock:
            while self._queued and not os.path.isdir(self._queued[0].sandbox):
                self._queued.popleft()  # cancelled while queued: the library skips it
            queued = self._queued.popleft() if self._queued else None
        if queued is None:
            return False
        alive = not memcap.exited(self.pid)
        idle_kb = memcap.statm_kb(f"/proc/{self.pid}/statm") if alive else 0
        if not ahead_fits(queued, alive, idle_kb, self.recycle_fraction):
            return False
        try:
            self._send(queued.request)
        except OSError:  # it died after its call: its run starts another the usual way
            return False
        self._ahead = SentAhead(queued, idle_kb, time.perf_counter())
        self.sent_ahead += 1
        return True

    def _unqueue(self, sandbox: str | None) -> None:
        """``sandbox``'s call is being run: it is no longer one to send ahead, nor are the
        calls queued before it. The library runs its calls in the order they came (patch
        0018), so one queued before this call and not run was skipped (cancelled: its
        sandbox removed, patch 0015), and its ``run`` never comes; without this, such calls
        held places in the queue for good."""
        if sandbox is None:
            return
        with self._queue_lock:
            self._ran.append(sandbox)
            if any(q.sandbox == sandbox for q in self._queued):
                while self._queued.popleft().sandbox != sandbox:
                    pass

    def _end_ahead(self, ahead: SentAhead) -> None:
        """A call sent ahead whose ``run`` did not come (the worker cancelled it: a backup
        copy that lost, mostly): wait for it under its cap, and drop what it returned. Once
        its sandbox is gone it gets :data:`CANCELLED_GRACE_S` more, then it is stopped with
        the child: a call cancelled while it ran is stopped at once, but this one started
        early only to save a hand-over, and the child holds the worker's column cache."""
        if self.pid is None:
            return
        call = ahead.call
        gone = not os.path.isdir(call.sandbox)
        left = (None if call.time_limit_s is None
                else call.time_limit_s - (time.perf_counter() - ahead.sent))
        if gone:
            left = CANCELLED_GRACE_S if left is None else min(left, CANCELLED_GRACE_S)
        watch = memcap.Watch(self.pid, call.cap_mb, self.scan_every_s,
                             None if left is None else max(0.0, left),
                             None if gone else call.sandbox)
        self._collect(watch, None, ahead.sent, ahead.idle_kb)

    def _collect(self, watch: memcap.Watch, request: bytes | None, started: float,
                 idle_kb: int, then_next: bool = False) -> CappedResult:
        """Send ``request`` (None: the child has its call already) and watch the call to its
        end; the child is stopped when its frame is not whole or it left processes. With
        ``then_next``, a call that returned a value is followed at once by the next queued
        one (:meth:`send_ahead`)."""
        try:
            if request is not None:
                self._send(request)
            frame = memcap.collect(self._results, watch, self.poll_s)
        except BrokenPipeError:  # it died between two calls: the frame says nothing
            frame = bytearray()
        except BaseException:
            self.close()
            raise
        flags, hwm_kb = memcap.frame_header(frame)
        whole = (not (watch.exceeded or watch.timed_out or watch.cancelled)
                 and memcap.frame_complete(frame))
        status = self._stop() if not whole or flags & memcap.LEFT_BEHIND else 0
        if (then_next and self.pid is not None and memcap.frame_returned(frame)
                and self.send_ahead()):
            # the child first: what is left here (the value read and written out, the worker
            # told) can wait for a core; on 2 busy cores it held the child's (8 pairs of
            # scale tests: 3.20 s against 3.32, benchmarks/SCALETEST.md)
            os.sched_yield()
        return memcap.capped_result(frame, status, watch, max(watch.peak_kb, hwm_kb), started,
                                    idle_kb)

    def hint(self, message: bytes) -> bool:
        """Pass ``message`` (its frame within PIPE_BUF, 4 KiB) to the child's hint handler,
        without blocking; False when it is not passed now (no handler, no child yet: then
        it waits for the next child; the pipe full: dropped). Thread-safe."""
        frame = _LENGTH.pack(len(message)) + message
        with self._hint_lock:
            if len(frame) > select.PIPE_BUF or self.hint_handler is None:
                return False
            if self._hints < 0:
                if len(self._pending) < PENDING_HINTS:
                    self._pending.append(message)
                return False
            return self._write_hint(frame)

    def _write_hint(self, frame: bytes) -> bool:
        try:
            return os.write(self._hints, frame) == len(frame)
        except OSError:  # full (a frame under PIPE_BUF is written whole or not at all)
            return False

    def close(self) -> None:
        """End the child (and whatever is left in its process group), if there is one."""
        if self.pid is not None:
            self._stop()

    def __enter__(self) -> CappedChild:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # ------------------------------------------------------------------------------------------
    def _start(self, sandbox: str | None = None) -> None:
        parent = os.getpid()
        req_r, req_w = os.pipe()
        res_r, res_w = os.pipe()
        hint_r, hint_w = os.pipe() if self.hint_handler is not None else (-1, -1)
        with contextlib.suppress(OSError):
            memcap.set_pipe_size(res_w)
        memcap.prepare_fork()
        gc.freeze()  # the child's collections then skip the library's objects: no mass COW copy
        with self._hint_lock:  # held across the fork: the child never takes it
            pid = os.fork()
            if pid == 0:
                os.close(req_w)
                os.close(res_r)
                if hint_w >= 0:
                    os.close(hint_w)
                _serve(req_r, res_w, parent, hint_r, self.hint_handler)
            gc.unfreeze()
            os.close(req_r)
            os.close(res_w)
            if hint_r >= 0:
                os.close(hint_r)
                os.set_blocking(hint_w, False)
            self._hints = hint_w
            pending, self._pending = self._pending, []
            for message in pending:  # hints given before it: not the call that starts it
                if sandbox is None or message != sandbox.encode():
                    self._write_hint(_LENGTH.pack(len(message)) + message)
        with contextlib.suppress(OSError):
            os.setpgid(pid, pid)
        self.pid, self._requests, self._results = pid, req_w, res_r
        self.started += 1

    def _send(self, request: bytes) -> None:
        memcap.write_all(self._requests, [_LENGTH.pack(len(request)), request])

    def _stop(self) -> int:
        """Kill the child's group, reap the child: its wait status."""
        pid, self.pid = self.pid, None
        self._ahead = None  # a call sent ahead dies with it: its run starts it again
        with self._hint_lock:
            hints, self._hints = self._hints, -1
        for fd in (self._requests, self._results, hints):
            if fd >= 0:
                with contextlib.suppress(OSError):
                    os.close(fd)
        self._requests = self._results = -1
        if pid is None:
            return 0
        memcap.kill_group(pid)
        status, _ = memcap.reap(pid)
        return status


# --- child side -------------------------------------------------------------------------------
def _serve(requests: int, results: int, parent: int, hints: int = -1,
           hint_handler: Callable[[bytes], None] | None = None) -> NoReturn:
    """The child's loop: a request in, a frame out, until the parent closes the pipe (and
    hints, if any, handed to ``hint_handler`` on a thread of their own)."""
    code = 70
    try:
        if memcap.enter_child(parent):
            if hints >= 0:
                _listen(hints, hint_handler)
            memcap.become_subreaper()  # orphans of a call come back here, to be counted
            while True:
                request = _read_request(requests)
                if request is None:
                    code = 0
                    break
                memcap.reset_peak()
                try:
                    fn, args, kwargs = cloudpickle.loads(request)
                except BaseException as exc:
                    memcap.answer(results, _raise, (exc,), {}, _after_call)
                    continue
                del request
                memcap.answer(results, fn, args, kwargs, _after_call)
                del fn, args, kwargs
    finally:
        os._exit(code)


def _listen(fd: int, handler: Callable[[bytes], None] | None) -> None:
    """In the child: a thread that reads hints from ``fd`` and hands each to ``handler``,
    until the library closes the pipe."""

    def loop() -> None:
        while True:
            head = _read_exact(fd, _LENGTH.size)
            message = _read_exact(fd, _LENGTH.unpack(head)[0]) if head is not None else None
            if message is None:
                return
            if handler is not None:
                with contextlib.suppress(Exception):  # a hint never breaks the child
                    handler(message)

    threading.Thread(target=loop, name="datavine-hints", daemon=True).start()


def _raise(exc: BaseException) -> NoReturn:
    raise exc


def _read_request(fd: int) -> bytes | None:
    head = _read_exact(fd, _LENGTH.size)
    if head is None:
        return None
    return _read_exact(fd, _LENGTH.unpack(head)[0])


def _read_exact(fd: int, size: int) -> bytes | None:
    buf = bytearray(size)
    view, pos = memoryview(buf), 0
    while pos < size:
        got = os.readv(fd, [view[pos:]])
        if not got:
            return None  # the parent closed the pipe: time to go
        pos += got
    return bytes(buf)


def _after_call() -> tuple[int, int]:
    """(flags, peak kB) after a call: LEFT_BEHIND when it left descendants running."""
    left = memcap.reap_descendants()
    return (memcap.LEFT_BEHIND if left else 0), memcap.peak_rss_kb()
