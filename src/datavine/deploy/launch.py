"""How a command gets its cluster: the one place that chooses and starts one.

``datavine run``, ``datavine scale-test`` and the coffea executor's embedded cluster all
start clusters here, so they agree on the defaults a user expects:

- local workers default to one 1-core worker per core here (:func:`default_workers`), and are
  split over the racks of the run's shard map, so that placement near the shards has
  somewhere to go (:func:`local_cluster`);
- ``pool_workers`` is a manager that waits for that many workers from a pool started
  elsewhere (``datavine pool start``, ``vine_factory``); a facility file with pools, and no
  local workers asked for, starts its pools (:func:`choose_cluster`);
- a command's manager directory is a temporary directory the reaper removes even when the
  client is killed, and TaskVine's last logs are written (the manager collected) before it
  goes (:func:`run_directory`); :func:`started` closes the cluster with the command, also when
  its start fails half-way;
- every cluster serves the live view of its runs (:mod:`datavine.dashboard`) unless
  ``dashboard=False``.
"""

from __future__ import annotations

import contextlib
import gc
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from datavine.config import ManagerConfig, RunConfig
from datavine.deploy.local_workers import default_workers
from datavine.deploy.reaper import temporary_directory
from datavine.errors import ConfigError

if TYPE_CHECKING:
    from datavine.dashboard.launch import DashboardConfig
    from datavine.deploy.facility import Facility
    from datavine.manager.cluster import Cluster, LocalCluster


def run_directory(stack: contextlib.ExitStack, prefix: str = "datavine-run-") -> Path:
    """A manager run directory that lives as long as ``stack``."""
    path = Path(stack.enter_context(temporary_directory(prefix)))
    stack.callback(gc.collect)  # runs first: the manager writes its logs when collected
    return path


def local_cluster(run: RunConfig, manager: ManagerConfig, *, workers: int | None = None,
                  cores: int = 1, memory_mb: int | None = None, features: tuple[str, ...] = (),
                  racks: tuple[str, ...] = (), connect_timeout_s: float = 60.0,
                  dashboard: bool | DashboardConfig | None = None) -> LocalCluster:
    """Local workers (not started): ``workers`` or one per core here, in ``racks`` or the
    racks of ``run.shardmap``'s shards."""
    from datavine.manager.cluster import LocalCluster

    return LocalCluster(workers=workers or default_workers(), cores=cores, memory_mb=memory_mb,
                        features=features, racks=racks or shard_racks(run), manager=manager,
                        run=run, connect_timeout_s=connect_timeout_s, dashboard=dashboard)


def shard_racks(run: RunConfig) -> tuple[str, ...]:
    """The racks of the run's shards, in order, each once (none without a shard map)."""
    if run.shardmap is None:
        return ()
    return tuple(dict.fromkeys(s.rack for s in run.shardmap.shards if s.rack))


@dataclass(frozen=True)
class Chosen:
    """A cluster (not started) and what it is, in words for the command's first line."""

    cluster: Cluster
    kind: str


def choose_cluster(run: RunConfig, manager: ManagerConfig, *, workers: int | None = None,
                   pool_workers: int | None = None, facility: Facility | None = None,
                   connect_timeout_s: float = 60.0,
                   dashboard: bool | DashboardConfig | None = None) -> Chosen:
    """Local workers (``workers``, or the facility's ``[local_workers]``), a manager waiting
    for ``pool_workers`` from a pool started elsewhere (0: do not wait), or the facility's
    pools when it has some and no local workers are asked for. ``dashboard``: the
    cluster's live view (:func:`datavine.dashboard.launch.dashboard_config`)."""
    from datavine.deploy.facility import FacilityCluster
    from datavine.manager.cluster import Cluster

    if pool_workers is not None and workers is not None:
        raise ConfigError("local workers (--workers) and a pool's (--pool-workers) exclude "
                          "each other")
    if pool_workers is not None:
        return Chosen(Cluster(manager, run, min_workers=pool_workers,
                              connect_timeout_s=connect_timeout_s, dashboard=dashboard),
                      f"{pool_workers} pool worker(s)")
    if facility is not None and facility.pools and workers is None:
        from datavine.dashboard.launch import dashboard_config

        pools = FacilityCluster(facility, run)
        pools.dashboard_config = dashboard_config(dashboard)
        return Chosen(pools, f"pools {', '.join(p.name for p in facility.pools)}")
    local = facility.local_workers if facility is not None else None
    n = workers or (local.workers if local else default_workers())
    cluster = local_cluster(run, manager, workers=n, cores=local.cores if local else 1,
                            memory_mb=local.memory_mb if local else None,
                            features=local.features if local else (),
                            racks=local.racks if local else (),
                            connect_timeout_s=connect_timeout_s, dashboard=dashboard)
    return Chosen(cluster, f"{n} local worker(s)")


def started(stack: contextlib.ExitStack, cluster: Cluster) -> Cluster:
    """``cluster`` started, and closed when ``stack`` closes (also if starting fails)."""
    stack.callback(cluster.close)
    cluster.start()
    return cluster
