"""datavine: a data-aware scheduler for particle-physics analysis on TaskVine.

The public entry points::

    import datavine
    with datavine.LocalCluster(workers=2, cores=1) as cluster:
        dask.compute(collection, scheduler=cluster.get)
"""

from datavine.cluster import Cluster, LocalCluster
from datavine.config import ConfigError, LocalWorkersConfig, ManagerConfig, RunConfig
from datavine.errors import (
    BundleFailedError,
    DatavineError,
    LibraryFailedError,
    MemoryCapError,
    NoWorkersError,
    RemoteTaskError,
    RunTimeoutError,
    TaskLoadError,
)
from datavine.memory import MemoryPolicy
from datavine.placement import PlacementPolicy
from datavine.reading import open_input
from datavine.shards import ShardMap

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
    "open_input",
]
