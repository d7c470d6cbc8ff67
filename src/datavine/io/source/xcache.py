"""A ``root://`` URL read through its XCache shard, failing over fast when the shard is down.

:class:`ShardedSource` tries the servers the shard map puts in line for the file
(:meth:`~datavine.io.shards.ShardMap.in_line`: its healthy shards in rendezvous order, the
origin last), marks each shard that fails in the :class:`~datavine.io.shards.ShardHealth` it
was given (a failed shard is skipped while it cools down) and each that opens as healthy
again, and returns the open handle with an :class:`~datavine.io.source.base.OpenRecord`:
who served it, its rack, the file's own shard, and the error of each server that failed
before. Whether that server was near the worker is the run summary's business (it knows the
worker's rack). The XRootD client's fast-failover settings come with
:mod:`datavine.io.source.xrootd`, imported here.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass

import datavine.io.source.xrootd  # noqa: F401  (sets the XRootD client's failover settings)
from datavine.io.shards import ShardHealth, ShardMap, logical_name
from datavine.io.source.base import (
    SERVER_ERRORS,
    H,
    InputUnavailableError,
    Opener,
    OpenRecord,
    Source,
)


@dataclass(frozen=True)
class ShardedSource(Source):
    """Opens a file (any server's URL of it) on the best healthy shard, else the origin.

    ``health`` is shared by every open of the process (a failed shard stays cooled down);
    ``clock`` is ``health``'s clock; exceptions of type ``errors`` count as a failure of the
    server tried (``OSError`` covers XRootD's connection and timeout errors), anything else
    propagates.
    """

    shardmap: ShardMap
    health: ShardHealth
    clock: Callable[[], float] = time.monotonic
    errors: tuple[type[BaseException], ...] = SERVER_ERRORS
    avoid: frozenset[str] = frozenset()  # shards tried last (ShardMap.in_line)

    def open(self, url: str, opener: Opener[H], **options: object) -> tuple[H, OpenRecord]:
        start = self.clock()
        lfn = logical_name(url)
        home = self.shardmap.shard_for(lfn).name
        failures: list[tuple[str, str]] = []
        for server in self.shardmap.in_line(lfn, self.health, start, self.avoid):
            target = self.shardmap.rewrite(url, server)
            try:
                handle = opener(target, **options)
            except self.errors as exc:
                failures.append((server.name, f"{type(exc).__name__}: {exc}"))
                if not server.is_origin:
                    self.health.mark_failed(server, start)
                continue
            if not server.is_origin:
                self.health.mark_ok(server)
            return handle, OpenRecord(lfn, target, server.name, server.rack, len(failures),
                                      tuple(failures), self.clock() - start, home)
        raise InputUnavailableError(url, failures)
