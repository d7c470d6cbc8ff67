"""Worker side of the scale test: read a file's entry count, run one chunk, merge tallies.

Every function here runs in a datavine task and never raises: a file that cannot be read
becomes a record with an ``error``, so one bad file cannot stop the run, and the report
names it. Each chunk record carries when it ran (epoch seconds), on which worker process,
how many events and compressed bytes it read, and the process's peak memory: the report's
timeline is built from these records.

Imported on workers: keep imports light (uproot is imported by the analysis when used).
"""

from __future__ import annotations

import os
import resource
import socket
import time
from collections.abc import Sequence
from dataclasses import dataclass, field

from datavine.apps.analysis.agc import ChunkResult, process_chunk

_MAX_ERROR = 500


@dataclass(frozen=True)
class FileInfo:
    """A file's entry count and size, or why it could not be opened."""

    path: str
    entries: int = 0
    size_bytes: int = 0
    error: str | None = None


@dataclass
class ChunkRecord:
    """One chunk as it ran: where, when, what it read, or why it failed.

    ``bytes_read`` is every compressed byte the chunk's file handle requested (metadata
    included), ``peak_mb`` the worker process's peak resident memory after the chunk.
    """

    path: str
    entry_start: int
    entry_stop: int
    worker: str
    t_start: float
    t_end: float
    events: int = 0
    bytes_read: int = 0
    peak_mb: float = 0.0
    attempts: int = 1
    error: str | None = None


@dataclass
class Tally:
    """Merged analysis result of the chunks that succeeded, and every chunk's record."""

    result: ChunkResult = field(default_factory=ChunkResult.empty)
    records: list[ChunkRecord] = field(default_factory=list)


def file_info(path: str, tree: str = "Events") -> FileInfo:
    """Entry count of ``path``'s tree (opened like the analysis opens it); never raises."""
    try:
        from datavine.io.reading import open_input

        with open_input(path) as directory:
            entries = int(directory[tree].num_entries)
            size = int(getattr(directory.file.source, "num_bytes", 0) or 0)
        return FileInfo(path, entries, size)
    except Exception as exc:
        return FileInfo(path, error=_describe(exc))


def run_chunk(path: str, entry_start: int, entry_stop: int, retries: int = 1) -> Tally:
    """The AGC analysis over one chunk, retried on ``OSError`` (I/O) up to ``retries``
    times; a failure is returned as a record with ``error``."""
    started = time.time()
    attempts = 0
    while True:
        attempts += 1
        try:
            result, nbytes = _process(path, entry_start, entry_stop)
        except Exception as exc:
            if isinstance(exc, OSError) and attempts <= retries:
                time.sleep(0.2 * attempts)
                continue
            record = ChunkRecord(path, entry_start, entry_stop, worker_name(), started,
                                 time.time(), peak_mb=peak_rss_mb(), attempts=attempts,
                                 error=_describe(exc))
            return Tally(records=[record])
        record = ChunkRecord(path, entry_start, entry_stop, worker_name(), started, time.time(),
                             result.events, nbytes, peak_rss_mb(), attempts)
        return Tally(result, [record])


def merge_tallies(parts: Sequence[Tally]) -> Tally:
    """Sum of the results, concatenation of the records (a merge task)."""
    total = ChunkResult.empty()
    records: list[ChunkRecord] = []
    for part in parts:
        total = total + part.result
        records.extend(part.records)
    return Tally(total, records)


def _process(path: str, entry_start: int, entry_stop: int) -> tuple[ChunkResult, int]:
    """The chunk's result and every byte its file handle was asked for (headers and
    metadata included: what the storage served), not only the branches' baskets."""
    from datavine.io.reading import open_input

    with open_input(path) as directory:
        result = process_chunk(directory, entry_start, entry_stop)
        source = getattr(getattr(directory, "file", None), "source", None)
        nbytes = int(getattr(source, "num_requested_bytes", 0) or 0)
    return result, max(nbytes, result.bytes_read)


def worker_name() -> str:
    """``host:pid`` of the process running tasks (one library process per worker)."""
    return f"{socket.gethostname()}:{os.getpid()}"


def peak_rss_mb() -> float:
    """This process's peak resident memory so far (Linux reports KiB)."""
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024.0


def _describe(exc: BaseException) -> str:
    return f"{type(exc).__name__}: {exc}"[:_MAX_ERROR]
