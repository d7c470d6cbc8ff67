"""XCache servers: a real loopback testbed (origin + shards), its config text and statistics.

- :mod:`~datavine.io.xcache.testbed`: :class:`XCacheTestbed`, real ``xrootd`` processes;
- :mod:`~datavine.io.xcache.config` and :mod:`~datavine.io.xcache.stats`: the servers' config text
  and the statistics read back from them; :mod:`~datavine.io.xcache.unix`: ports, folders and
  processes.

Reading files through the shards is the read layer's (:mod:`datavine.io.reading`,
:mod:`datavine.io.source.xcache`); which file lives on which shard is the pure
:mod:`datavine.io.shards`. Importing this package sets the XRootD client's fast-failover
environment (:mod:`datavine.io.source.xrootd`), so that a process that starts a testbed
reads from it, and hands its children, the same settings as the read layer.
"""

import datavine.io.source.xrootd  # noqa: F401  (the XRootD client's environment, on import)
from datavine.io.xcache.stats import CacheStats, FileCacheStats, OriginStats

# The testbed is imported on first use, so that ``python -m datavine.io.xcache.testbed`` does not
# find its own module already imported by this package.
_TESTBED_NAMES = ("ServerProcess", "TestbedError", "XCacheTestbed")


def __getattr__(name: str) -> object:
    if name in _TESTBED_NAMES:
        from datavine.io.xcache import testbed

        return getattr(testbed, name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


__all__ = [
    "CacheStats",
    "FileCacheStats",
    "OriginStats",
    "ServerProcess",
    "TestbedError",
    "XCacheTestbed",
]
