"""The interface every way of reaching an input file implements, and what an open reports.

A :class:`Source` is one way of reaching a file (a local path, a ``root://`` URL as given,
a ``root://`` URL through the XCache shards): :meth:`Source.open` asks ``opener`` for the
file on the server that should serve it now and returns what ``opener`` returned with an
:class:`OpenRecord` saying who served it. The opener makes the handle (an uproot file, or an
uproot source: :mod:`datavine.io.source.handles`); the handle reads the byte ranges and
counts them (``num_requested_bytes``, read back by :func:`bytes_requested`; the bytes the
worker's disk served instead, :func:`bytes_from_disk`).

Also here: what counts as a failure of the server rather than of the caller
(:data:`SERVER_ERRORS`, :func:`is_input_error`) and the error raised when no server could
open a file. Standard library only; imported on workers.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Callable
from dataclasses import dataclass
from typing import TypeVar

from datavine.errors import DatavineError
from datavine.io.shards import ORIGIN_NAME, logical_name

LOCAL = "local"  # the server of a local file: the worker itself
DIRECT = "direct"  # the server of a URL opened as given (no shard map)
UNSHARDED = (LOCAL, DIRECT, ORIGIN_NAME)  # servers that are not XCache shards

H = TypeVar("H")  # what an opener makes: an uproot file or source (a handle)
Opener = Callable[..., H]  # opener(url, **options) -> handle; raises OSError on a bad server

# Exceptions of an opener that count as a failure of the server it tried (XRootD's
# connection and timeout errors are OSErrors); anything else is the caller's and propagates.
SERVER_ERRORS: tuple[type[BaseException], ...] = (OSError,)

XROOTD_CLIENT_PATH = "/XRootD/client/"  # where the XRootD Python client's modules live


class InputUnavailableError(DatavineError):
    """No shard and not the origin could open an input file; names each server tried."""

    def __init__(self, url: str, attempts: list[tuple[str, str]]) -> None:
        self.url = url
        self.attempts = attempts
        tried = "; ".join(f"{name}: {err}" for name, err in attempts) or "nothing to try"
        super().__init__(f"cannot open {url}: {tried}")


@dataclass(frozen=True)
class OpenRecord:
    """How one input was opened."""

    lfn: str
    url: str  # the URL (or path) that was opened
    server: str  # shard name, "origin", "local" or "direct"
    rack: str | None  # rack of that shard; None for the origin, a local file or a direct URL
    failovers: int  # servers that failed before this one
    errors: tuple[tuple[str, str], ...]  # (server, error) of each failure, in order
    elapsed_s: float
    home: str | None = None  # the file's own shard (first in line when all are healthy)

    @property
    def via_origin(self) -> bool:
        return self.server == ORIGIN_NAME

    @property
    def away(self) -> bool:
        """Served by another server than the file's own shard (it failed, or was cooling
        down after a failure); False where there is no shard map."""
        return self.home is not None and self.server != self.home


class Source(ABC):
    """One way of reaching an input file (see the module docstring)."""

    @abstractmethod
    def open(self, url: str, opener: Opener[H], **options: object) -> tuple[H, OpenRecord]:
        """``opener(target, **options)`` for the server that should serve ``url`` now: the
        handle it returned, and how it was opened. Raises what the opener raised (a single
        server) or :class:`InputUnavailableError` naming every server that failed."""


def open_on(server: str, url: str, opener: Opener[H],
            **options: object) -> tuple[H, OpenRecord]:
    """``url`` opened as given, on its one server (``server`` names it in the records)."""
    handle = opener(url, **options)
    return handle, served_by(server, url)


def served_by(server: str, url: str) -> OpenRecord:
    """The record of ``url`` opened on its one server ``server``, at the first try."""
    return OpenRecord(logical_name(url), url, server, None, 0, (), 0.0)


# the counters of an uproot source that a read's record reads (the functions below)
SOURCE_COUNTERS = ("num_requested_bytes", "num_disk_bytes", "num_prefetched_bytes",
                   "num_read_seconds")


def bytes_requested(handle: object) -> int:
    """Bytes asked of the handle's source so far: for an uproot source, file or directory
    (uproot counts every byte of every range requested, failed reads included); 0 when the
    handle has no source."""
    return int(_source_count(handle, "num_requested_bytes"))


def bytes_from_disk(handle: object) -> int:
    """Bytes the worker's disk served the handle's source so far
    (:class:`datavine.io.source.disk.DiskCachedSource`); 0 when it has no such source."""
    return int(_source_count(handle, "num_disk_bytes"))


def bytes_prefetched(handle: object) -> int:
    """Bytes of the handle's source that a prefetch fetched ahead of the bundle
    (:class:`datavine.io.source.prefetched.PrefetchedSource`); 0 when it has no such source."""
    return int(_source_count(handle, "num_prefetched_bytes"))


def seconds_reading(handle: object) -> float:
    """Seconds the server took to serve the handle's source so far, its requests outstanding
    (:class:`datavine.io.source.timed.TimedSource`); 0 when it has no such source."""
    return _source_count(handle, "num_read_seconds", float)


def _source_count(handle: object, counter: str, kind: type[int] | type[float] = int,
                  ) -> int | float:
    """The ``counter`` of the uproot source behind ``handle`` (a source, a file, or a
    directory), 0 when it has none."""
    for path in ((), ("source",), ("file", "source")):
        obj = handle
        for part in path:
            obj = getattr(obj, part, None)
        if obj is not None and hasattr(obj, counter):
            return kind(getattr(obj, counter))
    return 0


def raised_in_xrootd_client(exc: BaseException) -> bool:
    """Whether ``exc`` was raised from inside the XRootD client (for example ``ValueError: I/O
    operation on closed file`` from a file handle that fsspec-xrootd keeps cached after its
    server went away, in a long-lived process)."""
    tb, last = exc.__traceback__, None
    while tb is not None:
        last, tb = tb, tb.tb_next
    return last is not None and XROOTD_CLIENT_PATH in last.tb_frame.f_code.co_filename


def is_input_error(exc: BaseException) -> bool:
    """Whether ``exc`` is a failure to read an input: an ``OSError``, or anything raised from
    inside the XRootD client."""
    return isinstance(exc, SERVER_ERRORS) or raised_in_xrootd_client(exc)
