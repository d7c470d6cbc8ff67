"""Worker pools: ways to get TaskVine workers connected to a datavine manager.

What belongs here: starting, watching and stopping groups of workers that run elsewhere
than the manager's own process: ``vine_factory`` pools on HTCondor (:class:`CondorPool`)
or on this host (:class:`LocalFactoryPool`), their configuration (:class:`FactoryConfig`,
turned into vine_factory's command line by pure code), their state files, and the
``datavine pool`` commands. What does not: the manager and scheduling
(:mod:`datavine.manager.runtime`) and the in-process test workers
(:mod:`datavine.deploy.local_workers`).

::

    cfg = FactoryConfig("127.0.0.1", port, workers=2, password_file=pw, idle_timeout_s=60)
    with CondorPool(cfg, name="analysis") as pool:
        ...  # the manager's owner runs work; pool.status() shows jobs and workers
"""

from datavine.deploy.pools.base import PoolError, PoolStatus, PoolTimeoutError, WorkerPool
from datavine.deploy.pools.condor import CondorPool
from datavine.deploy.pools.factory import FactoryConfig, factory_command, factory_json, rack_feature
from datavine.deploy.pools.factory_pool import FactoryPool
from datavine.deploy.pools.local import LocalFactoryPool
from datavine.deploy.pools.manager_status import ManagerQueryError, connected_workers, query_manager

__all__ = [
    "CondorPool",
    "FactoryConfig",
    "FactoryPool",
    "LocalFactoryPool",
    "ManagerQueryError",
    "PoolError",
    "PoolStatus",
    "PoolTimeoutError",
    "WorkerPool",
    "connected_workers",
    "factory_command",
    "factory_json",
    "query_manager",
    "rack_feature",
]
