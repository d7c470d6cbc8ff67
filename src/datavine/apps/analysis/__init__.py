"""Analysis workloads that datavine schedules: plain functions over one chunk of events.

Each workload reads its own input (a path, a URL or an open uproot file), returns a small
picklable, mergeable result, and knows nothing of TaskVine or dask; executors live elsewhere.
"""

from datavine.apps.analysis.agc import (
    Chunk,
    ChunkResult,
    make_chunks,
    process_chunk,
    process_item,
    run_plain_loop,
)

__all__ = [
    "Chunk",
    "ChunkResult",
    "make_chunks",
    "process_chunk",
    "process_item",
    "run_plain_loop",
]
