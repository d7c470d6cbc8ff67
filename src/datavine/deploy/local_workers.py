"""Local ``vine_worker`` processes on 127.0.0.1: the embedded default worker pool.

They connect to the manager on loopback (or on the one address it listens on) and their
transfer servers, which serve cached files to peers, listen on that same address only
(``--transfer-address``, datavine's TaskVine build), not on every interface. A
``vine_worker`` without an option datavine would add (TaskVine as released: no
``--transfer-address``, ``--ssl-ca``, ``--ssl-fingerprint``) is started without it
(:func:`fit_options`; :mod:`datavine.deploy.vine_options` reads what it takes), and
``datavine doctor`` names what that loses.

Each worker leads a session of its own, and everything it forks stays in that session
(:mod:`datavine.deploy.sessions`): its libraries, which it puts in process groups of their own, and
its ``[transfer server]``, which outlives a SIGKILLed worker and would keep the manager's
connection open for TaskVine's long timeout. A watch thread notices a worker that exited and
kills what it left at once, so the manager sees the connection close and re-runs the
worker's calls elsewhere within a second; the client's reaper (:mod:`datavine.deploy.reaper`) stops
the workers should the client itself be killed. Workers get the manager's password file,
their rack/feature labels, and a PATH whose ``python`` is this interpreter, so libraries run
in the same environment as the caller. With TLS they check whom they connect to: a
:class:`~datavine.deploy.tls.ManagerTrust` (``LocalCluster`` pins them to its manager's own
certificate) becomes ``--ssl-ca``/``--ssl-fingerprint``, and a worker whose manager's
certificate fails the check does not connect.
"""

from __future__ import annotations

import contextlib
import os
import select
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

from datavine.config import LocalWorkersConfig
from datavine.deploy.binaries import vine_binary
from datavine.deploy.reaper import reaper
from datavine.deploy.sessions import kill_session, stop_session
from datavine.deploy.tls import ManagerTrust
from datavine.deploy.vine_options import TRANSFER_ADDRESS, options_of, unsupported
from datavine.io.source.xrootd import XRD_CLIENT_ENV
from datavine.scheduler.labels import ENV_RACK, ENV_WORKER, rack_feature, rack_of, worker_feature

STOP_GRACE_S = 5.0
LOOPBACK = "127.0.0.1"
WATCH_S = 0.25  # how often the watch thread looks for workers started since, or that exited


def worker_command(cfg: LocalWorkersConfig, port: int, workdir: Path, *,
                   password_file: Path | None, ssl: bool, host: str = LOOPBACK,
                   labels: tuple[str, ...] = (), transfer_address: str | None = None,
                   binary: str | None = None, trust: ManagerTrust | None = None) -> list[str]:
    """The ``vine_worker`` command line for one local worker (pure); ``labels`` are the
    worker's own features (its name and rack) on top of ``cfg.features``;
    ``transfer_address``: the only address its transfer server listens on (``None``: every
    interface); ``trust``: what it checks the manager's certificate against (implies
    ``ssl``)."""
    binary = binary or str(vine_binary("vine_worker"))
    cmd = [binary, host, str(port), "--cores", str(cfg.cores),
           "--workspace", str(workdir), "--timeout", str(cfg.idle_timeout_s)]
    if transfer_address is not None:
        cmd += ["--transfer-address", transfer_address]
    if cfg.memory_mb:
        cmd += ["--memory", str(cfg.memory_mb)]
    if cfg.disk_mb:
        cmd += ["--disk", str(cfg.disk_mb)]
    if password_file:
        cmd += ["--password", str(password_file)]
    if ssl or trust is not None:
        cmd.append("--ssl")
    if trust is not None:
        cmd += trust.worker_options()
    for feature in dict.fromkeys((*cfg.features, *labels)):
        cmd += ["--feature", feature]
    return cmd


def supports_transfer_address(binary: str) -> bool:
    """Whether this ``vine_worker`` has ``--transfer-address`` (datavine's TaskVine build;
    scripts/patches/cctools): another build would refuse the option and not start."""
    return TRANSFER_ADDRESS in options_of(binary)


def fit_options(transfer_address: str | None, trust: ManagerTrust | None,
                takes: frozenset[str]) -> tuple[str | None, ManagerTrust | None]:
    """The transfer address and the manager trust a ``vine_worker`` that takes the options
    ``takes`` can be given (pure): each is dropped when the worker lacks its option (it would
    exit on it). Local workers reach their own manager on this host: without the checks they
    still connect with TLS, unverified (``datavine doctor`` says so)."""
    transfer = transfer_address if TRANSFER_ADDRESS in takes else None
    if trust is not None and unsupported(trust.worker_options(), takes):
        trust = None
    return transfer, trust


def default_workers() -> int:
    """One 1-core local worker per core this process may run on."""
    return max(1, len(os.sched_getaffinity(0)))


def local_worker_id(index: int) -> str:
    """The name of local worker ``index``: ``local-<index>``."""
    return f"local-{index}"


def worker_labels(index: int, cfg: LocalWorkersConfig) -> tuple[tuple[str, ...], dict[str, str]]:
    """Features and environment naming local worker ``index`` and its rack (pure)."""
    worker_id = local_worker_id(index)
    features = [worker_feature(worker_id)]
    env = {ENV_WORKER: worker_id}
    rack = rack_of(index, cfg.workers, cfg.racks) if cfg.racks else None
    if rack:
        features.append(rack_feature(rack))
        env[ENV_RACK] = rack
    return tuple(features), env


def worker_environment(extra: dict[str, str] | None = None) -> dict[str, str]:
    """Environment for workers: this interpreter first on PATH, single-threaded BLAS."""
    env = {**XRD_CLIENT_ENV, **os.environ}  # fast XRootD failover in tasks, user values win
    env["PATH"] = f"{Path(sys.executable).parent}{os.pathsep}{env.get('PATH', '')}"
    env.update({"OPENBLAS_NUM_THREADS": "1", "OMP_NUM_THREADS": "1"})
    env.update(extra or {})
    return env


class LocalWorkers:
    """Start, watch and stop local workers connected to a manager on this host.

    ``host``: the address they reach the manager by; ``transfer_address``: the only one
    their transfer servers listen on. Both are loopback by default; ``LocalCluster`` passes
    the manager's own listening address when it has one that workers on other hosts reach
    (so that those can fetch from these), and ``transfer_address=None`` (every interface)
    when the manager listens everywhere. ``trust``: what they check the manager's
    certificate against (implies ``ssl``)."""

    def __init__(self, cfg: LocalWorkersConfig, port: int, run_dir: Path, *,
                 password_file: Path | None, ssl: bool = False, host: str = LOOPBACK,
                 transfer_address: str | None = LOOPBACK,
                 trust: ManagerTrust | None = None) -> None:
        self.cfg = cfg
        self.port = port
        self.host = host
        self.transfer_address = transfer_address
        self.run_dir = Path(run_dir)
        self.password_file = password_file
        self.ssl = ssl or trust is not None
        self.trust = trust
        self.procs: list[subprocess.Popen[bytes]] = []
        self.exited: dict[int, int] = {}  # worker index -> exit status, as the watch saw it
        self._alive_key: tuple[int, frozenset[int]] | None = None  # alive_ids' last answer
        self._alive: set[str] = set()
        self._stop_watch = threading.Event()
        self._watch: threading.Thread | None = None
        self._wake: int | None = None  # an eventfd that wakes the watch thread to stop

    def start(self, count: int | None = None, features: tuple[str, ...] | None = None) -> None:
        n = self.cfg.workers if count is None else count
        cfg = self.cfg if features is None else _with_features(self.cfg, features)
        for _ in range(n):
            index = len(self.procs)
            workdir = self.run_dir / f"worker-{index}"
            workdir.mkdir(parents=True, exist_ok=True)
            log = open(self.run_dir / f"worker-{index}.log", "ab")  # noqa: SIM115
            features, labels_env = worker_labels(index, cfg)
            binary = str(vine_binary("vine_worker"))
            transfer, trust = fit_options(self.transfer_address, self.trust, options_of(binary))
            cmd = worker_command(cfg, self.port, workdir, password_file=self.password_file,
                                 ssl=self.ssl, host=self.host, labels=features,
                                 transfer_address=transfer, binary=binary, trust=trust)
            self.procs.append(subprocess.Popen(
                cmd, stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                env=worker_environment({**cfg.extra_env, **labels_env}),
                start_new_session=True))
            reaper().add_session(self.procs[-1].pid)
            log.close()
        if self._watch is None:
            self._stop_watch.clear()
            self._wake = _eventfd()
            self._watch = threading.Thread(target=self._watch_loop, name="datavine-workers",
                                           daemon=True)
            self._watch.start()

    def _watch_loop(self) -> None:
        """Kill what each exited worker left behind, as soon as it exits (see the module).
        Each worker's exit is a pidfd in one epoll, so the thread sleeps until one exits (or
        :meth:`stop` wakes it): polling every worker each :data:`WATCH_S` cost the
        manager's process ~3 ms of CPU a second at 256 workers, and took its caches and
        its GIL between results. Without pidfds, each worker is polled."""
        exits = _ExitWatch.open(self._wake)
        try:
            while not self._stop_watch.is_set():
                if exits is None:
                    if self._stop_watch.wait(WATCH_S):
                        return
                    ended = list(range(len(self.procs)))  # each looked at below
                else:
                    ended = exits.wait(self.procs, WATCH_S)
                for index in ended:
                    proc = self.procs[index]
                    if index not in self.exited and proc.poll() is not None:
                        self.exited[index] = proc.returncode
                        kill_session(proc.pid)
        finally:
            if exits is not None:
                exits.close()

    def alive(self) -> int:
        return sum(p.poll() is None for p in self.procs)

    def alive_ids(self) -> set[str]:
        """Names (``local-<i>``) of the workers still running, as the watch thread last saw
        them (within :data:`WATCH_S`): the manager asks once a second, and asking each
        process itself cost ~0.7 ms at 256 workers."""
        if self._watch is None:  # no watch thread: ask the processes
            return {local_worker_id(i) for i, p in enumerate(self.procs) if p.poll() is None}
        exited = frozenset(self.exited)  # one copy: the watch thread adds to it
        key = (len(self.procs), exited)
        if key != self._alive_key:  # the same names each second, made again only on a change
            self._alive_key = key
            self._alive = {local_worker_id(i) for i in range(len(self.procs)) if i not in exited}
        return set(self._alive)

    def kill(self, index: int) -> None:
        """Kill one worker and everything it started at once (for failure tests)."""
        kill_session(self.procs[index].pid)

    def stop(self) -> None:
        """Stop every worker: SIGTERM (a worker then stops its libraries), SIGKILL to what is
        left of its session after ``STOP_GRACE_S``; bounded, idempotent."""
        self._stop_watch.set()
        if self._wake is not None:
            os.eventfd_write(self._wake, 1)
        watch, self._watch = self._watch, None
        if watch is not None:
            watch.join(timeout=5)
        if self._wake is not None and (watch is None or not watch.is_alive()):
            os.close(self._wake)  # a thread that did not end keeps it: never another's fd
            self._wake = None
        for proc in self.procs:
            _signal_group(proc, signal.SIGTERM)
            _signal_group(proc, signal.SIGCONT)  # a frozen worker acts on it at once
        deadline = time.monotonic() + STOP_GRACE_S
        for proc in self.procs:
            with contextlib.suppress(subprocess.TimeoutExpired):
                proc.wait(timeout=max(0.1, deadline - time.monotonic()))
            stop_session(proc.pid, grace_s=1.0)  # libraries, transfer servers, capped children
            with contextlib.suppress(subprocess.TimeoutExpired):
                proc.wait(timeout=1)
            reaper().remove_session(proc.pid)
        self.procs.clear()
        self.exited.clear()


def _eventfd() -> int | None:
    try:
        return os.eventfd(0, os.EFD_CLOEXEC)
    except (AttributeError, OSError):  # not Linux
        return None


class _ExitWatch:
    """The workers' exits as pidfds in an epoll (Linux 5.3 on), with ``wake`` (an eventfd
    that :meth:`LocalWorkers.stop` writes) beside them: one system call a wake, however many
    workers."""

    def __init__(self, poller: select.epoll, wake: int) -> None:
        self.poller = poller
        self.wake = wake
        self.fds: dict[int, int] = {}  # pidfd -> the worker's index
        self.watched = 0  # workers 0 .. watched-1 have their pidfd (or had: ended)

    @classmethod
    def open(cls, wake: int | None) -> _ExitWatch | None:
        """None where there are no pidfds (then the thread polls each worker)."""
        if wake is None or not hasattr(os, "pidfd_open"):
            return None
        try:
            poller = select.epoll()
        except OSError:
            return None
        poller.register(wake, select.EPOLLIN)
        return cls(poller, wake)

    def wait(self, procs: list[subprocess.Popen[bytes]], timeout_s: float) -> list[int]:
        """The indexes of the workers that may have exited: watched from now on if they
        started since the last wait (a worker gone before its pidfd counts as ended), then
        those whose pidfd says so within ``timeout_s`` (none when woken to stop)."""
        ended = []
        while self.watched < len(procs):
            index = self.watched
            self.watched += 1
            try:
                fd = os.pidfd_open(procs[index].pid)
            except OSError:  # gone (and reaped) already
                ended.append(index)
                continue
            self.fds[fd] = index
            self.poller.register(fd, select.EPOLLIN)
        if ended:
            return ended
        for fd, _ in self.poller.poll(timeout_s):
            if fd == self.wake:
                continue
            ended.append(self.fds.pop(fd))
            self.poller.unregister(fd)
            os.close(fd)
        return ended

    def close(self) -> None:
        for fd in self.fds:
            os.close(fd)
        self.fds.clear()
        self.poller.close()


def _signal_group(proc: subprocess.Popen[bytes], sig: int) -> None:
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(proc.pid, sig)


def _with_features(cfg: LocalWorkersConfig, features: tuple[str, ...]) -> LocalWorkersConfig:
    from dataclasses import replace

    return replace(cfg, features=tuple(cfg.features) + tuple(features))
