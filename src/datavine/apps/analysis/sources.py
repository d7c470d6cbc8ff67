"""Where a chunk's events come from: local files, or XCache shards with fast failover.

:func:`datavine.apps.analysis.agc.process_chunk` reads a path, a URL or an already-open uproot
file; it knows nothing of shards. This module is the adapter between the two: a *chunk
source* turns a :class:`~datavine.apps.analysis.agc.Chunk` into a :class:`SourcedResult`, the
chunk's :class:`~datavine.apps.analysis.agc.ChunkResult` plus which server delivered the bytes.
Both sources open the chunk's file through the read layer
(:func:`datavine.io.reading.open_served`), which picks the way, accounts the bytes as near or
far, and says who served the file; the open file is handed to ``process_chunk``:

- :class:`LocalFiles`: the chunk's ``path`` is a local file, read where it is;
- :class:`XCacheShards`: the chunk's ``path`` is a ``root://`` URL of the file at the origin,
  read on the file's shard (rendezvous order of the :class:`~datavine.io.shards.ShardMap`,
  skipping shards that failed recently, the origin last).

Sources are small, picklable values, so a task carries its source with it; shard health is
kept per process by :mod:`datavine.io.reading` (a worker's library lives across calls, so a
dead shard is skipped by later chunks on that worker, too). :func:`analysis_graph` is the
whole analysis as a dask graph: one task per chunk, merged in a tree.
"""

from __future__ import annotations

import os
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING

from datavine.apps.analysis.agc import Chunk, ChunkResult, process_chunk
from datavine.io.reading import open_served
from datavine.io.shards import ShardMap
from datavine.io.source.handles import open_file

if TYPE_CHECKING:
    from dask.delayed import Delayed


@dataclass(eq=False)
class SourcedResult:
    """A chunk's analysis result and where it was read from; merged with ``+``.

    ``servers`` counts chunks per server that delivered them (``"local"``, a shard's name,
    ``"origin"``, or ``"direct"`` for a URL read without shards); ``failovers`` counts
    chunks read elsewhere than on their file's home shard (it failed, or was cooling down
    after a failure).
    """

    result: ChunkResult = field(default_factory=ChunkResult.empty)
    servers: Counter[str] = field(default_factory=Counter)
    failovers: int = 0

    def __add__(self, other: SourcedResult) -> SourcedResult:
        if not isinstance(other, SourcedResult):
            return NotImplemented
        return SourcedResult(self.result + other.result, self.servers + other.servers,
                             self.failovers + other.failovers)

    def __radd__(self, other: object) -> SourcedResult:
        return self if isinstance(other, int) and other == 0 else NotImplemented


@dataclass(frozen=True)
class LocalFiles:
    """Chunks name local files."""

    def process(self, chunk: Chunk) -> SourcedResult:
        return read_chunk(chunk)


@dataclass(frozen=True)
class XCacheShards:
    """Chunks name files at the origin (``root://origin//lfn``); read through the shards."""

    shardmap: ShardMap

    def process(self, chunk: Chunk) -> SourcedResult:
        return read_chunk(chunk, self.shardmap)


def read_chunk(chunk: Chunk, shardmap: ShardMap | None = None) -> SourcedResult:
    """The chunk's result, read through ``shardmap`` (default: the run's, if any), and the
    server that delivered it."""
    handle, served = open_served(chunk.path, shardmap=shardmap, opener=open_file,
                                 object_cache=None, array_cache=None)
    with handle:
        result = process_chunk(handle, chunk.entry_start, chunk.entry_stop)
    return SourcedResult(result, Counter({served.server: 1}), int(served.away))


ChunkSource = LocalFiles | XCacheShards


def merge(*parts: SourcedResult) -> SourcedResult:
    """The sum of chunk results (a merge task of the graph)."""
    return sum(parts, SourcedResult())


def analysis_graph(source: ChunkSource, chunks: Sequence[Chunk], fan_in: int = 8) -> Delayed:
    """A ``dask.delayed`` of the merged :class:`SourcedResult` of ``chunks``: one task per
    chunk (keys ``agc-chunk-<i>``), merged ``fan_in`` at a time (``agc-merge-<level>-<j>``)."""
    from dask import delayed

    if not chunks:
        raise ValueError("analysis_graph needs at least one chunk")
    if fan_in < 2:
        raise ValueError(f"fan_in must be >= 2, got {fan_in}")
    level = [delayed(source.process, pure=True)(chunk, dask_key_name=f"agc-chunk-{i}")
             for i, chunk in enumerate(chunks)]
    depth = 0
    while len(level) > 1:
        level = [delayed(merge, pure=True)(*level[i:i + fan_in],
                                           dask_key_name=f"agc-merge-{depth}-{i // fan_in}")
                 for i in range(0, len(level), fan_in)]
        depth += 1
    return level[0]


def origin_url(path: str | os.PathLike[str], export_root: str | os.PathLike[str],
               origin: str) -> str:
    """The ``root://`` URL at ``origin`` of a local ``path`` inside the folder the origin
    exports (``export_root``); raises ``ValueError`` naming both when it is outside."""
    path, root = Path(path).resolve(), Path(export_root).resolve()
    try:
        relative = path.relative_to(root)
    except ValueError:
        raise ValueError(f"{path} is not inside {root}, the folder the origin exports") from None
    return f"{origin.rstrip('/')}//{relative.as_posix()}"


def to_origin(chunks: list[Chunk], export_root: str | os.PathLike[str],
              origin: str) -> list[Chunk]:
    """The same chunks, their local paths replaced by the origin's URLs."""
    return [Chunk(origin_url(c.path, export_root, origin), c.entry_start, c.entry_stop)
            for c in chunks]
