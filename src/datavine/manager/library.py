"""The datavine library's lifecycle on the workers: installed, warmed up, restarted, watched.

:class:`DatavineLibrary` decides when the library (one persistent TaskVine library whose
function, :func:`datavine.worker.remote.run_bundle`, runs bundles) is installed, with the
Python environment staged first when workers get one; starts it on named workers before any
run (:meth:`~DatavineLibrary.warm_up`), and again after a restart; stops it, with the calls
running in it, when a run abandons calls; and watches its health: instances that died with a
traceback (:class:`LibraryLogs`) and each worker's library from TaskVine's transactions log
(:class:`datavine.manager.library_log.LibraryLog`). Every TaskVine call goes through
:class:`datavine.manager.taskvine_port.TaskVinePort`.
"""

from __future__ import annotations

import os
import time
import uuid
from collections.abc import Callable, Mapping
from pathlib import Path

from datavine.config import RunConfig
from datavine.errors import EnvironmentStageError, LibraryFailedError
from datavine.manager.environment import PackedEnv
from datavine.manager.library_log import LibraryLog
from datavine.manager.taskvine_port import TaskVinePort, library_queues_calls
from datavine.protocol import BundleSpec
from datavine.scheduler.network import LibraryState, overdue
from datavine.scheduler.topology import Topology

# Thread pools inside a 1-core library slot only fight each other (FINDINGS: OpenBLAS).
LIBRARY_ENV = {"OPENBLAS_NUM_THREADS": "1", "OMP_NUM_THREADS": "1", "MKL_NUM_THREADS": "1",
               "NUMBA_NUM_THREADS": "1"}
ENV_STAGE_S = 300.0  # beyond no_worker_timeout_s: one worker fetching a large tarball
# A run waits at most this long for libraries restarted after the last run (1-3 s each);
# a worker that is slower gets its calls when its library answers, as in any run.
REWARM_S = 10.0
# the libraries' logs are searched at least this often (see check): a safety net, since
# TaskVine's log says when a library ends (a search lists every worker's log: ~3 ms at 256)
LOG_SCAN_S = 60.0
EMPTY_BUNDLE: dict[str, object] = BundleSpec().encode()  # a warm-up call: no tasks


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


class DatavineLibrary:
    """The library of one manager (see the module docstring).

    ``libraries``: TaskVine's transactions log, read once per look for the libraries here
    and for the calls requeued (:class:`datavine.manager.worker_watch.WorkerWatch`);
    ``topology``: the workers known (their addresses and hosts, learned by warm-up calls);
    ``liveness``: names of the workers datavine started that still run (None: unknown);
    ``environment``: a packed Python environment the library runs in; ``hook``: sees the
    TaskVine LibraryTask before it is installed.
    """

    def __init__(self, port: TaskVinePort, run_config: RunConfig, libraries: LibraryLog,
                 topology: Topology, *, liveness: Callable[[], set[str]] | None = None,
                 environment: PackedEnv | None = None,
                 hook: Callable[[object], None] | None = None) -> None:
        self.port = port
        self.run_config = run_config
        self.libraries = libraries
        self.topology = topology
        self.liveness = liveness
        self.environment = environment
        self.hook = hook
        self._env_tarball: object = None
        self._env_file: object = None
        if environment is not None:
            self._env_tarball, self._env_file = port.declare_environment(environment)
        self._warm: dict[str, int] = {}  # workers warmed up, again after a library restart
        self._rewarm = False
        self._logs = LibraryLogs()
        self._ended_seen = -1  # libraries ended (transactions log) at the last log search
        self._states: dict[str, LibraryState] = {}  # states(): the last copy, and of what
        self._states_version = -1
        self._scanned_at = 0.0
        self._rescan = False
        self._failed: list[Path] = []

    # --- installed, restarted ------------------------------------------------------------------
    def ensure(self) -> str:
        """The installed library's name; installed now (the environment staged first) when
        there is none."""
        if self.port.library is None:
            if self._env_file is not None:
                self._stage_environment()
            self.port.install_library(f"datavine-{uuid.uuid4().hex[:8]}", env=LIBRARY_ENV,
                                      from_peers=self.run_config.library_from_peers,
                                      slots=self.run_config.bundles_per_slot,
                                      environment=self._env_file, hook=self.hook)
        assert self.port.library is not None
        return self.port.library

    def _stage_environment(self) -> None:
        """Have one worker hold the environment's tarball before the library goes out.

        TaskVine counts a file it sent as stored before the worker has stored it; workers
        that fetch it from that peer too early fail, and one re-dispatched within the
        ``transient-error-interval`` gets a second copy from the manager. Staging first
        makes every later worker fetch from a peer (manager egress ~1x the tarball)."""
        task = self.port.submit_staging(self._env_tarball)
        limit = self.run_config.no_worker_timeout_s + ENV_STAGE_S
        deadline = time.monotonic() + limit
        while time.monotonic() < deadline:
            done = self.port.wait_task(1)
            if done is not None and done.id == task:
                if not done.ok:
                    where = self.environment.path if self.environment else "?"
                    raise EnvironmentStageError(
                        f"staging the environment {where} on a worker failed: "
                        f"{done.result} (exit {done.exit_code})")
                return
        self.port.cancel(task)
        raise EnvironmentStageError(
            f"no worker received the environment tarball within {limit:.0f} s "
            f"({self.port.connected_workers()} workers connected to port {self.port.port})")

    def restart(self, calls: tuple[int, ...] = ()) -> None:
        """Stop every instance of the library, with the calls running in them (``calls``:
        their task ids), and have the next run install a fresh one (warmed up again where
        :meth:`warm_up` was used). This is how the calls a failed or timed-out run
        abandoned stop holding their slots: TaskVine cannot cancel a running call
        (:meth:`TaskVinePort.remove_library`)."""
        if self.port.library is None:
            return
        self._rewarm = bool(self._warm)
        self.port.remove_library(calls)

    def close(self) -> None:
        self._env_file = None

    # --- warmed up -------------------------------------------------------------------------------
    def warm_up(self, workers: dict[str, int], timeout_s: float) -> set[tuple[str, int]]:
        """Start the library on the named workers before any graph runs: an empty bundle per
        function slot of each core of each (``{worker id: cores}``), which also imports
        ``RunConfig.preload``. A library takes ~1-2 s to start (a Python, cloudpickle,
        datavine); pools are pre-started so that runs do not pay for that. Returns (worker
        id, library PID) of those that answered within ``timeout_s``; the rest keep starting
        (their answers are ignored later). Raises LibraryFailedError when the library keeps
        dying."""
        self._warm = dict(workers)
        library = self.ensure()
        payload = self.port.dumps(EMPTY_BUNDLE)
        warming: dict[int, str] = {}  # call -> its worker
        # an instance per core, each taking this many calls (patch 0015): enough empty
        # bundles to fill every instance's slots start them all
        slots = self.run_config.bundles_per_slot if library_queues_calls() else 1
        for worker, cores in workers.items():
            for _ in range(cores * slots):
                call = self.port.submit_warm_up(library, payload,
                                                tuple(self.run_config.preload), worker)
                warming[call] = worker
        pending = set(warming)
        deadline = time.monotonic() + timeout_s
        answered: set[tuple[str, int]] = set()
        looked = time.monotonic()
        seen: dict[str, str] = {}  # each worker's address, as this warm-up last saw it
        while pending and time.monotonic() < deadline:
            if time.monotonic() - looked >= 1.0:  # workers gone or cut off: not waited for
                looked = time.monotonic()
                pending -= self._warm_given_up({t: warming[t] for t in pending}, seen)
            task = self.port.wait_task(1, mine=pending)
            if task is None:  # a quiet second: has the library been dying meanwhile?
                self.check()
            elif task.id in pending:
                pending.discard(task.id)
                result = task.output if task.ok else None
                if isinstance(result, dict):
                    answered.add((str(result.get("worker")), int(result.get("pid", 0))))
                    # named pool workers; the files whose bytes their disk holds
                    # (io/disk_cache.py: a rerun's chunks go back there)
                    held = [str(r["lfn"]) for r in result.get("reads") or ()
                            if isinstance(r, dict) and r.get("server") == "memory"
                            and not r.get("dropped") and "@" not in str(r.get("lfn"))]
                    self.topology.learn(result.get("worker"), result.get("rack"),
                                        task.addrport, held)
        return answered

    def _warm_given_up(self, pending: Mapping[int, str], seen: dict[str, str]) -> set[int]:
        """Warm-up calls not worth waiting for, cancelled: their worker left, or its library
        was sent and has not started within ``RunConfig.library_start_timeout_s`` (a peer
        it cannot reach: the run's network watch drops it, scheduler/network.py). ``seen``:
        each worker's address as the warm-up's earlier looks saw it, updated here: a worker
        that left is forgotten by the topology, and its calls were waited for until the
        warm-up's timeout (seen for 15 minutes at 256 workers, a worker that had stopped
        answering: TaskVine patch 0029)."""
        now = time.monotonic()
        states = self.states(now)
        late = overdue(states, now, self.run_config.library_start_timeout_s)
        connected = self.libraries.connected()
        seen.update((w.id, w.addrport) for w in self.topology.workers.values() if w.addrport)
        given_up = {task for task, worker in pending.items()
                    if (addr := seen.get(worker)) is not None
                    and (addr in late or (connected and addr not in connected))}
        for task in given_up:
            self.port.cancel_task(task)
        return given_up

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

    # --- health ----------------------------------------------------------------------------------
    def states(self, now: float) -> dict[str, LibraryState]:
        """Each connected worker's library (address -> state since ``now`` or earlier),
        from TaskVine's transactions log; host names from the topology, which learned each
        worker's host from TaskVine's worker list when it connected (no second look)."""
        log = self.libraries
        log.read(now)
        if log.version != self._states_version:  # a copy a change, not a copy a second
            if log.missing_hosts():
                log.name_hosts({w.addrport: w.host for w in self.topology.workers.values()
                                if w.addrport and w.host})
            self._states = dict(log.states)
            # hosts still missing (a worker the topology learns later): look again next time
            self._states_version = -1 if log.missing_hosts() else log.version
        return self._states

    def failures(self) -> list[Path]:
        """Logs of library instances that died with a traceback (TaskVine restarts them)."""
        return self._logs.failures(self.port.info_dir / "library-logs")

    def _failures_if_any_ended(self) -> list[Path]:
        """:meth:`failures`, searched for only when TaskVine's transactions log (read by the
        look just before) says a library ended since the last search (and once more at the
        next look, for a log written a little after its end), else every
        :data:`LOG_SCAN_S`: a search lists every worker's log (~1.4 ms at 128 workers)."""
        now = time.monotonic()
        ended = self.libraries.ended
        if ended != self._ended_seen or self._rescan or now - self._scanned_at >= LOG_SCAN_S:
            self._rescan = ended != self._ended_seen
            self._ended_seen, self._scanned_at = ended, now
            self._failed = self.failures()
        return self._failed

    def check(self) -> None:
        """Raise once the library died ``max_library_failures`` times (TaskVine would keep
        restarting it, and the run would wait forever)."""
        failed = self._failures_if_any_ended()
        if len(failed) >= self.run_config.max_library_failures:
            tail = "\n".join(failed[-1].read_text(errors="replace").splitlines()[-15:])
            raise LibraryFailedError(
                f"the datavine library died {len(failed)} times on workers "
                f"(RunConfig.max_library_failures={self.run_config.max_library_failures}); "
                f"last log {failed[-1]}:\n{tail}")
