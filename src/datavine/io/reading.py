"""Reading input files from tasks: through the run's XCache shards, and accounted for.

Task code opens its inputs with :func:`open_input` (a URL or a path). Inside a datavine
bundle the runtime has installed a :class:`ReadContext` (the run's shard map and the
library process's shard health, which persists across bundles): the file is opened on its
shard with fast failover (:func:`datavine.io.xcache.reader.open_with_failover`), and each open
is recorded with the bytes uproot requested from it. The bundle's result carries these
records back; the manager compares each shard's rack with the worker's rack and reports
bytes near and far. Outside a bundle (on the client, in a plain loop) ``open_input`` is
``uproot.open``.

Imported on workers: uproot and XRootD are imported only when a file is opened.
"""

from __future__ import annotations

import contextlib
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

from datavine.io.shards import ShardHealth, ShardMap, logical_name


@dataclass(frozen=True)
class ReadRecord:
    """One input opened by a task: where from, how many bytes, after how many failovers."""

    lfn: str
    server: str  # shard name, "origin", or "local"
    rack: str | None  # rack of that server (None: origin or local file)
    bytes: int
    failovers: int = 0
    errors: tuple[tuple[str, str], ...] = ()


@dataclass
class ReadContext:
    """What tasks in this process read through; installed by the runtime per bundle."""

    shardmap: ShardMap | None = None
    health: ShardHealth = field(default_factory=ShardHealth)
    opened: list[tuple[Any, str, str, str | None, int, tuple[tuple[str, str], ...]]] = field(
        default_factory=list)

    def records(self) -> list[ReadRecord]:
        """The reads so far, with the bytes each file's source was asked for."""
        out = []
        for handle, lfn, server, rack, failovers, errors in self.opened:
            out.append(ReadRecord(lfn, server, rack, _requested_bytes(handle), failovers,
                                  errors))
        return out


_context: ReadContext | None = None
_health = ShardHealth()  # one per process: a failed shard stays cooled down across bundles


def current() -> ReadContext | None:
    """The read context of the bundle running in this process, or None outside a bundle."""
    return _context


def shard_health() -> ShardHealth:
    """This process's shard health (shared by all its bundles)."""
    return _health


@contextlib.contextmanager
def reading(shardmap: ShardMap | None) -> Iterator[ReadContext]:
    """Install a read context for the duration of one bundle."""
    global _context
    previous = _context
    _context = ReadContext(shardmap, _health)
    try:
        yield _context
    finally:
        _context = previous


def open_input(url: str, *, shardmap: ShardMap | None = None, **kwargs: Any) -> Any:
    """Open an input file with uproot: on its XCache shard inside a datavine run.

    ``shardmap`` overrides the run's (``RunConfig.shardmap``); reads are accounted either way.
    """
    from datavine.io.xcache.reader import open_with_failover, uproot_open

    ctx = _context
    shards = shardmap if shardmap is not None else (ctx.shardmap if ctx is not None else None)
    if shards is None or "://" not in url:
        local = "://" not in url
        if local:
            import uproot

            kwargs.setdefault("handler", uproot.source.file.MemmapSource)
        handle = uproot_open(url, **kwargs)
        if ctx is not None:
            ctx.opened.append((handle, logical_name(url), "local" if local else "direct",
                               None, 0, ()))
        return handle
    handle, record = open_with_failover(url, shards, _health, now=time.monotonic(), **kwargs)
    if ctx is not None:
        ctx.opened.append((handle, record.lfn, record.server, record.rack, record.failovers,
                           record.errors))
    return handle


def _requested_bytes(handle: Any) -> int:
    for path in ("source", "file.source"):
        obj = handle
        for part in path.split("."):
            obj = getattr(obj, part, None)
        if obj is not None and hasattr(obj, "num_requested_bytes"):
            return int(obj.num_requested_bytes)
    return 0


XROOTD_CLIENT_PATH = "/XRootD/client/"  # where the XRootD Python client's modules live


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
    return isinstance(exc, OSError) or raised_in_xrootd_client(exc)
