"""The TaskVine port: the only module that imports and calls ``ndcctools.taskvine``.

:class:`TaskVinePort` owns one TaskVine manager (password, optional TLS, datavine's tunes)
and turns what the rest of the manager asks into TaskVine calls: a bundle becomes a function
call of the datavine library (:func:`datavine.worker.remote.run_bundle`, 'direct' mode) and
comes back as a :class:`datavine.manager.port.Finished` (:class:`~datavine.manager.port.CallPort`,
what a run drives); the library is installed, its instances stopped, warm-up calls and the
environment's staging task sent (for :mod:`datavine.manager.library`); the worker list and
counters are read (for :mod:`datavine.manager.worker_watch`). It decides nothing: when to
install, restart or warm up, and which workers left, are the callers'.

A bundle's call is made with TaskVine's C functions directly (:class:`BundleCalls`), not with
the bindings' ``FunctionCall``: a task, its argument buffer, its features and files, and no
output file. The library writes the call's result as the call's standard output
(:data:`REPLY_FILE`), which the worker sends with its completion message (at most 1 KB
inline, else at the manager's request), so that no result file is fetched and unlinked.

The bindings' private internals (the manager's C pointer and task table, ``File``'s
pointer, ``FunctionCall``'s fields, ...) are reached through one adapter,
:class:`~datavine.manager.taskvine_internals.Internals`, with a named check per
assumption. When its manager starts, the port probes what this TaskVine can do
(:attr:`TaskVinePort.capabilities`, :mod:`datavine.manager.capabilities`): the patches'
features, the GIL, the password exchange, ``vine_worker``'s options, the internals.
"""

from __future__ import annotations

import contextlib
import functools
import inspect
import pickle
import socket
import sys
import time
import uuid
from collections.abc import Callable, Collection, Iterable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from types import ModuleType
from typing import cast

import cloudpickle

from datavine.config import ManagerConfig
from datavine.deploy.binaries import cctools_prefix, vine_binary
from datavine.deploy.vine_options import SSL_CA, SSL_FINGERPRINT, TRANSFER_ADDRESS, options_of
from datavine.errors import DatavineError, ManagerStartError, TaskvineMissingError
from datavine.manager.bundle_calls import BundleCalls, Ended, Flags
from datavine.manager.capabilities import Capabilities, file_markers, listen_honoured, listening_on
from datavine.manager.environment import PackedEnv, declare_environment_files, use_environment
from datavine.manager.listen import contact_host, listen_address
from datavine.manager.listen import listening_on as listen_env
from datavine.manager.port import Finished
from datavine.manager.taskvine_internals import REPLY_FILE, Internals, broken
from datavine.manager.taskvine_types import VineFile, VineManager, VineStats, VineTask
from datavine.scheduler.labels import worker_feature
from datavine.worker import payload, remote

# TaskVine settings of every datavine manager (benchmarks/README.md, faults and workers):
# - transient-error-interval: TaskVine takes a file it sent as stored before the worker
#   stored it; a peer asked for it that early fails, and the task or library that needed
#   it is held back this long (default 15 s): a restarted library's files race like this.
# (max-retrievals -1, every waiting result in one wait cycle, was tried for the workers
# benchmark: within its run-to-run noise, so left at TaskVine's default.)
MANAGER_TUNES = {"transient-error-interval": 2}
STATS_FOR_S = 0.01  # a look at TaskVine's statistics serves this long (one pool sample)


def silence_tunes(worker_timeout_s: float) -> dict[str, int]:
    """TaskVine settings that declare a silent worker lost within ``worker_timeout_s`` (pure).

    A keep-alive check goes to a worker that sent nothing for two thirds of the bound, and it
    is removed when the check stays unanswered for the rest (a third: a worker answers a
    check from its main loop at once). The bound is the same as with checks after a third
    and two thirds to answer, with half as many checks: a worker running a bundle longer
    than the interval is asked once per interval, and at 256 workers the checks were most
    of an idle pool's cost to the manager (benchmarks/README.md, workers). A read from a
    worker that has started to answer (TaskVine's ``long-timeout``, 3600 s by default,
    during which the manager serves no one else) gives up after a third of it."""
    third = max(1, int(worker_timeout_s / 3))
    return {"keepalive-interval": max(1, int(worker_timeout_s) - third),
            "keepalive-timeout": third,
            "long-timeout": max(2, third)}


def exec_command(command: str) -> str:
    """The library's command line with ``exec`` in front, so that the ``sh -c`` the worker
    runs it with becomes the library itself (pure).

    The worker kills a library with ``kill(-pid, SIGKILL)``, ``pid`` being the process it
    started: without ``exec`` that is a shell, and when the shell lost the race to become
    a group leader the signal reaches nothing while the worker blocks until the library
    ends by itself (:func:`datavine.worker.remote.library_started` closes that race from
    inside the library, which needs the library to be that process)."""
    command = command.strip()
    return command if command.startswith("exec ") else f"exec {command}"


def check_port_free(port: int, address: str | None = None) -> None:
    """Raise ManagerStartError naming ``port`` when a listener already holds it (on
    ``address``; ``None``: any)."""
    if port == 0:
        return
    family = socket.AF_INET6 if address and ":" in address else socket.AF_INET
    with socket.socket(family, socket.SOCK_STREAM) as sock:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            sock.bind((address or "", port))
        except OSError as exc:
            raise ManagerStartError(
                f"cannot start the manager on port {port}: {exc.strerror or exc} (another "
                "manager or program holds it); choose another port (ManagerConfig.port, "
                "--port), or 0 for any free one") from None


@functools.cache
def _library_code() -> ModuleType | None:
    """poncho's library code, which the manager ships to workers (None when absent)."""
    try:
        from ndcctools.poncho import library_network_code
    except ImportError:
        return None
    return library_network_code


@functools.cache
def library_queues_calls() -> bool:
    """Whether this TaskVine's direct-mode library takes more function slots than cores
    (TaskVine patch 0015: its calls queue in the library's pipe). A stock library refuses
    them at its start ("function slots cannot be more than library cores") and would die
    on every worker, so without the patch the library gets one slot. Read from the library
    code the manager ships (``ndcctools.poncho.library_network_code``)."""
    return Internals(import_taskvine(), _library_code()).library_queues_calls()


@functools.cache
def library_announces_calls() -> bool:
    """Whether this TaskVine's direct-mode library hands each call to the library's
    ``vine_call_queued`` hook as it arrives (TaskVine patch 0018), which reading ahead
    (``RunConfig.prefetch_mb``, :mod:`datavine.worker.prefetch`) needs; read from the
    library code the manager ships."""
    code = _library_code()
    try:
        return code is not None and CALL_HOOK_MARK in inspect.getsource(code)
    except (OSError, TypeError):
        return False


CALL_HOOK_MARK = "vine_call_queued"  # in the library code of patch 0018


def import_taskvine() -> ModuleType:
    try:
        import ndcctools.taskvine as vine
    except ImportError as exc:
        raise TaskvineMissingError(exc) from exc
    return vine


# strings that patches of the series add to the bindings' library (none of them is in
# TaskVine as released): their presence is what the probes read
MARKERS = {
    "listen-address": b"\0VINE_LISTEN_ADDRESS\0",
    "gil-released": b"PyEval_SaveThread",  # swig -threads: every call releases the GIL
    "password-hmac": b"auth password hmac-sha256 v2\0",
    "handshakes-off-loop": b"handshakes off the wait loop",
    "manager-savings": b"epoll is not available",  # patch 0010, applied with 0003-0009
}


def probe_capabilities(internals: Internals, asked: str | None, port: int) -> Capabilities:
    """What this TaskVine can do for datavine (:mod:`datavine.manager.capabilities`), read
    from its library, its programs' options and the manager just started (``asked``: the
    address it was asked to listen on; ``port``: where it listens). Worker features stay
    unknown until a worker is seen (:meth:`Capabilities.saw_workers`)."""
    found = file_markers(internals.library_file, MARKERS.values())
    record: dict[str, bool | None] = {key: MARKERS[key] in found for key in MARKERS}
    record["worker-features"] = None
    record["library-queue"] = internals.library_queues_calls()
    record["call-hook"] = library_announces_calls()
    honoured = listen_honoured(asked, listening_on(port))
    if honoured is not None:
        record["listen-address"] = honoured
    try:
        worker: Path | None = vine_binary("vine_worker")
    except DatavineError:
        worker = None
    takes = options_of(str(worker)) if worker is not None else frozenset()
    record["worker-transfer-address"] = TRANSFER_ADDRESS in takes
    record["worker-checks-manager"] = {SSL_CA, SSL_FINGERPRINT} <= takes
    return Capabilities(record, broken(internals, worker), taskvine_source())


def taskvine_source() -> str:
    """Where this TaskVine is: its prefix, and what datavine's build stamp says of it."""
    prefix = cctools_prefix()
    if prefix is None:
        return "TaskVine (no cctools prefix found)"
    try:
        stamp = (prefix / ".datavine-build").read_text().splitlines()
    except OSError:
        return f"{prefix} (not built by scripts/build_taskvine.sh)"
    facts = [stamp[0]] if stamp else []
    facts += [line for line in stamp if line.startswith(("bindings=", "series="))]
    return f"{prefix} ({'; '.join(facts)})"


def finished(ended: Ended) -> Finished:
    """A bundle's call that TaskVine returned, as a run reads it: the library's reply, or
    why there is none (pure)."""
    if ended.ok:
        try:
            output = payload.read_reply(ended.reply)
        except Exception as exc:  # an empty or cut reply: another datavine, or none sent
            why = (f"no result from the library on {ended.hostname} ({exc}): does the worker "
                   "run the same datavine as the manager?")
        else:
            if isinstance(output, dict):
                return Finished(ended.id, output, ended.addrport)
            why = f"the library on {ended.hostname} replied a {type(output).__name__}"
    else:
        why = (f"TaskVine result {ended.result!r} on {ended.hostname} "
               f"(exit {ended.exit_code})")
    return Finished(ended.id, None, ended.addrport, why)


@dataclass
class TaskDone:
    """A task of the manager's own (a warm-up call, the environment's staging task) that
    finished: whether TaskVine says it succeeded, its output (a call's return value; loaded
    only for the tasks the waiter asked for), its worker, and TaskVine's word on it."""

    id: int
    ok: bool
    output: object
    addrport: str | None
    result: str = ""  # TaskVine's result string
    exit_code: int | None = None


class TaskVinePort:
    """One TaskVine manager, driven for datavine (see the module docstring).

    ``manager_config``: the port, password, TLS, listen address, run directory and the
    worker timeout; TaskVine's logs go to ``info_dir``.
    """

    def __init__(self, manager_config: ManagerConfig) -> None:
        self.vine = import_taskvine()
        run_dir = Path(manager_config.run_dir).resolve()
        run_dir.mkdir(parents=True, exist_ok=True)
        self.info_dir = run_dir / "vine-run-info" / f"run-{uuid.uuid4().hex[:8]}"
        port = manager_config.port
        # the local address it listens on (None: every interface); see manager/listen.py
        self.listen_address = listen_address(manager_config)
        check_port_free(port, self.listen_address)
        try:
            with listen_env(self.listen_address):
                self._manager: VineManager | None = self.vine.Manager(
                    port=port,
                    ssl=manager_config.ssl,
                    run_info_path=str(self.info_dir.parent),
                    run_info_template=self.info_dir.name,
                    staging_path=str(run_dir),
                )
        except Exception as exc:  # TaskVine raises a bare Exception
            where = self.listen_address or "every interface"
            raise ManagerStartError(f"cannot start the TaskVine manager on port {port} "
                                    f"({where}): {exc}") from None
        self.internals = Internals(self.vine, _library_code())
        if not manager_config.debug_log:
            self.internals.quiet_debug_log()
        # what this TaskVine can do for datavine, probed once (datavine doctor prints it)
        self.capabilities = probe_capabilities(self.internals, self.listen_address, self.port)
        if self.listen_address is not None and not self.capabilities.has("listen-address"):
            print(f"datavine: this TaskVine ignores the listen address {self.listen_address}: "
                  f"the manager on port {self.port} listens on every interface (datavine "
                  "doctor)", file=sys.stderr, flush=True)
        if manager_config.password_file:
            self.manager.set_password_file(str(manager_config.password_file))
        self.manager.tune("watch-library-logfiles", 1)
        for name, value in {**MANAGER_TUNES,
                            **silence_tunes(manager_config.worker_timeout_s)}.items():
            self.manager.tune(name, value)
        cvine = self.vine.cvine
        self._c = self.internals.c  # the C functions themselves
        self._pointer = self.internals.manager_pointer(self.manager)
        self._vine_calls = BundleCalls(
            self._c, self._pointer,
            Flags(cvine.VINE_CACHE_LEVEL_TASK, cvine.VINE_TRANSFER_ALWAYS,
                  cvine.VINE_RESULT_SUCCESS), "run_bundle", self.internals.reply_reader())
        self._call_class = self.internals.call_class()  # the warm-up calls'
        self.library: str | None = None  # the installed library's name: bundles call it
        self._stats_seen: tuple[float, VineStats] | None = None  # (when, TaskVine's stats)
        self._replies_in = 0  # bytes of the calls' replies taken (see file_bytes)

    @property
    def manager(self) -> VineManager:
        """The underlying ``ndcctools.taskvine.Manager`` (also for pools and diagnostics)."""
        if self._manager is None:
            raise RuntimeError(f"the TaskVine manager of {self.info_dir} is closed")
        return self._manager

    @property
    def port(self) -> int:
        return int(self.manager.port)

    @property
    def contact_host(self) -> str:
        """The address a process on this host reaches the manager by."""
        return contact_host(self.listen_address)

    def close(self) -> None:
        """Shut the manager down now (not whenever the garbage collector gets to it)."""
        manager, self._manager = self._manager, None
        self._vine_calls.forget()  # the manager frees what it still holds
        if manager is not None:  # the only way to delete a TaskVine manager deterministically
            self.internals.free_manager(manager)

    # --- the pool --------------------------------------------------------------------------
    def _stats(self) -> VineStats:
        """TaskVine's statistics, looked at once per :data:`STATS_FOR_S`: each look walks
        every worker (~0.3 ms at 256), and a pool sample asks for the pool's size and the
        workers' counters one after the other."""
        now = time.monotonic()
        if self._stats_seen is None or now - self._stats_seen[0] >= STATS_FOR_S:
            self._stats_seen = (now, self.manager.stats)
        return self._stats_seen[1]

    def connected_workers(self) -> int:
        return int(self.manager.stats.workers_connected)

    def pool_size(self) -> tuple[int, int]:
        """(workers, cores) connected, from one look at TaskVine's statistics."""
        stats = self._stats()
        return int(stats.workers_connected), int(stats.total_cores)

    def worker_counters(self) -> tuple[int, int]:
        """(workers joined, workers removed) so far (a look at the statistics, not the
        list)."""
        stats = self._stats()
        return int(stats.workers_joined), int(stats.workers_removed)

    def capability_lines(self) -> list[str]:
        """What this TaskVine lacks, one line each (:meth:`Capabilities.lines`); whether it
        lists workers' features is looked up once, when a worker is connected."""
        record = self.capabilities
        if record.found.get("worker-features") is None and self.connected_workers():
            self.worker_list()  # the record learns from it
        return record.lines()

    def worker_list(self) -> object:
        """TaskVine's list of connected workers (~10 ms at 256 workers). Each entry has the
        worker's ``hostname``, ``addrport`` and resources, and, with datavine's TaskVine
        build, its ``features`` (its name and rack), which the capability record learns
        from."""
        workers = self.manager.status("workers")
        if self.capabilities.found.get("worker-features") is None and workers:
            self.capabilities.saw_workers(workers)
        return workers

    # --- what a run drives: bundles in, results out ------------------------------------------
    def submit_bundle(self, payload: bytes, cap_mb: float | None, preload: tuple[str, ...],
                      limit_s: float | None, features: Sequence[str] = (),
                      fetch: Mapping[str, object] | None = None,
                      store: Mapping[str, object] | None = None) -> int:
        """Submit one bundle as a call of the installed library (one core); ``fetch`` /
        ``store``: file name in the call's sandbox -> TaskVine file it reads / writes.
        Returns its id."""
        if self.library is None:
            raise RuntimeError("no datavine library is installed: install_library() first")
        # what the library's function is called with (poncho reads it from the call's
        # infile): plain data, the bundle is bytes already, so pickle's C pickler
        event = {"fn_args": (payload, cap_mb, preload, limit_s, REPLY_FILE), "fn_kwargs": {}}
        return self._vine_calls.submit(
            self.library, pickle.dumps(event, protocol=pickle.HIGHEST_PROTOCOL), features,
            {name: self.internals.file_pointer(file) for name, file in (fetch or {}).items()},
            {name: self.internals.file_pointer(file) for name, file in (store or {}).items()})

    def wait(self, timeout_s: int) -> Finished | None:
        """The next bundle call that finished within ``timeout_s``, or None. Calls of an
        earlier run (cancelled, abandoned) that come back are dropped here, and so are the
        manager's own tasks (warm-up calls) that end meanwhile."""
        task = self._c.vine_wait_for_tag(self._pointer, None, timeout_s)
        if task is None:
            return None
        ended = self._take(task)
        if ended is None:
            self._bindings_task(task)
            return None
        return None if ended.withdrawn else finished(ended)

    def _take(self, task: object) -> Ended | None:
        """:meth:`BundleCalls.take`, counting the bytes of the reply (the result), which
        TaskVine's file counters do not see: it comes as the call's standard output."""
        ended = self._vine_calls.take(task)
        if ended is not None and ended.reply:
            self._replies_in += len(ended.reply)
        return ended

    def cancel(self, task_id: int) -> None:
        """Withdraw a call that is not running (see :meth:`remove_library` for running)."""
        self._vine_calls.cancel(task_id)

    def call_state(self, task_id: int) -> str:
        """TaskVine's state of a call: READY (waiting), RUNNING, ... ('' once it is gone)."""
        return self._vine_calls.state(task_id)

    def call_worker(self, task_id: int) -> str | None:
        return self._vine_calls.worker(task_id)

    def call_places(self, task_ids: Iterable[int]) -> dict[int, tuple[str, str | None]]:
        """(state, worker address) of each call, read in one go (:meth:`BundleCalls.places`)."""
        return self._vine_calls.places(task_ids)

    def declare_temp(self) -> object:
        """A TaskVine temp file: made by a call, kept in its worker's cache."""
        return self.manager.declare_temp()

    def fetch(self, file: object) -> bytes | None:
        """The bytes of a temp file (one :meth:`declare_temp` made), brought from the worker
        holding it (blocking), or None when no worker has them."""
        temp = cast(VineFile, file)
        try:
            self.manager.fetch_file(temp)  # loads them into the file object (returns a C string)
        except UnicodeDecodeError:
            pass  # loaded all the same: binary data does not decode as text
        except Exception:
            return None
        try:
            return bytes(temp.contents())
        except Exception:
            return None

    def undeclare(self, file: object) -> None:
        """Forget a file: workers delete their replicas."""
        self.manager.undeclare_file(file)

    def file_bytes(self) -> tuple[int, int]:
        """Bytes of files the manager sent and received so far, the calls' arguments (buffers)
        and results (their standard output) included."""
        stats = self.manager.stats
        return int(stats.bytes_sent), int(stats.bytes_received) + self._replies_in

    def network_fallback(self, block: Sequence[str], unblock: Sequence[str],
                         peers_off: bool) -> None:
        """Block hosts (TaskVine sends their workers nothing more), unblock others, turn
        peer transfers off (every file from the manager; temps declared from now on come
        back to it)."""
        for host in block:
            self.manager.block_host(host)
        for host in unblock:
            self.manager.unblock_host(host)
        if peers_off:
            self.manager.disable_peer_transfers()
            print(file=sys.stderr, flush=True)  # TaskVine's warning there ends no line

    def dumps(self, spec: Mapping[str, object]) -> bytes:
        """A bundle as bytes: the library unpickles it itself and reports what fails."""
        return cloudpickle.dumps(spec)

    # --- the library (for manager/library.py) ----------------------------------------------------
    def install_library(self, name: str, *, env: Mapping[str, str], from_peers: bool,
                        slots: int = 1, environment: object = None,
                        hook: Callable[[object], None] | None = None) -> None:
        """Install the datavine library as ``name``: one instance per core, running
        :func:`datavine.worker.remote.run_bundle` in 'direct' mode with ``slots`` function
        slots each (one call runs, the others wait in the library's pipe and start as it ends:
        TaskVine patch 0015; a TaskVine without it gives direct libraries one slot), with the
        variables ``env``, inside ``environment`` (an unpacked tree from
        :meth:`declare_environment`) when given; ``hook`` sees the LibraryTask last.
        ``from_peers``: whether workers may fetch the library's own files from each other
        (:meth:`Internals.unshared_library_files`)."""
        with contextlib.ExitStack() as files:
            if not from_peers:
                files.enter_context(self.internals.unshared_library_files(self.manager))
            lib = self.manager.create_library_from_functions(
                name, remote.run_bundle, add_env=False, exec_mode="direct",
                library_context_info=[remote.library_started, [], {}])
        lib.set_cores(1)
        lib.set_function_slots(max(1, slots) if library_queues_calls() else 1)
        for var, value in env.items():
            lib.set_env_var(var, value)
        if environment is not None:
            use_environment(lib, environment)
        if hook:
            hook(lib)
        lib.set_command(exec_command(lib.command))
        self.manager.install_library(lib)
        self.library = name

    def remove_library(self, calls: tuple[int, ...] = ()) -> None:
        """Stop every instance of the installed library, with the calls running in them
        (``calls``: their task ids); the next bundle needs a library installed again.

        TaskVine cannot cancel a running function call (the worker only releases its slot,
        while the library goes on running it: the next call waited), and
        ``Manager.remove_library`` skips instances whose slots are busy. Cancelling each
        instance's task kills its process on its worker, and the capped child dies with it
        (PR_SET_PDEATHSIG); the calls, cancelled after it, then hold nothing."""
        name, self.library = self.library, None
        if name is None:
            return
        with contextlib.suppress(Exception):  # a manager that cannot is being closed anyway
            for task in self.manager.status("tasks") or ():
                if isinstance(task, dict) and task.get("provides_library") == name:
                    self.manager.cancel_by_task_id(int(task["task_id"]))
            for task_id in calls:
                self.cancel(task_id)
            self.manager.remove_library(name)

    def submit_warm_up(self, library: str, payload: bytes, preload: tuple[str, ...],
                       worker: str) -> int:
        """An empty bundle's call of ``library`` for the worker named ``worker`` (one core):
        it starts the library there. Its answer comes from :meth:`wait_task`."""
        call = self._call_class(library, "run_bundle", payload, None, preload)
        call.set_cores(1)
        call.add_feature(worker_feature(worker))
        return int(self.manager.submit(call))

    def declare_environment(self, packed: PackedEnv) -> tuple[object, object]:
        """Declare a packed environment: (its tarball's file, the unpacked tree's)."""
        return declare_environment_files(self.manager, packed)

    def submit_staging(self, tarball: object) -> int:
        """A one-core task that holds ``tarball`` (a worker fetches it); returns its id."""
        task = self.vine.Task("test -s env.tarball")
        task.add_input(tarball, "env.tarball")
        task.set_cores(1)
        return int(self.manager.submit(task))

    def wait_task(self, timeout_s: int, mine: Collection[int] = ()) -> TaskDone | None:
        """The next task that finished within ``timeout_s`` (any task: it also accepts
        connecting workers), or None; the output is loaded for the ids in ``mine`` only."""
        pointer = self._c.vine_wait_for_tag(self._pointer, None, timeout_s)
        if pointer is None:
            return None
        ended = self._take(pointer)
        if ended is not None:  # a bundle's call of a run that is over: its answer is dropped
            return TaskDone(ended.id, ended.ok, None, ended.addrport, ended.result,
                            ended.exit_code)
        task = self._bindings_task(pointer)
        if task is None:
            return None
        ok = bool(task.successful())
        output = task.output if ok and task.id in mine else None
        return TaskDone(task.id, ok, output, getattr(task, "addrport", None),
                        task.result, task.exit_code)

    def _bindings_task(self, pointer: object) -> VineTask | None:
        """The bindings' object of a task ``vine_wait`` returned (a warm-up call, the
        environment's staging task), taken out of their table as ``Manager.wait`` does; it
        frees the task when it is dropped."""
        return self.internals.take_task(self.manager, self._c.vine_task_get_id(pointer))

    def cancel_task(self, task_id: int) -> None:
        """Cancel a task of the manager's own (a warm-up call); errors are ignored."""
        with contextlib.suppress(Exception):
            self.manager.cancel_by_task_id(task_id)
