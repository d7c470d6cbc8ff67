"""The imperative shell around TaskVine: the only module that drives ``ndcctools.taskvine``.

``Runtime`` owns one TaskVine manager (password, optional SSL), one persistent library whose
single function, :func:`datavine.worker.remote.run_bundle`, runs bundles of dask tasks in 'direct'
mode, and what a manager learns across runs: task costs, memory peaks per category, and the
workers it has seen (:class:`datavine.scheduler.topology.Topology`). ``Runtime.get`` is a dask
scheduler; each call is one :class:`datavine.manager.execution.GraphRun`, which drives one
:class:`datavine.scheduler.run_state.RunState`.
"""

from __future__ import annotations

import contextlib
import importlib
import os
import socket
import sys
import time
import uuid
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import cloudpickle

from datavine.config import ManagerConfig, RunConfig
from datavine.dashboard.events import NO_SINK, NullSink
from datavine.errors import (
    EnvironmentStageError,
    LibraryFailedError,
    ManagerStartError,
    NoWorkersError,
    TaskvineMissingError,
)
from datavine.io.shards import ShardHealth
from datavine.manager.environment import (
    PackedEnv,
    declare_environment_files,
    use_environment,
)
from datavine.manager.execution import GraphRun
from datavine.manager.library_log import LibraryLog
from datavine.manager.listen import contact_host, listen_address, listening_on, local_host
from datavine.scheduler import graph as graphs
from datavine.scheduler.bundling import CostModel
from datavine.scheduler.labels import worker_feature
from datavine.scheduler.memory import MemoryState
from datavine.scheduler.network import LibraryState, overdue
from datavine.scheduler.run_state import Learned
from datavine.scheduler.summary import RunSummary
from datavine.scheduler.topology import Topology
from datavine.worker import remote

# Thread pools inside a 1-core library slot only fight each other (FINDINGS: OpenBLAS).
LIBRARY_ENV = {"OPENBLAS_NUM_THREADS": "1", "OMP_NUM_THREADS": "1", "MKL_NUM_THREADS": "1",
               "NUMBA_NUM_THREADS": "1"}
STATUS_EVERY_S = 1.0
# TaskVine settings of every datavine manager (benchmarks/README.md, faults and workers):
# - transient-error-interval: TaskVine takes a file it sent as stored before the worker
#   stored it; a peer asked for it that early fails, and the task or library that needed
#   it is held back this long (default 15 s): a restarted library's files race like this.
# (max-retrievals -1, every waiting result in one wait cycle, was tried for the workers
# benchmark: within its run-to-run noise, so left at TaskVine's default.)
MANAGER_TUNES = {"transient-error-interval": 2}
ENV_STAGE_S = 300.0  # beyond no_worker_timeout_s: one worker fetching a large tarball
# A run waits at most this long for libraries restarted after the last run (1-3 s each);
# a worker that is slower gets its calls when its library answers, as in any run.
REWARM_S = 10.0


@dataclass
class Finished:
    """A bundle's call as TaskVine returned it: the status dict the library sent
    (``result``), or why there is none (``failure``: the library or its worker died), and
    the worker it ran on."""

    id: int
    result: dict[str, Any] | None
    addrport: str | None
    failure: str = ""


def silence_tunes(worker_timeout_s: float) -> dict[str, int]:
    """TaskVine settings that declare a silent worker lost within ``worker_timeout_s`` (pure).

    A keep-alive check goes to a worker that sent nothing for a third of the bound, and it is
    removed when the check stays unanswered for the rest; a read from a worker that has
    started to answer (TaskVine's ``long-timeout``, 3600 s by default, during which the
    manager serves no one else) gives up after a third of it."""
    third = max(1, int(worker_timeout_s / 3))
    return {"keepalive-interval": third,
            "keepalive-timeout": max(1, int(worker_timeout_s) - third),
            "long-timeout": max(2, third)}


class LibraryLogs:
    """Library instances that died with a traceback, from their logs in TaskVine's run
    directory, read as they grow: a log is read again only past what was read of it, so a
    look costs one directory listing, not every log of every worker each second."""

    MARK = b"Traceback (most recent call last)"

    def __init__(self) -> None:
        self.read_to: dict[str, int] = {}  # log name -> bytes read so far
        self.tail: dict[str, bytes] = {}  # the last bytes read (a mark split between reads)
        self.failed: set[str] = set()

    def failures(self, directory: Path) -> list[Path]:
        try:
            entries = [e for e in os.scandir(directory) if e.name.endswith(".log")]
        except OSError:
            return []
        for entry in entries:
            if entry.name in self.failed:
                continue
            try:
                size = entry.stat().st_size
            except OSError:
                continue
            start = self.read_to.get(entry.name, 0)
            if size <= start:
                continue
            try:
                with open(entry.path, "rb") as f:
                    f.seek(start)
                    chunk = f.read(size - start)
            except OSError:
                continue
            self.read_to[entry.name] = start + len(chunk)
            text = self.tail.get(entry.name, b"") + chunk
            if self.MARK in text:
                self.failed.add(entry.name)
                self.tail.pop(entry.name, None)
            else:
                self.tail[entry.name] = text[-len(self.MARK):]
        return sorted(directory / name for name in self.failed)


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


@contextlib.contextmanager
def files_from_manager(manager: Any) -> Iterator[None]:
    """While TaskVine's ``create_library_from_functions`` declares the library's own files
    (its code and pickled context, a few KB), declare them not shared between workers: the
    manager sends them to each worker. Shared, a worker fetched them from a peer that had
    them a millisecond earlier, and a worker that cannot reach that peer waited for TCP's
    connect timeout (~130 s) with its library never started (RunConfig.library_from_peers)."""
    declare = manager.declare_file

    def unshared(path: str, cache: bool = False, peer_transfer: bool = True,
                 unlink_when_done: bool = False) -> Any:
        return declare(path, cache=cache, peer_transfer=False,
                       unlink_when_done=unlink_when_done)

    manager.declare_file = unshared
    try:
        yield
    finally:
        del manager.declare_file  # the class's method again


def import_taskvine() -> Any:
    try:
        import ndcctools.taskvine as vine
    except ImportError as exc:
        raise TaskvineMissingError(exc) from exc
    return vine


class Runtime:
    """A TaskVine manager that runs dask graphs. Use ``get`` as the dask scheduler.

    ``liveness``: for workers datavine started itself, a callable returning the names of
    those still running, so that bundles sent to a dead one are sent elsewhere at once.
    ``environment``: a packed Python environment (:mod:`datavine.manager.environment`) the library
    runs in, for workers without the project's Python; shared between workers peer-to-peer.
    """

    def __init__(self, manager: ManagerConfig | None = None, run: RunConfig | None = None,
                 *, library_hook: Callable[[Any], None] | None = None,
                 liveness: Callable[[], set[str]] | None = None,
                 environment: PackedEnv | None = None) -> None:
        self.manager_config = manager or ManagerConfig()
        self.run_config = run or RunConfig()
        self.vine = import_taskvine()
        run_dir = Path(self.manager_config.run_dir).resolve()
        run_dir.mkdir(parents=True, exist_ok=True)
        self.info_dir = run_dir / "vine-run-info" / f"run-{uuid.uuid4().hex[:8]}"
        port = self.manager_config.port
        # the local address it listens on (None: every interface); see manager/listen.py
        self.listen_address = listen_address(self.manager_config)
        check_port_free(port, self.listen_address)
        try:
            with listening_on(self.listen_address):
                self._m = self.vine.Manager(
                    port=port,
                    ssl=self.manager_config.ssl,
                    run_info_path=str(self.info_dir.parent),
                    run_info_template=self.info_dir.name,
                    staging_path=str(run_dir),
                )
        except Exception as exc:  # TaskVine raises a bare Exception
            where = self.listen_address or "every interface"
            raise ManagerStartError(f"cannot start the TaskVine manager on port {port} "
                                    f"({where}): {exc}") from None
        if self.manager_config.password_file:
            self._m.set_password_file(str(self.manager_config.password_file))
        self._m.tune("watch-library-logfiles", 1)
        for name, value in {**MANAGER_TUNES,
                            **silence_tunes(self.manager_config.worker_timeout_s)}.items():
            self._m.tune(name, value)
        self._library_hook = library_hook
        self.environment = environment
        self._env_file: Any = None
        self._env_tarball: Any = None
        if environment is not None:
            self._env_tarball, self._env_file = declare_environment_files(self._m, environment)
        self.liveness = liveness
        self._library: str | None = None
        self._warm: dict[str, int] = {}  # workers warmed up, again after a library restart
        self._rewarm = False
        self._addrports: set[str] = set()  # workers connected at the last status
        self._worker_counters: tuple[int, int] | None = None  # (joined, removed) then
        self._library_logs = LibraryLogs()
        self.libraries = LibraryLog(self.info_dir / "vine-logs" / "transactions")
        self._calls: dict[int, Any] = {}  # bundles' calls in TaskVine, by task id
        self.learned = Learned.fresh(self.run_config, here=local_host())  # handed to each run
        self.last_summary: RunSummary | None = None
        self.event_sink: NullSink = NO_SINK  # runs' events for the live view (a cluster's)
        self._last_status = 0.0
        for module in self.run_config.pickle_by_value:
            cloudpickle.register_pickle_by_value(importlib.import_module(module))

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

    # ----------------------------------------------------------------------------------------
    @property
    def port(self) -> int:
        return int(self._m.port)

    @property
    def contact_host(self) -> str:
        """The address a process on this host reaches the manager by."""
        return contact_host(self.listen_address)

    @property
    def manager(self) -> Any:
        """The underlying ``ndcctools.taskvine.Manager`` (for pools and diagnostics)."""
        return self._m

    def connected_workers(self) -> int:
        return int(self._m.stats.workers_connected)

    def pool_size(self) -> tuple[int, int]:
        """(workers, cores) connected, from one look at TaskVine's statistics: each look
        walks every worker several times, so a loop turn takes one."""
        stats = self._m.stats
        return int(stats.workers_connected), int(stats.total_cores)

    def wait_for_workers(self, n: int, timeout_s: float, *, waited_s: float = 0.0) -> int:
        """Block until ``n`` workers are connected; raise NoWorkersError after ``timeout_s``
        (``waited_s``: how long the caller waited for them already, for the message)."""
        deadline = time.monotonic() + timeout_s
        while self.connected_workers() < n:
            if time.monotonic() > deadline:
                raise NoWorkersError(
                    f"only {self.connected_workers()} of {n} workers connected to the manager on "
                    f"port {self.port} within {waited_s + timeout_s:.0f} s")
            self._m.wait(1)  # also accepts connecting workers
        return self.connected_workers()

    def warm_up(self, workers: dict[str, int], timeout_s: float) -> set[tuple[str, int]]:
        """Start the library on the named workers before any graph runs: an empty bundle per
        core of each (``{worker id: cores}``), which also imports ``RunConfig.preload``. A
        library takes ~1-2 s to start (a Python, cloudpickle, datavine); pools are pre-started
        so that runs do not pay for that. Returns (worker id, library PID) of those that
        answered within ``timeout_s``; the rest keep starting (their answers are ignored
        later). Raises LibraryFailedError when the library keeps dying."""
        self._warm = dict(workers)
        library = self.ensure_library()
        payload = self.dumps({"nodes": [], "inputs": {}, "outputs": [], "categories": {}})
        warming: dict[int, str] = {}  # call -> its worker
        for worker, cores in workers.items():
            for _ in range(cores):
                call = self.vine.FunctionCall(library, "run_bundle", payload, None,
                                              tuple(self.run_config.preload))
                call.set_cores(1)
                call.add_feature(worker_feature(worker))
                warming[self._m.submit(call)] = worker
        pending = set(warming)
        deadline = time.monotonic() + timeout_s
        answered: set[tuple[str, int]] = set()
        looked = time.monotonic()
        while pending and time.monotonic() < deadline:
            if time.monotonic() - looked >= 1.0:  # workers gone or cut off: not waited for
                looked = time.monotonic()
                pending -= self._warm_given_up({t: warming[t] for t in pending})
            task = self._m.wait(1)
            if task is None:  # a quiet second: has the library been dying meanwhile?
                self.check_library()
            elif task.id in pending:
                pending.discard(task.id)
                result = task.output if task.successful() else None
                if isinstance(result, dict):
                    answered.add((str(result.get("worker")), int(result.get("pid", 0))))
                    self.topology.learn(result.get("worker"), result.get("rack"),
                                        getattr(task, "addrport", None))  # named pool workers
        return answered

    def _warm_given_up(self, pending: Mapping[int, str]) -> set[int]:
        """Warm-up calls not worth waiting for, cancelled: their worker left, or its library
        was sent and has not started within ``RunConfig.library_start_timeout_s`` (a peer
        it cannot reach: the run's network watch drops it, scheduler/network.py)."""
        now = time.monotonic()
        states = self.library_states(now)
        late = overdue(states, now, self.run_config.library_start_timeout_s)
        connected = self.libraries.connected()
        address = {w.id: w.addrport for w in self.topology.workers.values()}
        given_up = {task for task, worker in pending.items()
                    if (addr := address.get(worker)) is not None
                    and (addr in late or (connected and addr not in connected))}
        for task in given_up:
            with contextlib.suppress(Exception):
                self._m.cancel_by_task_id(task)
        return given_up

    def warm_connected(self, timeout_s: float) -> set[tuple[str, int]]:
        """:meth:`warm_up` every connected worker that said its name (``worker:``) when it
        connected: learned from TaskVine's worker list, read now."""
        self._last_status, self._worker_counters = 0.0, None
        self.drop_lost_workers()
        named = {w.id: max(1, w.cores) for w in self.topology.workers.values()
                 if w.named and w.addrport}
        return self.warm_up(named, timeout_s) if named else set()

    def close(self) -> None:
        """Shut the manager down now (not whenever the garbage collector gets to it)."""
        manager = getattr(self, "_m", None)
        if manager is not None:
            self._m = None
            self._env_file = None
            manager._free()  # the only way to delete a TaskVine manager deterministically

    # ----------------------------------------------------------------------------------------
    def ensure_library(self) -> str:
        if self._library is None:
            name = f"datavine-{uuid.uuid4().hex[:8]}"
            with contextlib.ExitStack() as files:
                if not self.run_config.library_from_peers:
                    files.enter_context(files_from_manager(self._m))
                lib = self._m.create_library_from_functions(
                    name, remote.run_bundle, add_env=False, exec_mode="direct",
                    library_context_info=[remote.library_started, [], {}])
            lib.set_cores(1)
            lib.set_function_slots(1)
            for var, value in LIBRARY_ENV.items():
                lib.set_env_var(var, value)
            if self._env_file is not None:
                self._stage_environment()
                use_environment(lib, self._env_file)
            if self._library_hook:
                self._library_hook(lib)
            lib.set_command(exec_command(lib.command))
            self._m.install_library(lib)
            self._library = name
        return self._library

    def _stage_environment(self) -> None:
        """Have one worker hold the environment's tarball before the library goes out.

        TaskVine counts a file it sent as stored before the worker has stored it; workers
        that fetch it from that peer too early fail, and one re-dispatched within the
        ``transient-error-interval`` gets a second copy from the manager. Staging first
        makes every later worker fetch from a peer (manager egress ~1x the tarball)."""
        task = self.vine.Task("test -s env.tarball")
        task.add_input(self._env_tarball, "env.tarball")
        task.set_cores(1)
        self._m.submit(task)
        limit = self.run_config.no_worker_timeout_s + ENV_STAGE_S
        deadline = time.monotonic() + limit
        while time.monotonic() < deadline:
            done = self._m.wait(1)
            if done is not None and done.id == task.id:
                if not done.successful():
                    where = self.environment.path if self.environment else "?"
                    raise EnvironmentStageError(
                        f"staging the environment {where} on a worker failed: "
                        f"{done.result_string} (exit {done.exit_code})")
                return
        self._m.cancel_by_task_id(task.id)
        raise EnvironmentStageError(
            f"no worker received the environment tarball within {limit:.0f} s "
            f"({self.connected_workers()} workers connected to port {self.port})")

    # --- the port a run drives: bundles in, results out ----------------------------------------
    def submit_bundle(self, payload: bytes, cap_mb: float | None, preload: tuple[str, ...],
                      limit_s: float | None, features: Sequence[str] = (),
                      fetch: Mapping[str, Any] | None = None,
                      store: Mapping[str, Any] | None = None) -> int:
        """Submit one bundle as a call of the library (one core); ``fetch`` / ``store``: file
        name in the call's sandbox -> TaskVine file it reads / writes. Returns its id."""
        call = self.vine.FunctionCall(self.ensure_library(), "run_bundle", payload, cap_mb,
                                      preload, limit_s)
        call.set_cores(1)
        for name, file in (fetch or {}).items():
            call.add_input(file, name)
        for name, file in (store or {}).items():
            call.add_output(file, name)
        for feature in features:
            call.add_feature(feature)
        task_id = int(self._m.submit(call))
        self._calls[task_id] = call
        return task_id

    def wait(self, timeout_s: int) -> Finished | None:
        """The next bundle call that finished within ``timeout_s``, or None. Calls of an
        earlier run (cancelled, abandoned) that come back are dropped here."""
        task = self._m.wait(timeout_s)
        if task is None:
            return None
        call = self._calls.pop(task.id, None)
        if call is None:
            return None
        output = call.output if task.successful() else None
        if isinstance(output, dict):
            return Finished(task.id, output, task.addrport)
        host = getattr(task, "hostname", None) or "?"
        why = (f"{type(output).__name__} on {host}: {task.result_string}"
               if isinstance(output, Exception) else
               f"TaskVine result {task.result_string!r} on {host} (exit {task.exit_code})")
        return Finished(task.id, None, task.addrport, why)

    def cancel(self, task_id: int) -> None:
        """Withdraw a call that is not running (see :meth:`restart_library` for running)."""
        self._m.cancel_by_task_id(task_id)
        self._calls.pop(task_id, None)

    def call_state(self, task_id: int) -> str:
        """TaskVine's state of a call: READY (waiting), RUNNING, ... ('' once it is gone)."""
        call = self._calls.get(task_id)
        return str(call.state) if call is not None else ""

    def call_worker(self, task_id: int) -> str | None:
        call = self._calls.get(task_id)
        return call.addrport if call is not None else None

    def declare_temp(self) -> Any:
        """A TaskVine temp file: made by a call, kept in its worker's cache."""
        return self._m.declare_temp()

    def fetch(self, file: Any) -> bytes | None:
        """The bytes of a temp file, brought from the worker holding it (blocking), or None
        when no worker has them."""
        try:
            self._m.fetch_file(file)  # loads them into the file object (returns a C string)
        except UnicodeDecodeError:
            pass  # loaded all the same: binary data does not decode as text
        except Exception:
            return None
        try:
            return bytes(file.contents())
        except Exception:
            return None

    def undeclare(self, file: Any) -> None:
        """Forget a file: workers delete their replicas."""
        self._m.undeclare_file(file)

    def file_bytes(self) -> tuple[int, int]:
        """File bytes the manager sent and received so far (call arguments and results
        included: function calls travel as files)."""
        stats = self._m.stats
        return int(stats.bytes_sent), int(stats.bytes_received)

    def restart_library(self, calls: tuple[int, ...] = ()) -> None:
        """Stop every instance of the library, with the calls running in them (``calls``:
        their task ids), and have the next run install a fresh one (warmed up again where
        ``warm_up`` was used).

        TaskVine cannot cancel a running function call (the worker only releases its slot,
        while the library goes on running it: the next call waited), and
        ``Manager.remove_library`` skips instances whose slots are busy. Cancelling each
        instance's task kills its process on its worker, and the capped child dies with it
        (PR_SET_PDEATHSIG); the calls, cancelled after it, then hold nothing. This is how the
        calls a failed or timed-out run abandoned stop holding their slots."""
        if self._library is None:
            return
        name, self._library = self._library, None
        self._rewarm = bool(self._warm)
        with contextlib.suppress(Exception):  # a manager that cannot is being closed anyway
            for task in self._m.status("tasks") or ():
                if isinstance(task, dict) and task.get("provides_library") == name:
                    self._m.cancel_by_task_id(int(task["task_id"]))
            for task_id in calls:
                self.cancel(task_id)
            self._m.remove_library(name)

    def rewarm(self, timeout_s: float) -> None:
        """After a library restart, start the new library on the warmed-up workers, waiting
        for them at most ``timeout_s`` (and ``REWARM_S``): one worker slow to answer must not
        hold the next run."""
        timeout_s = min(timeout_s, REWARM_S)
        if self._rewarm:
            self._rewarm = False
            alive = self.liveness() if self.liveness is not None else None
            workers = {w: c for w, c in self._warm.items() if alive is None or w in alive}
            self.warm_up(workers, timeout_s)

    def dumps(self, spec: dict[str, Any]) -> bytes:
        """A bundle as bytes: the library unpickles it itself and reports what fails."""
        return cloudpickle.dumps(spec)

    def drop_lost_workers(self) -> tuple[set[str], set[str]]:
        """Forget workers that left: (their names, the addresses that disconnected since the
        last look). Calls sent to a named worker that left, or running on a lost address,
        must run elsewhere. Workers that joined become known to the topology with their
        host, rack, name and cores, before any bundle ran on them (:meth:`Topology.see`)."""
        now = time.monotonic()
        gone: set[str] = set()
        lost_addr: set[str] = set()
        if self.liveness is not None:
            alive = self.liveness()
            gone |= {w.id for w in self.topology.workers.values()
                     if w.named and w.id.startswith("local-") and w.id not in alive}
            for wid in gone:
                known = self.topology.forget(wid)
                if known is not None and known.addrport:
                    lost_addr.add(known.addrport)
        if now - self._last_status >= STATUS_EVERY_S:
            self._last_status = now
            workers = self._worker_list_if_changed()
            if isinstance(workers, list):
                entries = [w for w in workers if isinstance(w, dict)]
                alive_addr = {a for w in entries if (a := w.get("addrport"))}
                lost_addr |= self._addrports - alive_addr
                self._addrports = alive_addr
                gone |= set(self.topology.forget_missing(alive_addr))
                if self.topology.see(entries):
                    # a worker that has not reported its features and resources yet (they
                    # follow its hello): look again at the next status, joined or not
                    self._worker_counters = None
        return gone, lost_addr

    def _worker_list_if_changed(self) -> list[Any] | None:
        """TaskVine's list of connected workers, or None when no worker joined or left
        since the last look (the list costs ~10 ms at 256 workers; the counters nothing).
        Each entry has the worker's ``hostname``, ``addrport`` and resources, and, with
        datavine's TaskVine build, its ``features`` (its name and rack)."""
        stats = self._m.stats
        counters = (int(stats.workers_joined), int(stats.workers_removed))
        if counters == self._worker_counters:
            return None
        try:
            workers = self._m.status("workers")
        except Exception:  # a status call must never break a run
            return None
        self._worker_counters = counters
        return workers

    # --- the network: libraries that do not start, fallbacks (scheduler/network.py) -------
    def requeued(self, now: float) -> list[int]:
        """Task ids TaskVine put back in its queue by itself since the last look (their
        worker or library died), from its transactions log (read once for this and
        :meth:`library_states`)."""
        return self.libraries.requeued(now)

    def library_states(self, now: float) -> dict[str, LibraryState]:
        """Each connected worker's library (address -> state since ``now`` or earlier),
        from TaskVine's transactions log; host names from the topology, which learned each
        worker's host from TaskVine's worker list when it connected (no second look)."""
        self.libraries.read(now)
        if self.libraries.missing_hosts():
            self.libraries.name_hosts({w.addrport: w.host for w in self.topology.workers.values()
                                       if w.addrport and w.host})
        return dict(self.libraries.states)

    def network_fallback(self, block: Sequence[str], unblock: Sequence[str],
                         peers_off: bool) -> None:
        """Block hosts (TaskVine sends their workers nothing more), unblock others, turn
        peer transfers off (every file from the manager; temps declared from now on come
        back to it)."""
        for host in block:
            self._m.block_host(host)
        for host in unblock:
            self._m.unblock_host(host)
        if peers_off:
            self._m.disable_peer_transfers()
            print(file=sys.stderr, flush=True)  # TaskVine's warning there ends no line

    def library_failures(self) -> list[Path]:
        """Logs of library instances that died with a traceback (TaskVine restarts them)."""
        return self._library_logs.failures(self.info_dir / "library-logs")

    def check_library(self) -> None:
        """Raise once the library died ``max_library_failures`` times (TaskVine would keep
        restarting it, and the run would wait forever)."""
        failed = self.library_failures()
        if len(failed) >= self.run_config.max_library_failures:
            tail = "\n".join(failed[-1].read_text(errors="replace").splitlines()[-15:])
            raise LibraryFailedError(
                f"the datavine library died {len(failed)} times on workers "
                f"(RunConfig.max_library_failures={self.run_config.max_library_failures}); "
                f"last log {failed[-1]}:\n{tail}")

    def get(self, dsk: Any, keys: Any, **kwargs: Any) -> Any:
        """dask scheduler entry point: ``dask.compute(x, scheduler=runtime.get)``."""
        graph = graphs.build(dsk, keys)
        self.rewarm(self.run_config.no_worker_timeout_s)
        values = GraphRun(self, graph, self.run_config, sink=self.event_sink).execute()
        return graphs.pack_results(keys, values)
