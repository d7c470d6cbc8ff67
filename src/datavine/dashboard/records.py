"""The shapes of the live view's event records: one JSON object per line of ``events.jsonl``.

:mod:`datavine.dashboard.events` writes them (its ``*_record`` functions), and
:mod:`datavine.dashboard.procs` the ``usage`` record; :mod:`datavine.dashboard.model` folds
them. Each has ``k``, its kind, and ``t``, the ``time.time()`` it was written at (stamped by
:meth:`~datavine.dashboard.events.EventSink.emit`). A file read back is taken to hold these
shapes (it is the sink's own); the board still reads every field with a default, so that an
older or cut file shows what it has. Types only: nothing here runs.
"""

from __future__ import annotations

from typing import Literal, NotRequired, TypedDict


class HelloRecord(TypedDict):
    """The sink opened: the manager's process and the records' version."""

    k: Literal["hello"]
    t: NotRequired[float]
    pid: int
    version: int


class ProcsRecord(TypedDict):
    """The PIDs of the workers started on the manager's host (their memory is read there)."""

    k: Literal["procs"]
    t: NotRequired[float]
    pids: dict[str, int]


class ShardPlace(TypedDict):
    """Where an XCache shard is: its rack and host (None: not known)."""

    rack: str | None
    host: str | None


class RunRecord(TypedDict):
    """A run starts: its number, tasks, the files they read (logical name -> tasks reading
    it) and the shards."""

    k: Literal["run"]
    t: NotRequired[float]
    run: int
    tasks: int
    files: dict[str, int]
    shards: dict[str, ShardPlace]


class SentRecord(TypedDict):
    """A bundle of ``n`` tasks went out as ``call`` under ``cap`` MB, to a worker (``to``)
    or a rack or anywhere, reading ``files`` and processing ``ev`` physics events."""

    k: Literal["sent"]
    t: NotRequired[float]
    call: int
    n: int
    cap: float | None
    to: str | None
    rack: str | None
    files: list[str]
    ev: int
    copy: NotRequired[int]  # 1: a backup copy of a bundle already sent (not a bundle)


# One read of a bundle: (logical file name, server, its rack, bytes, failovers, decoded bytes
# the worker's column cache served, decoded bytes decoded from the file). A file written
# before the column cache's figures has the first five only (the board reads them as 0).
Read = tuple[str, str, str | None, int, int, int, int]


class DoneRecord(TypedDict):
    """A call came back: its status (``died``: its worker or library died under it, and
    then only ``addr`` and ``why`` are known), where it ran, seconds, memory peak and cap,
    its reads, and why it did not succeed; ``again``/``again_ev``: how many of its tasks and
    events were done before in the run (made again after a lost worker: counted once)."""

    k: Literal["done"]
    t: NotRequired[float]
    call: int
    n: int
    status: str
    addr: str | None
    why: NotRequired[str]
    worker: NotRequired[str | None]
    host: NotRequired[str | None]
    rack: NotRequired[str | None]
    wall: NotRequired[float]
    peak: NotRequired[float]
    cap: NotRequired[float | None]
    reads: NotRequired[list[Read]]
    again: NotRequired[int]
    again_ev: NotRequired[int]


class PoolWorker(TypedDict):
    """A worker in a ``pool`` record; ``lib``: its library's state (sent, started, ended)."""

    id: str
    addr: str | None
    host: str | None
    rack: str | None
    cores: int
    lib: str | None


class PoolRecord(TypedDict):
    """The pool: its workers (left out when they are those of the sink's last pool record:
    the reader keeps the last list), each running call's worker address
    (``calls``: ``[call, address]``, in a run's first pool record; after it only what
    changed: ``placed``, the calls placed or moved since the last record, and ``unplaced``,
    those no longer placed), calls waiting, workers that left or were lost, connected
    workers and their cores."""

    k: Literal["pool"]
    t: NotRequired[float]
    workers: NotRequired[list[PoolWorker]]
    calls: NotRequired[list[tuple[int, str]]]
    placed: NotRequired[list[tuple[int, str]]]
    unplaced: NotRequired[list[int]]
    queued: int
    gone: list[str]
    lost: list[str]
    connected: int
    cores: int


class EndSummary(TypedDict, total=False):
    """A run's summary's figures (:class:`datavine.scheduler.summary.RunSummary`)."""

    tasks: int
    bundles: int
    retries: int
    wall_s: float
    workers: int
    near_bytes: int
    far_bytes: int
    opens: int
    failovers: int
    failures: list[str]  # the first 50
    n_failures: int
    lost_workers: list[str]
    timeouts: int
    placement: dict[str, int]
    network: list[dict[str, object]]
    unmeasured_calls: int  # calls stopped while they ran: their reads in no byte total
    unmeasured_bytes: int  # what those read, at most (their winners' bytes)


class EndRecord(TypedDict):
    """A run ended (finished, failed or interrupted)."""

    k: Literal["end"]
    t: NotRequired[float]
    run: int
    summary: EndSummary


class UsageRecord(TypedDict):
    """Memory and CPU read on the manager's host (:mod:`datavine.dashboard.procs`): per
    worker and for the manager ``[MB, % of a core]``; the host ``[MB used, MB, % CPU]``."""

    k: Literal["usage"]
    t: NotRequired[float]
    workers: dict[str, list[float]]
    manager: NotRequired[list[float]]
    host: list[float]


class GoneRecord(TypedDict):
    """A call was cancelled (a copy whose twin came first, a call withdrawn): no done
    record will follow."""

    k: Literal["gone"]
    t: NotRequired[float]
    call: int


Record = (HelloRecord | ProcsRecord | RunRecord | SentRecord | DoneRecord | PoolRecord
          | EndRecord | UsageRecord | GoneRecord)
