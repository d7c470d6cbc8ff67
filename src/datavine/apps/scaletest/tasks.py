"""Worker side of the scale test: read a file's entry count, run one chunk, merge tallies.

Every function here runs in a datavine task and never raises: a file that cannot be read
becomes a record with an ``error``, so one bad file cannot stop the run, and the report
names it. Each chunk record carries when it ran (epoch seconds), on which worker process,
in which pass over the dataset, how many events and compressed bytes it read, the decoded
bytes it took from the worker's column cache and those it decoded from the file
(:mod:`datavine.io.column_cache`), and the process's peak memory: the report's figures and
timeline are built from these records.

Imported on workers: keep imports light (uproot is imported by the analysis when used).
"""

from __future__ import annotations

import operator
import os
import pickle
import resource
import socket
import time
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, fields
from typing import TYPE_CHECKING, NamedTuple

from datavine.apps.analysis.agc import AGC, BRANCHES, EDGES, ChunkResult, select_and_fill

if TYPE_CHECKING:
    from datavine.io.cached_arrays import Read

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
    included), ``cached_bytes`` the decoded bytes served from the worker's column cache and
    ``decoded_bytes`` those decoded from the file, ``peak_mb`` the worker process's peak
    resident memory after the chunk, ``pass_index`` the pass over the dataset (from 0).
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
    cached_bytes: int = 0
    decoded_bytes: int = 0
    pass_index: int = 0

    def __reduce__(self) -> tuple[type[ChunkRecord], tuple[object, ...]]:
        """Pickled as its fields' values in order, not as a dict that names each one: the
        run's merges carry every chunk's record to the end (up to one per chunk and pass),
        and a record so pickled is a third smaller and ~3x faster to load."""
        return ChunkRecord, _record_fields(self)


_record_fields = operator.attrgetter(*(f.name for f in fields(ChunkRecord)))


class Tally:
    """Merged analysis result of the chunks that succeeded, and every chunk's record.

    The records travel packed: a tally pickles the records it holds loaded as one block,
    beside the blocks it came with, which it neither loads nor pickles again; a merge
    joins its parts' blocks and loaded records as they are (:meth:`merged`). The run's
    merges carry every chunk's record to the end, and each pass's first merge takes the
    total of the passes before: loaded and pickled again at every merge, the records of the
    passes before were ~1 ms of a merge's call (counted idle, between two calls) by the
    last pass. :attr:`records` loads them all where they are read (the report, at the
    run's end).
    """

    __slots__ = ("_blocks", "_loose", "result")

    def __init__(self, result: ChunkResult | None = None,
                 records: Iterable[ChunkRecord] = ()) -> None:
        self.result = ChunkResult.empty() if result is None else result
        self._blocks: tuple[bytes, ...] = ()  # pickled lists of records, in order
        self._loose = list(records)  # loaded, after the blocks

    @classmethod
    def merged(cls, result: ChunkResult, parts: Iterable[Tally]) -> Tally:
        """``result`` with every part's records, in the parts' order (a part's blocks and
        loaded records as they are: the order :attr:`records` gives is the blocks', then
        the loaded ones')."""
        tally = cls(result)
        blocks: list[bytes] = []
        for part in parts:
            blocks.extend(part._blocks)
            tally._loose.extend(part._loose)
        tally._blocks = tuple(blocks)
        return tally

    @property
    def records(self) -> list[ChunkRecord]:
        """Every chunk's record (loaded once: the tally then holds them all loaded)."""
        if self._blocks:
            loaded = [r for block in self._blocks for r in pickle.loads(block)]
            self._blocks, self._loose = (), loaded + self._loose
        return self._loose

    def __reduce__(self) -> tuple[object, tuple[ChunkResult, tuple[bytes, ...]]]:
        blocks = self._blocks
        if self._loose:
            blocks += (pickle.dumps(self._loose, protocol=pickle.HIGHEST_PROTOCOL),)
        return _packed_tally, (self.result, blocks)

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, Tally):
            return NotImplemented
        return self.result == other.result and self.records == other.records

    __hash__ = None  # type: ignore[assignment]  # mutable, compared by value

    def __repr__(self) -> str:
        return f"Tally({self.result!r}, {len(self.records)} records)"


def _packed_tally(result: ChunkResult, blocks: tuple[bytes, ...]) -> Tally:
    tally = Tally(result)
    tally._blocks = blocks
    return tally


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


def run_chunk(chunk: tuple[str, int, int], retries: int = 1, pass_index: int = 0) -> Tally:
    """The AGC analysis over one chunk (``(path, entry_start, entry_stop)``: the scheduler
    names the entry range it reads from this triple, and sends it where its columns are),
    retried on ``OSError`` (I/O) up to ``retries`` times; a failure is returned as a record
    with ``error``."""
    path, entry_start, entry_stop = chunk
    started = time.time()
    attempts = 0
    while True:
        attempts += 1
        try:
            result, read = _process(path, entry_start, entry_stop)
        except Exception as exc:
            if isinstance(exc, OSError) and attempts <= retries:
                time.sleep(0.2 * attempts)
                continue
            record = ChunkRecord(path, entry_start, entry_stop, worker_name(), started,
                                 time.time(), peak_mb=peak_rss_mb(), attempts=attempts,
                                 error=_describe(exc), pass_index=pass_index)
            return Tally(records=[record])
        record = ChunkRecord(path, entry_start, entry_stop, worker_name(), started, time.time(),
                             result.events, read.bytes_read, peak_rss_mb(), attempts,
                             cached_bytes=read.cached, decoded_bytes=read.decoded,
                             pass_index=pass_index)
        return Tally(result, [record])


def merge_tallies(parts: Sequence[Tally]) -> Tally:
    """Sum of the results, concatenation of the records (a merge task; the records stay
    packed: :meth:`Tally.merged`)."""
    total = ChunkResult.empty()
    for part in parts:
        total = total + part.result
    return Tally.merged(total, parts)


class _Cost(NamedTuple):
    bytes_read: int  # compressed, every byte the file handle was asked for
    cached: int  # decoded bytes served from the column cache
    decoded: int  # decoded bytes decoded from the file


def _process(path: str, entry_start: int, entry_stop: int) -> tuple[ChunkResult, _Cost]:
    """The chunk's result (:func:`datavine.apps.analysis.agc.process_chunk`'s, its columns
    through the worker's column cache) and what it cost: every byte its file handle was
    asked for (what the storage served: a file's header and tree in the chunk that opened
    it, :mod:`datavine.io.open_files`), not only the branches' baskets, and the decoded
    bytes from the cache and from the file."""
    from datavine.io import open_files
    from datavine.io.cached_arrays import read_arrays, read_held

    held = read_held(path, BRANCHES, entry_start, entry_stop)
    if held is not None:  # every column in memory: the file is not opened (~0.65 ms)
        return _analysed(held), _Cost(0, held.cached, 0)
    # the file kept open for the worker's next reads of it (a chunk of a file opened before
    # reads no header or tree again: its bytes count where they were read)
    with open_files.files().tree(path, "Events") as taken:
        read = read_arrays(taken.tree, BRANCHES, entry_start, entry_stop)
        result = _analysed(read)  # while the file is open: an array may map it
        source = getattr(taken.tree.file, "source", None)
        nbytes = int(getattr(source, "num_requested_bytes", 0) or 0) - taken.bytes_before
    return result, _Cost(max(nbytes, result.bytes_read), read.cached, read.decoded)


def _analysed(read: Read) -> ChunkResult:
    """The AGC selection's result over one read's arrays."""
    counts, selected = select_and_fill(read.arrays, AGC)
    return ChunkResult(counts, EDGES.copy(), len(read.arrays["Jet_pt"]), selected,
                       read.bytes_read, read.path)


def worker_name() -> str:
    """``host:pid`` of the process running tasks (one library process per worker)."""
    return f"{socket.gethostname()}:{os.getpid()}"


def peak_rss_mb() -> float:
    """This process's peak resident memory so far (Linux reports KiB)."""
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024.0


def _describe(exc: BaseException) -> str:
    return f"{type(exc).__name__}: {exc}"[:_MAX_ERROR]
