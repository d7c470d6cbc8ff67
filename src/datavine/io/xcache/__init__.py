"""XCache: a real loopback testbed (origin + shards) and shard-aware input opening.

- :mod:`~datavine.io.xcache.testbed`: :class:`XCacheTestbed`, real ``xrootd`` processes;
- :mod:`~datavine.io.xcache.reader`: :func:`open_with_failover`; importing this package sets the
  XRootD client's fast-failover environment (see the reader's docstring for why);
- :mod:`~datavine.io.xcache.config` and :mod:`~datavine.io.xcache.stats`: the servers' config text
  and the statistics read back from them.

The shard map itself (which file lives on which shard) is pure and lives in
:mod:`datavine.io.shards`.
"""

from datavine.io.xcache.reader import (
    InputUnavailableError,
    OpenRecord,
    bytes_read,
    configure_xrootd_client,
    open_with_failover,
)
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
    "InputUnavailableError",
    "OpenRecord",
    "OriginStats",
    "ServerProcess",
    "TestbedError",
    "XCacheTestbed",
    "bytes_read",
    "configure_xrootd_client",
    "open_with_failover",
]
