"""Clusters: a datavine manager plus the workers it runs on, as one context manager.

``LocalCluster`` is the embedded default: a manager on this host and real ``vine_worker``
processes on 127.0.0.1, authenticated with a password file created for the run (mode 0600
from its creation on; a password file the user names in ``ManagerConfig.password_file`` is
refused while group or others may open it; with TLS, ``ManagerConfig.ssl_key``/``ssl_cert``,
each worker is pinned to the manager's certificate and connects to no other)::

    with datavine.LocalCluster(workers=2, cores=1) as cluster:
        dask.compute(x, scheduler=cluster.get)

``Cluster`` takes an already-running or externally started pool (HTCondor through
vine_factory, see :mod:`datavine.deploy.pools`): it only starts the manager and waits for workers.

While a cluster is open, SIGTERM and SIGHUP end the program as cleanly as Ctrl-C
(:mod:`datavine.deploy.signals`), and should the program be killed outright its reaper stops the
local workers and removes the run directory that the cluster made (:mod:`datavine.deploy.reaper`).
A run directory the cluster made itself (no ``ManagerConfig.run_dir`` given) is removed
when it closes.

Each cluster serves a live view of its runs (:mod:`datavine.dashboard`) at
``cluster.dashboard_url`` (127.0.0.1 unless ``dashboard=DashboardConfig(address=...)``,
which then takes an access token); ``dashboard=False`` (or ``DATAVINE_DASHBOARD=0``) starts
none. ``cluster.save_report(path)`` saves the last run's view as one HTML file. The view's
server also serves Prometheus metrics at ``/metrics``; ``metrics=True`` (or
``metrics=MetricsConfig(port=...)``, or ``DATAVINE_METRICS=[ADDRESS:]PORT``) serves them from
the manager's process too, with or without the view (:mod:`datavine.dashboard.metrics_listener`).

``with cluster.subscribe_results(hook):`` has ``hook(keys, values)`` called after each
delivery of the runs within the block (the coffea executor's progress and partial merge).
"""

from __future__ import annotations

import contextlib
import logging
import secrets
import shutil
import tempfile
import time
from collections.abc import Hashable, Iterator, Mapping
from pathlib import Path
from types import TracebackType
from typing import Any, Self, cast

from datavine.config import LocalWorkersConfig, ManagerConfig, RunChanges, RunConfig
from datavine.dashboard.events import NO_SINK
from datavine.dashboard.launch import Dashboard, DashboardConfig, dashboard_config
from datavine.dashboard.metrics_listener import (
    MetricsConfig,
    MetricsListener,
    metrics_config,
    metrics_missing,
)
from datavine.deploy.local_workers import LocalWorkers, local_worker_id
from datavine.deploy.reaper import reaper
from datavine.deploy.signals import terminate_gracefully
from datavine.deploy.tls import ManagerTrust
from datavine.manager.environment import PackedEnv
from datavine.manager.port import ResultHook
from datavine.manager.runtime import Runtime
from datavine.safe_paths import check_private_file, write_secret
from datavine.scheduler.labels import rack_of
from datavine.scheduler.lifecycle import Lifecycle, Step
from datavine.scheduler.summary import RunSummary

log = logging.getLogger("datavine")


def make_password_file(directory: Path) -> Path:
    """A fresh random TaskVine password, readable by its owner only from its creation on
    (a previous run's in ``directory`` is replaced)."""
    directory.mkdir(parents=True, exist_ok=True)
    return write_secret(directory / "vine.password", secrets.token_hex(32), replace=True)


def manager_pin(manager: ManagerConfig) -> ManagerTrust | None:
    """The trust of workers started here for ``manager``: its own certificate's fingerprint
    when it has TLS (``ssl_cert``), else None (no TLS, nothing to check)."""
    if manager.ssl_cert is None:
        return None
    return ManagerTrust.pinned_to(Path(manager.ssl_cert))


class Cluster:
    """A datavine manager; workers come from elsewhere (a pool) and authenticate to it."""

    def __init__(self, manager: ManagerConfig | None = None, run: RunConfig | None = None,
                 *, min_workers: int = 0, connect_timeout_s: float = 60.0,
                 environment: PackedEnv | None = None,
                 dashboard: bool | DashboardConfig | None = None,
                 metrics: bool | MetricsConfig | None = None) -> None:
        self._own_run_dir: Path | None = None
        if manager is None:
            self._own_run_dir = Path(tempfile.mkdtemp(prefix="datavine-"))
            manager = ManagerConfig(run_dir=self._own_run_dir)
        if manager.password_file is None:
            from dataclasses import replace

            manager = replace(manager, password_file=make_password_file(Path(manager.run_dir)))
        else:  # the user's own: refused while group or others may read it
            check_private_file(manager.password_file, "ManagerConfig.password_file")
        self.manager_config = manager
        self.run_config = run or RunConfig()
        self.min_workers = min_workers
        self.connect_timeout_s = connect_timeout_s
        self.environment = environment
        self.runtime: Runtime | None = None
        self.dashboard_config = dashboard_config(dashboard)
        self.dashboard: Dashboard | None = None
        self.dashboard_error: str | None = None  # why there is no view, when asked for one
        self.metrics_config = metrics_config(metrics)
        self.metrics: MetricsListener | None = None
        self.metrics_error: str | None = None  # why there is no listener, when asked for one
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

    def start(self) -> Self:
        self._open.enter_context(terminate_gracefully())
        if self._own_run_dir is not None:
            reaper().add_path(self._own_run_dir)
            if not self.password_file.exists():  # started again after a close
                make_password_file(self._own_run_dir)
        self._start_dashboard()
        self.runtime = Runtime(self.manager_config, self.run_config, liveness=self._alive,
                               environment=self.environment)
        if self.dashboard is not None:
            self.runtime.event_sink = self.dashboard.sink
        self._start_workers()
        self._publish_processes()
        self._wait_ready()
        self._dashboard_ready()
        self._start_metrics()
        return self

    # --- the live view (datavine.dashboard) ----------------------------------------------------
    def _start_dashboard(self) -> None:
        """Start the view's server first: it gets ready while the workers connect."""
        from datavine.dashboard.launch import dashboard_missing

        self.dashboard = None
        if self.dashboard_config is None:
            return
        why = dashboard_missing()
        if why:
            log.info("datavine: no dashboard: %s", why)
            self.dashboard_error = why
            return
        self.dashboard = Dashboard(Path(self.manager_config.run_dir) / "dashboard",
                                   self.dashboard_config)
        self.dashboard.start()

    def _publish_processes(self) -> None:
        """Workers started here, by name and PID (the view reads their memory and CPU)."""
        pids = self._worker_pids()
        if self.dashboard is not None and pids:
            self.dashboard.sink.local_processes(pids)

    def _worker_pids(self) -> dict[str, int]:
        return {}

    def _dashboard_ready(self) -> None:
        """Wait (bounded) for the view's server; tell it the pool as it is now."""
        if self.dashboard is None:
            return
        if self.dashboard.wait_ready() is None:
            self.dashboard_error = self.dashboard.error
            log.warning("datavine: no dashboard: %s", self.dashboard.error)
            self.dashboard.close()
            self._rt.event_sink = NO_SINK
            self.dashboard = None
            return
        with contextlib.suppress(Exception):  # a look at the pool must not stop the start
            self.dashboard.sink.pool_now(self._rt.topology.workers.values(),
                                         self._rt.library_states(time.monotonic()))

    def _start_metrics(self) -> None:
        """The manager's own /metrics listener, when asked for: it folds the view's events,
        or has the runs write events for it alone; like the view, one that cannot start
        leaves the run going without it (``metrics_error`` says why)."""
        if self.metrics_config is None:
            return
        why = metrics_missing()
        if why is None:
            shared = self.dashboard.events_path if self.dashboard is not None else None
            listener = MetricsListener(self.metrics_config,
                                       Path(self.manager_config.run_dir) / "metrics", shared)
            try:
                listener.start()
            except OSError as exc:
                listener.close()
                why = str(exc)
            else:
                self.metrics = listener
        if self.metrics is None:
            self.metrics_error = why
            log.warning("datavine: no metrics listener: %s", why)
            return
        listener = self.metrics
        if listener.sink is not None:
            self._rt.event_sink = listener.sink
            with contextlib.suppress(Exception):  # a look at the pool must not stop the start
                listener.sink.pool_now(self._rt.topology.workers.values(),
                                       self._rt.library_states(time.monotonic()))

    def expect_events(self, weights: Mapping[Hashable, int]) -> None:
        """Physics events per task key of the next run, for events/s in the live view and
        the metrics (whichever of them the runs write for)."""
        self._rt.event_sink.expect_events(weights)

    @property
    def metrics_url(self) -> str | None:
        """Where the run's Prometheus metrics are served: the manager's listener, else the
        live view's server (both take the view's or listener's token as a bearer token)."""
        if self.metrics is not None:
            return self.metrics.url
        return self.dashboard.metrics_url if self.dashboard is not None else None

    @property
    def dashboard_url(self) -> str | None:
        """The live view's address (with its access token, if it takes one), or None."""
        return self.dashboard.url if self.dashboard is not None else None

    def save_report(self, path: str | Path, title: str = "datavine run") -> Path | None:
        """The last run's view as one self-contained HTML file (None without a view)."""
        if self.dashboard is None:
            return None
        return self.dashboard.save_report(path, title)

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

    def get(self, dsk: object, keys: object, **kwargs: object) -> Any:
        """The dask scheduler callable (:meth:`Runtime.get
        <datavine.manager.runtime.Runtime.get>`)."""
        return self._rt.get(dsk, keys, **kwargs)

    @contextlib.contextmanager
    def subscribe_results(self, hook: ResultHook) -> Iterator[None]:
        """``hook(keys, values)`` after each delivery of the runs started within the block
        (:meth:`Runtime.subscribe_results <datavine.manager.runtime.Runtime.subscribe_results>`)."""
        with self._rt.subscribe_results(hook):
            yield

    @property
    def last_summary(self) -> RunSummary | None:
        return self._rt.last_summary

    def drop_caches(self) -> None:
        """Empty the workers' column caches (:mod:`datavine.io.column_cache`) for a cold
        measurement: each worker empties its cache before its next bundle of the next run
        (the bundles carry a new cache epoch), and placement counts no worker as holding a
        file's columns."""
        self._rt.learned.topology.drop_caches()

    def story(self, what: Hashable) -> list[Step]:
        """What happened in the last run to a task (its dask key) or a bundle (its number):
        each step with its time -- sent where, running on which worker, retried why, failed
        over from which shard, done where (:mod:`datavine.scheduler.lifecycle`). Each step
        prints as a line: ``print(*cluster.story(key), sep="\\n")``. KeyError when the last run
        had no such task, or there was no run."""
        summary = self._rt.last_summary
        if summary is None:
            raise KeyError(f"no run on this cluster yet: no story of {what!r}")
        return Lifecycle.from_dict(summary.lifecycle).story(what)

    def close(self) -> None:
        if self.metrics is not None:
            self.metrics.close()
            self.metrics = None
        if self.dashboard is not None:
            self.dashboard.close()
            self.dashboard = None
        if self.runtime is not None:
            self.runtime.close()
            self.runtime = None
        if self._own_run_dir is not None:
            shutil.rmtree(self._own_run_dir, ignore_errors=True)
            reaper().remove_path(self._own_run_dir)
        self._open.close()

    def __enter__(self) -> Self:
        try:
            return self.start()
        except BaseException:
            self.close()  # workers or a manager started before the failure
            raise

    def __exit__(self, exc_type: type[BaseException] | None, exc: BaseException | None,
                 tb: TracebackType | None) -> None:
        self.close()


class LocalCluster(Cluster):
    """A manager plus ``workers`` local vine_worker processes of ``cores`` cores each;
    ``run_options``: fields of :class:`datavine.config.RunConfig` that change ``run``."""

    def __init__(self, workers: int = 2, cores: int = 1, *, memory_mb: int | None = None,
                 features: tuple[str, ...] = (), racks: tuple[str, ...] = (),
                 manager: ManagerConfig | None = None,
                 run: RunConfig | None = None, connect_timeout_s: float = 60.0,
                 environment: PackedEnv | None = None, warm_up: bool = True,
                 dashboard: bool | DashboardConfig | None = None,
                 metrics: bool | MetricsConfig | None = None,
                 **run_options: object) -> None:
        # checked first (ConfigError naming the setting), before a run folder is made
        self.workers_config = LocalWorkersConfig(workers=workers, cores=cores,
                                                 memory_mb=memory_mb, features=features,
                                                 racks=tuple(racks))
        # RunChanges' items, but for ``racks`` (the workers' here): replace checks the names
        changes = cast(RunChanges, run_options)
        run = (run or RunConfig()).replace(**changes) if changes else run
        super().__init__(manager, run, min_workers=workers, connect_timeout_s=connect_timeout_s,
                         environment=environment, dashboard=dashboard, metrics=metrics)
        self.warm_up = warm_up
        self.warm_libraries: set[tuple[str, int]] = set()  # (worker id, library PID)
        self.workers: LocalWorkers | None = None

    def _start_workers(self) -> None:
        """Start the local workers; with TLS, each pinned to the manager's own certificate
        (``--ssl-fingerprint``): one that reaches another manager does not connect."""
        self.workers = LocalWorkers(
            self.workers_config, self.port, Path(self.manager_config.run_dir) / "workers",
            password_file=self.password_file, ssl=self.manager_config.ssl is not None,
            host=self._rt.contact_host, transfer_address=self._rt.listen_address,
            trust=manager_pin(self.manager_config))
        self.workers.start()
        cfg = self.workers_config
        for i in range(cfg.workers):
            self._rt.topology.announce(local_worker_id(i), rack_of(i, cfg.workers, cfg.racks),
                                       cfg.cores)

    def start(self) -> Self:
        """Start the manager and the workers, wait for them, and (``warm_up``) start the
        library on every worker core, so that the first run does not wait for it."""
        return super().start()

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

    def _worker_pids(self) -> dict[str, int]:
        if self.workers is None:
            return {}
        return {local_worker_id(i): p.pid for i, p in enumerate(self.workers.procs)}

    def close(self) -> None:
        if self.workers is not None:
            self.workers.stop()
            self.workers = None
        super().close()
