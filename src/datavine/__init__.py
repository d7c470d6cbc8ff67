"""datavine: a data-aware scheduler for particle-physics analysis on TaskVine.

The public entry points::

    import datavine
    with datavine.LocalCluster(workers=2, cores=1) as cluster:
        dask.compute(collection, scheduler=cluster.get)
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING

if TYPE_CHECKING:  # the names below, for type checkers; at run time they load on first use
    from datavine.config import LocalWorkersConfig, ManagerConfig, RunConfig
    from datavine.errors import (
        BundleFailedError,
        ConfigError,
        DatavineError,
        LibraryFailedError,
        MemoryCapError,
        NoWorkersError,
        RemoteTaskError,
        RunTimeoutError,
        TaskLoadError,
        TaskTimeLimitError,
    )
    from datavine.io.reading import open_input
    from datavine.io.shards import ShardMap
    from datavine.manager.cluster import Cluster, LocalCluster
    from datavine.scheduler.memory import MemoryPolicy
    from datavine.scheduler.placement import PlacementPolicy

# Public names and the modules that define them, imported on first use (PEP 562): a worker's
# library, the reaper and ``python -m datavine.<module>`` import only what they need.
_EXPORTS = {
    "Cluster": "datavine.manager.cluster",
    "LocalCluster": "datavine.manager.cluster",
    "ConfigError": "datavine.errors",
    "LocalWorkersConfig": "datavine.config",
    "ManagerConfig": "datavine.config",
    "RunConfig": "datavine.config",
    "BundleFailedError": "datavine.errors",
    "DatavineError": "datavine.errors",
    "LibraryFailedError": "datavine.errors",
    "MemoryCapError": "datavine.errors",
    "NoWorkersError": "datavine.errors",
    "RemoteTaskError": "datavine.errors",
    "RunTimeoutError": "datavine.errors",
    "TaskLoadError": "datavine.errors",
    "TaskTimeLimitError": "datavine.errors",
    "MemoryPolicy": "datavine.scheduler.memory",
    "PlacementPolicy": "datavine.scheduler.placement",
    "open_input": "datavine.io.reading",
    "ShardMap": "datavine.io.shards",
}


def __getattr__(name: str) -> object:
    module = _EXPORTS.get(name)
    if module is None:
        raise AttributeError(f"module 'datavine' has no attribute {name!r}")
    value = getattr(importlib.import_module(module), name)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted([*globals(), *_EXPORTS])


__version__ = "0.1.0"

__all__ = [
    "BundleFailedError",
    "Cluster",
    "ConfigError",
    "DatavineError",
    "LibraryFailedError",
    "LocalCluster",
    "LocalWorkersConfig",
    "ManagerConfig",
    "MemoryCapError",
    "MemoryPolicy",
    "NoWorkersError",
    "PlacementPolicy",
    "RemoteTaskError",
    "RunConfig",
    "RunTimeoutError",
    "ShardMap",
    "TaskLoadError",
    "TaskTimeLimitError",
    "open_input",
]
