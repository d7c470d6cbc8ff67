"""datavine: a data-aware scheduler for particle-physics analysis on TaskVine.

The public entry points::

    import datavine
    with datavine.LocalCluster(workers=2, cores=1) as cluster:
        dask.compute(collection, scheduler=cluster.get)
"""

from datavine.cluster import Cluster, LocalCluster
from datavine.config import LocalWorkersConfig, ManagerConfig, RunConfig
from datavine.errors import (
    BundleFailedError,
    DatavineError,
    MemoryCapError,
    NoWorkersError,
    RemoteTaskError,
    RunTimeoutError,
)

__version__ = "0.1.0"

__all__ = [
    "BundleFailedError",
    "Cluster",
    "DatavineError",
    "LocalCluster",
    "LocalWorkersConfig",
    "ManagerConfig",
    "MemoryCapError",
    "NoWorkersError",
    "RemoteTaskError",
    "RunConfig",
    "RunTimeoutError",
]
