"""Clusters: a datavine manager plus the workers it runs on, as one context manager.

``LocalCluster`` is the embedded default: a manager on this host and real ``vine_worker``
processes on 127.0.0.1, authenticated with a password file created for the run::

    with datavine.LocalCluster(workers=2, cores=1) as cluster:
        dask.compute(x, scheduler=cluster.get)

``Cluster`` takes an already-running or externally started pool (HTCondor through
vine_factory, see :mod:`datavine.deploy.pools`): it only starts the manager and waits for workers.

While a cluster is open, SIGTERM and SIGHUP end the program as cleanly as Ctrl-C
(:mod:`datavine.deploy.signals`), and should the program be killed outright its reaper stops the
local workers and removes the run directory that the cluster made (:mod:`datavine.deploy.reaper`).
A run directory the cluster made itself (no ``ManagerConfig.run_dir`` given) is removed
when it closes.
"""

from __future__ import annotations

import contextlib
import secrets
import shutil
import tempfile
import time
from pathlib import Path
from types import TracebackType
from typing import Any

from datavine.config import LocalWorkersConfig, ManagerConfig, RunConfig
from datavine.deploy.local_workers import LocalWorkers, local_worker_id
from datavine.deploy.reaper import reaper
from datavine.deploy.signals import terminate_gracefully
from datavine.manager.environment import PackedEnv
from datavine.manager.runtime import Runtime
from datavine.scheduler.labels import rack_of


def make_password_file(directory: Path) -> Path:
    """A fresh random TaskVine password, readable by its owner only."""
    directory.mkdir(parents=True, exist_ok=True)
    path = directory / "vine.password"
    path.write_text(secrets.token_hex(32))
    path.chmod(0o600)
    return path


class Cluster:
    """A datavine manager; workers come from elsewhere (a pool) and authenticate to it."""

    def __init__(self, manager: ManagerConfig | None = None, run: RunConfig | None = None,
                 *, min_workers: int = 0, connect_timeout_s: float = 60.0,
                 environment: PackedEnv | None = None) -> None:
        self._own_run_dir: Path | None = None
        if manager is None:
            self._own_run_dir = Path(tempfile.mkdtemp(prefix="datavine-"))
            manager = ManagerConfig(run_dir=self._own_run_dir)
        if manager.password_file is None:
            from dataclasses import replace

            manager = replace(manager, password_file=make_password_file(Path(manager.run_dir)))
        self.manager_config = manager
        self.run_config = run or RunConfig()
        self.min_workers = min_workers
        self.connect_timeout_s = connect_timeout_s
        self.environment = environment
        self.runtime: Runtime | None = None
        self._open = contextlib.ExitStack()  # signal handlers while the cluster is open

    @property
    def port(self) -> int:
        return self._rt.port

    @property
    def password_file(self) -> Path:
        assert self.manager_config.password_file is not None
        return Path(self.manager_config.password_file)

    @property
    def _rt(self) -> Runtime:
        if self.runtime is None:
            raise RuntimeError("the cluster is not started: use 'with' or call start()")
        return self.runtime

    def start(self) -> Cluster:
        self._open.enter_context(terminate_gracefully())
        if self._own_run_dir is not None:
            reaper().add_path(self._own_run_dir)
            if not self.password_file.exists():  # started again after a close
                make_password_file(self._own_run_dir)
        self.runtime = Runtime(self.manager_config, self.run_config, liveness=self._alive,
                               environment=self.environment)
        self._start_workers()
        self._wait_ready()
        return self

    def _start_workers(self) -> None:
        """Subclasses start their workers here."""

    def _wait_ready(self) -> None:
        """Wait for ``min_workers`` (NoWorkersError after ``connect_timeout_s``), then start
        the library on each that has a name (they say it when they connect: a pool's, or
        ``vine_worker --feature worker:NAME`` by hand), so that the first run does not pay
        for library starts, as it does not pay for pool starts."""
        if self.min_workers:
            self._rt.wait_for_workers(self.min_workers, self.connect_timeout_s)
            self._rt.warm_connected(self.connect_timeout_s)

    def _alive(self) -> set[str]:
        """Names of the workers this cluster started that still run (none here)."""
        return set()

    def get(self, dsk: Any, keys: Any, **kwargs: Any) -> Any:
        """The dask scheduler callable."""
        return self._rt.get(dsk, keys, **kwargs)

    @property
    def last_summary(self) -> Any:
        return self._rt.last_summary

    def close(self) -> None:
        if self.runtime is not None:
            self.runtime.close()
            self.runtime = None
        if self._own_run_dir is not None:
            shutil.rmtree(self._own_run_dir, ignore_errors=True)
            reaper().remove_path(self._own_run_dir)
        self._open.close()

    def __enter__(self) -> Cluster:
        try:
            return self.start()
        except BaseException:
            self.close()  # workers or a manager started before the failure
            raise

    def __exit__(self, exc_type: type[BaseException] | None, exc: BaseException | None,
                 tb: TracebackType | None) -> None:
        self.close()


class LocalCluster(Cluster):
    """A manager plus ``workers`` local vine_worker processes of ``cores`` cores each."""

    def __init__(self, workers: int = 2, cores: int = 1, *, memory_mb: int | None = None,
                 features: tuple[str, ...] = (), racks: tuple[str, ...] = (),
                 manager: ManagerConfig | None = None,
                 run: RunConfig | None = None, connect_timeout_s: float = 60.0,
                 environment: PackedEnv | None = None, warm_up: bool = True,
                 **run_options: Any) -> None:
        run = (run or RunConfig()).replace(**run_options) if run_options else run
        super().__init__(manager, run, min_workers=workers, connect_timeout_s=connect_timeout_s,
                         environment=environment)
        self.warm_up = warm_up
        self.warm_libraries: set[tuple[str, int]] = set()  # (worker id, library PID)
        self.workers_config = LocalWorkersConfig(workers=workers, cores=cores,
                                                 memory_mb=memory_mb, features=features,
                                                 racks=tuple(racks))
        self.workers: LocalWorkers | None = None

    def _start_workers(self) -> None:
        self.workers = LocalWorkers(
            self.workers_config, self.port, Path(self.manager_config.run_dir) / "workers",
            password_file=self.password_file, ssl=self.manager_config.ssl is not None,
            host=self._rt.contact_host, transfer_address=self._rt.listen_address)
        self.workers.start()
        cfg = self.workers_config
        for i in range(cfg.workers):
            self._rt.topology.announce(local_worker_id(i), rack_of(i, cfg.workers, cfg.racks),
                                       cfg.cores)

    def start(self) -> LocalCluster:
        """Start the manager and the workers, wait for them, and (``warm_up``) start the
        library on every worker core, so that the first run does not wait for it."""
        super().start()
        return self

    def _wait_ready(self) -> None:
        """With ``warm_up``, the library's first calls (one per core, each for its worker)
        go out before the workers have connected: each is sent as its worker connects, so
        the libraries start while the other workers are still connecting. Waiting for the
        workers first cost a whole second here (TaskVine's waits are whole seconds, the
        workers connect within ~0.3 s) before any library started."""
        if not self.warm_up:
            super()._wait_ready()
            return
        cfg = self.workers_config
        cores = {local_worker_id(i): cfg.cores for i in range(cfg.workers)}
        started = time.monotonic()
        self.warm_libraries = self._rt.warm_up(cores, self.connect_timeout_s)
        # all connected by now, or NoWorkersError naming how many did within the bound
        self._rt.wait_for_workers(self.min_workers, 0.0, waited_s=time.monotonic() - started)

    def _alive(self) -> set[str]:
        return self.workers.alive_ids() if self.workers is not None else set()

    def close(self) -> None:
        if self.workers is not None:
            self.workers.stop()
            self.workers = None
        super().close()
