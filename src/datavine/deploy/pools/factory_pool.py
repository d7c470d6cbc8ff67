"""Pools whose workers come from one ``vine_factory`` process: start, record, watch, stop.

:class:`FactoryPool` runs the factory in its own session, writes the pool's state file (so
that another process can :meth:`~FactoryPool.attach` to it later), asks the manager how many
workers are connected, and stops the factory with bounded waits: SIGTERM first (the
factory then removes its own workers), SIGKILL if it does not go, then the backend makes
sure no worker job is left. Backends (:mod:`~datavine.deploy.pools.condor`,
:mod:`~datavine.deploy.pools.local`) say how the factory is launched and how jobs are listed and
removed.

``start(detach=False)`` (the default, for ``with`` blocks and tests) passes
``--parent-death``: if the calling process dies, the factory removes its workers and exits.
``start(detach=True)`` (``datavine pool start``) lets the factory outlive its caller.

A pool whose workers check the manager's certificate against a CA file (``ssl_ca``) ships
a copy of it with every job (:mod:`~datavine.deploy.pools.ca_file`); the pool's status
queries check the manager's certificate the same way as its workers do.
"""

from __future__ import annotations

import contextlib
import functools
import os
import signal
import subprocess
import sys
import time
from dataclasses import replace
from pathlib import Path
from typing import ClassVar, Self

from datavine.deploy.binaries import cctools_prefix, vine_binary
from datavine.deploy.pools.base import PoolError, PoolStatus, WorkerPool
from datavine.deploy.pools.ca_file import stage_ca
from datavine.deploy.pools.factory import (
    Batch,
    FactoryConfig,
    config_from_dict,
    config_to_dict,
    factory_command,
    factory_config_text,
    fit_to_programs,
)
from datavine.deploy.pools.identity import ENV_POOL, write_wrapper
from datavine.deploy.pools.manager_status import ManagerQueryError, connected_workers
from datavine.deploy.pools.state import (
    PoolState,
    check_name,
    default_pool_dir,
    read_state,
    remove_state,
    write_state,
)
from datavine.deploy.tls import ManagerTrust, check_ca_file
from datavine.deploy.vine_options import options_of
from datavine.errors import ConfigError
from datavine.safe_paths import check_private_file
from datavine.scheduler.labels import ENV_RACK

STOP_TIMEOUT_S = 30.0
STARTUP_CHECK_S = 0.5  # a factory with a bad option or no batch system exits within this
_BACKENDS: dict[str, type[FactoryPool]] = {}


def worker_environment() -> dict[str, str]:
    """What workers need in their environment (the factory passes its own on to them).

    PATH starts with this interpreter's folder (so ``python`` in a task is this venv's) and
    the cctools programs; PYTHONPATH has ``ndcctools``; BLAS stays single-threaded.
    """
    paths = [str(Path(sys.executable).parent)]
    prefix = cctools_prefix()
    env = {"OPENBLAS_NUM_THREADS": "1", "OMP_NUM_THREADS": "1"}
    if prefix is not None:
        paths.append(str(prefix / "bin"))
        site = sorted(prefix.glob("lib/python3*/site-packages"))
        if site:
            env["PYTHONPATH"] = str(site[-1])
    env["PATH"] = os.pathsep.join([*paths, "/usr/local/bin", "/usr/bin", "/bin"])
    return env


def manager_trust(cfg: FactoryConfig) -> ManagerTrust | None:
    """What the pool's workers check the manager's certificate against, as a trust for
    datavine's own status queries; None when they check nothing."""
    if cfg.ssl_ca is None and cfg.ssl_fingerprint is None:
        return None
    return ManagerTrust(cfg.ssl_ca, cfg.ssl_fingerprint)


def factory_alive(pid: int) -> bool:
    """True if ``pid`` is a live (not zombie) process running vine_factory."""
    try:
        cmdline = Path(f"/proc/{pid}/cmdline").read_bytes()
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return False
    return stat.rsplit(")", 1)[-1].split()[0] != "Z" and b"vine_factory" in cmdline


def pool_class(batch: str) -> type[FactoryPool]:
    """The FactoryPool subclass for a batch system (``condor``, ``local``)."""
    try:
        return _BACKENDS[batch]
    except KeyError:
        raise PoolError(f"no worker pool for batch {batch!r} (known: {sorted(_BACKENDS)})") \
            from None


class FactoryPool(WorkerPool):
    """A pool of workers submitted by one ``vine_factory``; subclasses pick the batch."""

    batch: ClassVar[Batch]

    def __init_subclass__(cls, **kwargs: object) -> None:
        super().__init_subclass__(**kwargs)
        if "batch" in cls.__dict__:
            _BACKENDS[cls.batch] = cls

    def __init__(self, config: FactoryConfig, *, name: str = "default",
                 pool_dir: Path | None = None) -> None:
        self.config = replace(config, batch=self.batch) if config.batch != self.batch else config
        self.name = check_name(name)
        self.pool_dir = Path(pool_dir) if pool_dir is not None else default_pool_dir()
        self.pid: int | None = None
        self._proc: subprocess.Popen[bytes] | None = None

    @functools.cached_property
    def trust(self) -> ManagerTrust | None:
        """What the pool's workers check the manager's certificate against, as a trust for
        datavine's own status queries (built once: its CA file is read here); None when
        they check nothing."""
        return manager_trust(self.config)

    # -- backend hooks -------------------------------------------------------------------
    def _prepare(self, scratch: Path) -> FactoryConfig:
        """Make ``scratch`` ready; return the config the factory runs with."""
        raise NotImplementedError(f"{type(self).__name__}._prepare")

    def _launch(self, cmd: list[str], env: dict[str, str]) -> tuple[list[str], dict[str, str]]:
        """The command line and environment that start the factory."""
        raise NotImplementedError(f"{type(self).__name__}._launch")

    def _jobs(self) -> dict[str, int]:
        """The pool's worker jobs by state."""
        raise NotImplementedError(f"{type(self).__name__}._jobs")

    def worker_names(self) -> list[str]:
        """Names of this pool's running workers (``config.named``), as their wrapper makes
        them (:mod:`datavine.deploy.pools.identity`); a worker may still be connecting."""
        raise NotImplementedError(f"{type(self).__name__}.worker_names")

    def _remove_jobs(self, timeout_s: float, factory_seen: bool) -> None:
        """Make sure no worker job of this pool is left; raise PoolError if some are.

        ``factory_seen``: the factory was alive when ``stop`` began (so its pid, and the
        process group it leads, are surely this pool's).
        """
        raise NotImplementedError(f"{type(self).__name__}._remove_jobs")

    # -- lifecycle -----------------------------------------------------------------------
    @property
    def scratch_dir(self) -> Path:
        return self.config.scratch_dir or self.pool_dir / self.batch / self.name

    @property
    def log_path(self) -> Path:
        return self.scratch_dir / "factory.log"

    @classmethod
    def attach(cls, name: str, pool_dir: Path | None = None) -> FactoryPool:
        """The pool ``name`` started earlier, maybe by another process, from its state file."""
        pool_dir = Path(pool_dir) if pool_dir is not None else default_pool_dir()
        state = read_state(pool_dir, name)
        if state is None:
            raise PoolError(f"no pool named {name!r} in {pool_dir}")
        pool = pool_class(state.batch)(config_from_dict(state.config), name=name,
                                       pool_dir=pool_dir)
        pool.pid = state.pid
        return pool

    @property
    def running(self) -> bool:
        if self._proc is not None:
            return self._proc.poll() is None
        return self.pid is not None and factory_alive(self.pid)

    def start(self, *, detach: bool = False) -> Self:
        if self.config.password_file is not None:  # the user's: refused while others may read it
            check_private_file(self.config.password_file, f"pool {self.name!r}'s password file")
        if self.config.ssl_ca is not None:
            check_ca_file(self.config.ssl_ca, f"pool {self.name!r}'s ssl_ca")
        old = read_state(self.pool_dir, self.name)
        if old is not None:
            if factory_alive(old.pid):
                raise PoolError(f"pool {self.name!r} is already running (vine_factory pid "
                                f"{old.pid}, manager {old.manager}); stop it first")
            self.pid = old.pid  # a factory that died: clear what it left behind
            self._remove_jobs(STOP_TIMEOUT_S, factory_seen=False)
        scratch = self.scratch_dir
        factory = str(vine_binary("vine_factory"))
        run_cfg, dropped = fit_to_programs(self._prepare(scratch),
                                           options_of(str(vine_binary("vine_worker"))),
                                           options_of(factory))
        for line in dropped:  # datavine doctor says it too
            print(f"datavine: pool {self.name!r}: {line}", file=sys.stderr, flush=True)
        run_cfg = stage_ca(run_cfg, scratch)
        config_file = scratch / "factory.json"
        config_file.write_text(factory_config_text(run_cfg))
        # vine_factory copies wrapper inputs into its scratch folder: keep the source apart
        wrapper = write_wrapper(scratch / "identity") if run_cfg.named else None
        cmd = factory_command(run_cfg, binary=factory,
                              config_file=config_file, debug_file=scratch / "factory.debug",
                              parent_death=not detach, wrapper=wrapper)
        env = worker_environment()
        if run_cfg.rack:  # the workers' libraries report their rack with each result
            env[ENV_RACK] = run_cfg.rack
        env[ENV_POOL] = self.name  # the wrapper names workers <pool>-<job>
        cmd, env = self._launch(cmd, env)
        with open(self.log_path, "ab") as log:
            self._proc = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT,
                                          stdin=subprocess.DEVNULL, env=env, cwd=scratch,
                                          start_new_session=True)
        self.pid = self._proc.pid
        deadline = time.monotonic() + STARTUP_CHECK_S
        while time.monotonic() < deadline and self._proc.poll() is None:
            time.sleep(0.05)
        if self._proc.poll() is not None:
            raise PoolError(f"vine_factory for pool {self.name!r} exited with code "
                            f"{self._proc.returncode}; {self.log_path}:\n{self._log_tail()}")
        write_state(self.pool_dir, PoolState(
            name=self.name, batch=self.batch, pid=self.pid, manager=self.config.manager,
            scratch_dir=str(scratch), log=str(self.log_path), started_at=time.time(),
            config=config_to_dict(self.config)))
        return self

    def stop(self, timeout_s: float = STOP_TIMEOUT_S) -> None:
        """Stop the factory and leave no worker job behind (bounded by ``timeout_s`` each)."""
        if self.pid is None:
            state = read_state(self.pool_dir, self.name)
            self.pid = state.pid if state else None
        pid = self.pid
        factory_seen = pid is not None and self.running
        if pid is not None and factory_seen:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGTERM)  # the factory removes its workers
            deadline = time.monotonic() + timeout_s
            while self.running and time.monotonic() < deadline:
                time.sleep(0.1)
            if self.running:
                with contextlib.suppress(ProcessLookupError, PermissionError):
                    os.killpg(pid, signal.SIGKILL)
        if self._proc is not None:
            with contextlib.suppress(subprocess.TimeoutExpired):
                self._proc.wait(timeout=5)
        self._remove_jobs(timeout_s, factory_seen)
        remove_state(self.pool_dir, self.name)
        self.pid, self._proc = None, None

    def status(self) -> PoolStatus:
        cfg = self.config
        details = []
        try:
            connected: int | None = connected_workers(
                cfg.manager_host, cfg.manager_port, password_file=cfg.password_file,
                ssl=cfg.ssl, trust=self.trust, timeout_s=3.0)
        except (ManagerQueryError, ConfigError) as exc:
            connected = None
            details.append(str(exc))
        jobs: dict[str, int] | None
        try:
            jobs = self._jobs()
        except PoolError as exc:
            jobs = None
            details.append(str(exc))
        return PoolStatus(name=self.name, batch=self.batch, manager=cfg.manager,
                          running=self.running, workers_connected=connected, jobs=jobs,
                          detail="; ".join(details))

    def _log_tail(self, lines: int = 20) -> str:
        try:
            return "\n".join(self.log_path.read_text(errors="replace").splitlines()[-lines:])
        except OSError:
            return "(no log)"
