"""The cluster a command runs on: ``datavine run`` and ``datavine scale-test`` ask here.

A command turns its options into one :class:`ClusterRequest` (the facility file, the shards
read through, the progress bar, the bounds, memory caps, the manager's port, password and
address, local workers or a pool's) and :func:`start_command_cluster` makes the run settings
and the manager from it, chooses the cluster (:mod:`datavine.deploy.launch`: local workers,
a pool started elsewhere, or the facility's pools) and starts it, closed with the command.
What the command prints about its cluster stays the command's.
"""

from __future__ import annotations

import contextlib
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from datavine.config import ManagerConfig, RunConfig
from datavine.deploy import launch
from datavine.deploy.local_workers import default_workers

if TYPE_CHECKING:
    from datavine.dashboard.launch import DashboardConfig
    from datavine.dashboard.metrics_listener import MetricsConfig
    from datavine.deploy.facility import Facility
    from datavine.io.shards import ShardMap


@dataclass(frozen=True)
class ClusterRequest:
    """What a command's options ask of its cluster.

    Attributes:
        facility: the manager, run settings and pools (or local workers) of a facility
            file; the manager's settings below are then not used.
        shardmap: the shards the data is read through (local workers go to their racks).
        progress, timeout_s, memory_caps, task_time_limit_s, no_worker_timeout_s: the run
            settings (``None``: the facility's, else :class:`~datavine.config.RunConfig`'s).
        port, password_file, listen_host: the manager's, without a facility.
        workers, cores, memory_mb: local workers (``workers`` ``None``: the facility's
            ``[local_workers]``, else one per core here).
        pool_workers: wait for this many workers of a pool started elsewhere instead (0:
            do not wait).
        connect_timeout_s: how long to wait for the workers.
        dashboard: the cluster's live view (:func:`datavine.dashboard.launch.dashboard_config`).
        run_dir_prefix: the name of the manager's temporary run directory.
        column_cache: ``False`` turns the workers' column caches off
            (``RunConfig.column_cache``); ``True`` keeps the run settings'.
        column_cache_share: the column cache's share of a bundle's memory cap
            (``RunConfig.column_cache_share``; ``None`` keeps the run settings').
        metrics: the manager's own ``/metrics`` listener (``None``: ``DATAVINE_METRICS``,
            else the facility file's ``[metrics] listen``, else none).
    """

    facility: Facility | None = None
    shardmap: ShardMap | None = None
    progress: bool = False
    timeout_s: float | None = None
    memory_caps: bool = True
    task_time_limit_s: float | None = None
    no_worker_timeout_s: float | None = None
    port: int = 0
    password_file: Path | None = None
    listen_host: str = "127.0.0.1"
    workers: int | None = None
    cores: int = 1
    memory_mb: int | None = None
    pool_workers: int | None = None
    connect_timeout_s: float = 60.0
    dashboard: bool | DashboardConfig | None = None
    run_dir_prefix: str = "datavine-run-"
    column_cache: bool = True
    column_cache_share: float | None = None
    metrics: MetricsConfig | None = None

    def run_config(self) -> RunConfig:
        """The run settings: the facility's (or the defaults) with the command's (pure)."""
        run = self.facility.run if self.facility is not None else RunConfig()
        run = run.replace(progress=self.progress, shardmap=self.shardmap,
                          timeout_s=self.timeout_s if self.timeout_s is not None
                          else run.timeout_s)
        if self.no_worker_timeout_s is not None:
            run = run.replace(no_worker_timeout_s=self.no_worker_timeout_s)
        if not self.memory_caps:
            run = run.replace(memory=None)
        if self.task_time_limit_s is not None:
            run = run.replace(task_time_limit_s=self.task_time_limit_s)
        if not self.column_cache:
            run = run.replace(column_cache=False)
        if self.column_cache_share is not None:
            run = run.replace(column_cache_share=self.column_cache_share)
        return run


def start_command_cluster(stack: contextlib.ExitStack, request: ClusterRequest) -> launch.Chosen:
    """The command's cluster, chosen as ``request`` asks and started; closed by ``stack``
    (also when its start fails half-way)."""
    run = request.run_config()
    if request.facility is not None:
        manager = request.facility.manager
    else:
        manager = ManagerConfig(port=request.port, password_file=request.password_file,
                                listen_host=request.listen_host,
                                run_dir=launch.run_directory(stack, request.run_dir_prefix))
    if request.facility is None and request.pool_workers is None:
        n = request.workers or default_workers()
        chosen = launch.Chosen(
            launch.local_cluster(run, manager, workers=n, cores=request.cores,
                                 memory_mb=request.memory_mb,
                                 connect_timeout_s=request.connect_timeout_s,
                                 dashboard=request.dashboard),
            f"{n} local worker(s)")
    else:
        chosen = launch.choose_cluster(run, manager, workers=request.workers,
                                       pool_workers=request.pool_workers,
                                       facility=request.facility,
                                       connect_timeout_s=request.connect_timeout_s,
                                       dashboard=request.dashboard)
    if request.metrics is not None:  # before it starts: the listener starts with it
        chosen.cluster.metrics_config = request.metrics
    launch.started(stack, chosen.cluster)
    return chosen
