"""Worker side of :class:`~datavine.coffea.DatavineExecutor`: one work item, and merges.

These functions run inside datavine tasks on TaskVine workers. An item's exception is
caught, classified (:mod:`datavine.coffea.badfiles`), retried when a retry can help (not a
missing or unreadable file, corrupt data, or the same user exception twice in a row), and
sent back as an :class:`ItemFailure` value inside a :class:`Partial`, so that one bad item
cannot abort the graph and the executor can still return the merge of the items that
succeeded, as coffea's executors do. One exception is raised instead: code that cannot be
loaded on the worker (:class:`WorkerImportError`) fails every item the same way, so it stops
the run at the first one.

Reads go through :class:`datavine.coffea.source.DatavineSource` (the executor sets it as
uproot's handler): an XRootD error in an item that read from a shard cools that shard down
and runs the item again, on the next shard, without counting it as a retry.

A :class:`Partial` holds the merged accumulator of some items (lz4-compressed pickle when
the executor's ``compression`` is set, as coffea's executors do between worker and client),
the number of items merged and the failures seen. Merges keep the items' order, so that
results equal :class:`coffea.processor.IterativeExecutor`'s.
"""

from __future__ import annotations

import contextlib
import hashlib
import os
import pickle
import time
import traceback
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TypeVar

import cloudpickle

from datavine.coffea.badfiles import classify, missing_module
from datavine.errors import DatavineError
from datavine.io import reading
from datavine.safe_paths import user_temp_dir, write_secret

_MAX_CAUSES = 16
_MAX_TEXT = 4000
Item = TypeVar("Item")  # a coffea WorkItem


class ItemFailedError(RuntimeError):
    """A work item's exception that could not be brought back from the worker as itself."""


class WorkerImportError(DatavineError):
    """A worker could not load a work item's code (a module missing there): every item
    would fail the same way, so the run stops at the first one."""

    def __init__(self, message: str, module: str = "") -> None:
        super().__init__(message)
        self.module = module

    def __reduce__(self) -> tuple[type[WorkerImportError], tuple[str, str]]:
        return (type(self), (str(self), self.module))

    @classmethod
    def of(cls, exc: BaseException, item: object, index: int) -> WorkerImportError:
        module = missing_module(exc) or ""
        named = f"module {module!r}" if module else "a module"
        fix = (f"DatavineExecutor(pickle_by_value=({module.split('.')[0]!r},))" if module
               else "DatavineExecutor(pickle_by_value=('<your module>',))")
        tb = "".join(traceback.format_exception(type(exc), exc, exc.__traceback__))
        return cls(f"work item {index} ({repr(item)[:300]}) cannot load {named} on this "
                   f"worker: {type(exc).__name__}: {exc}. The workers cannot import the "
                   f"code this item needs: install {module or 'it'} in the workers' "
                   f"environment, or send it by value with {fix}.\n"
                   f"remote traceback:\n{tb[-4 * _MAX_TEXT:]}", module)


@dataclass(frozen=True)
class ItemPolicy:
    """How a worker runs one item.

    Attributes:
        retries: extra attempts after a failure that a retry may cure (I/O, timeouts;
            not corrupt data), as coffea's ``automatic_retries``.
        skipbadfiles: coffea's setting: ``False``, ``True`` or a tuple of exception types.
        report_skippable: coffea's ``use_result_type``: a bad-file error is returned as the
            run's exception instead of being skipped.
        retry_delay_s: pause before attempt ``n + 1``: ``n * retry_delay_s`` seconds.
        compression: lz4 level for the item's output, or ``None``.
        x509_proxy: the proxy's bytes: written to a private file on the worker, named by
            ``X509_USER_PROXY`` while the item runs.
        extra_files: (name, bytes) written into the task's working directory.
    """

    retries: int = 0
    skipbadfiles: bool | tuple[type[BaseException], ...] = False
    report_skippable: bool = False
    retry_delay_s: float = 0.0
    compression: int | None = None
    x509_proxy: bytes | None = field(default=None, repr=False)
    extra_files: tuple[tuple[str, bytes], ...] = field(default=(), repr=False)


@dataclass
class ItemFailure:
    """An item that did not produce output: where, why, and whether it was skipped."""

    index: int
    item: str
    filename: str | None
    error: str
    traceback: str
    attempts: int
    skipped: bool
    reason: str
    causes: list[bytes | None] = field(default_factory=list)

    @classmethod
    def capture(cls, index: int, item: object, exc: BaseException, attempts: int,
                skipped: bool, reason: str) -> ItemFailure:
        tb = "".join(traceback.format_exception(type(exc), exc, exc.__traceback__))
        return cls(index, repr(item)[:_MAX_TEXT], _filename(item),
                   f"{type(exc).__name__}: {exc}"[:_MAX_TEXT], tb[-4 * _MAX_TEXT:], attempts,
                   skipped, reason, _pickle_causes(exc))

    def to_exception(self) -> BaseException:
        """The item's exception with its ``__cause__`` chain, carrying the remote traceback
        as a note; an :class:`ItemFailedError` when it cannot be rebuilt."""
        chain = [_unpickle(blob) for blob in self.causes]
        exc = chain[0] if chain and chain[0] is not None else ItemFailedError(
            f"work item {self.item} failed: {self.error}")
        current = exc
        for cause in chain[1:]:
            if cause is None:
                break
            current.__cause__ = cause
            current = cause
        exc.add_note(f"datavine: work item {self.index} ({self.item}) failed after "
                     f"{self.attempts} attempt(s); remote traceback:\n{self.traceback}")
        return exc


@dataclass
class Partial:
    """The merge of some items' outputs, plus the failures among them."""

    value: object = None  # the accumulator (compressed: see compress)
    items: int = 0
    failures: list[ItemFailure] = field(default_factory=list)


MAX_FAILOVERS = 8  # shards an item may move through after XRootD errors in its reads


def run_item(function: Callable[[Item], object], item: Item, index: int,
             policy: ItemPolicy) -> Partial:
    """Run ``function(item)`` under ``policy``. Raises only :class:`WorkerImportError`."""
    with item_files(policy):
        return _run_item(function, item, index, policy)


def _run_item(function: Callable[[Item], object], item: Item, index: int,
              policy: ItemPolicy) -> Partial:
    ctx = reading.current()
    attempts = failovers = 0
    last_error = ""
    while True:
        attempts += 1
        first_read = len(ctx.opened) if ctx is not None else 0
        try:
            out = function(item)
        except Exception as exc:
            verdict = classify(exc, policy.skipbadfiles)
            if verdict.load_error:
                raise WorkerImportError.of(exc, item, index) from None
            shards = ctx.shards_since(first_read) if ctx is not None else []
            if shards and verdict.reason == "xrootd" and failovers < MAX_FAILOVERS:
                _fail_over(ctx, first_read, exc)
                failovers += 1
                attempts -= 1  # the next shard is a new server, not a retry
                continue
            error = f"{type(exc).__name__}: {exc}"
            repeated = verdict.reason == "" and error == last_error  # a bug, not bad luck
            last_error = error
            if verdict.retryable and not repeated and attempts <= policy.retries:
                time.sleep(policy.retry_delay_s * attempts)
                continue
            skipped = verdict.bad_file and not policy.report_skippable
            return Partial(failures=[ItemFailure.capture(index, item, exc, attempts, skipped,
                                                         verdict.reason)])
        try:
            value = compress(out, policy.compression)
        except Exception as exc:
            return Partial(failures=[ItemFailure.capture(
                index, item, TypeError(f"the output of work item {index} cannot be "
                                       f"pickled: {exc}"), attempts, False, "")])
        return Partial(value=value, items=1)


def _fail_over(ctx: reading.ReadContext | None, first_read: int, exc: BaseException) -> None:
    """Cool down the shards the failed attempt read from, and note the error on their read
    records (the run summary counts it as a failover; the library learns the shard)."""
    assert ctx is not None
    ctx.fail_shards_since(first_read, f"{type(exc).__name__}: {str(exc)[:300]}",
                          time.monotonic())


@contextlib.contextmanager
def item_files(policy: ItemPolicy) -> Iterator[None]:
    """Run the item in a private folder holding the policy's extra files (as its working
    directory: the long-lived capped child's own may be a finished call's deleted sandbox),
    with its X509 proxy in a private file named by ``X509_USER_PROXY``."""
    with contextlib.ExitStack() as stack:
        if policy.extra_files:
            folder = user_temp_dir("files-" + hashlib.sha256(b"".join(
                name.encode() + b"\0" + blob for name, blob in policy.extra_files
            )).hexdigest()[:16])
            for name, blob in policy.extra_files:
                path = folder / name
                if not path.exists() or path.stat().st_size != len(blob):
                    path.write_bytes(blob)
            stack.enter_context(_working_dir(folder))
        if policy.x509_proxy is not None:
            proxy = user_temp_dir("x509") / hashlib.sha256(policy.x509_proxy).hexdigest()[:16]
            if not proxy.exists():  # written whole, mode 0600, under a private folder
                write_secret(proxy, policy.x509_proxy, replace=True)
            stack.callback(_restore_env, "X509_USER_PROXY", os.environ.get("X509_USER_PROXY"))
            os.environ["X509_USER_PROXY"] = str(proxy)
        yield


@contextlib.contextmanager
def _working_dir(folder: Path) -> Iterator[None]:
    """``os.chdir(folder)`` for the block; back to the previous folder if it still exists."""
    try:
        previous: str | None = os.getcwd()
    except FileNotFoundError:  # a deleted sandbox
        previous = None
    os.chdir(folder)
    try:
        yield
    finally:
        with contextlib.suppress(OSError, TypeError):
            os.chdir(previous)  # type: ignore[arg-type]


def _restore_env(name: str, value: str | None) -> None:
    if value is None:
        os.environ.pop(name, None)
    else:
        os.environ[name] = value


def merge_partials(parts: Sequence[Partial], compression: int | None) -> Partial:
    """Merge in order: the accumulators with coffea's ``accumulate``, the failures listed.
    An accumulator that fails to merge becomes a failure (never raises)."""
    failures = [f for p in parts for f in p.failures]
    items = sum(p.items for p in parts)
    values = [p.value for p in parts if p.value is not None]
    if len(values) <= 1:
        return Partial(values[0] if values else None, items, failures)
    try:
        from coffea.processor.accumulator import accumulate

        merged = accumulate(decompress(v) for v in values)
        return Partial(compress(merged, compression), items, failures)
    except Exception as exc:
        failure = ItemFailure.capture(-1, f"merge of {len(values)} outputs", exc, 1, False, "")
        return Partial(None, 0, [*failures, failure])


def compress(value: object, level: int | None) -> object:
    """``value`` as lz4-compressed pickle at ``level``, or as is when ``level`` is None."""
    if value is None or level is None:
        return value
    import lz4.frame

    blob = cloudpickle.dumps(value, protocol=pickle.HIGHEST_PROTOCOL)
    return _Compressed(lz4.frame.compress(blob, compression_level=level))


def decompress(value: object) -> object:
    if isinstance(value, _Compressed):
        import lz4.frame

        return pickle.loads(lz4.frame.decompress(value.blob))
    return value


@dataclass(frozen=True)
class _Compressed:
    """Marks compressed bytes, so that an accumulator that is itself ``bytes`` stays one."""

    blob: bytes


def _filename(item: object) -> str | None:
    name = getattr(item, "filename", None)
    return str(name) if name is not None else None


def _pickle_causes(exc: BaseException) -> list[bytes | None]:
    """The ``__cause__`` chain, each exception pickled on its own (pickle drops causes)."""
    blobs: list[bytes | None] = []
    current: BaseException | None = exc
    while current is not None and len(blobs) < _MAX_CAUSES:
        try:
            blob = cloudpickle.dumps(current)
            pickle.loads(blob)  # an exception that pickles but cannot be rebuilt is no use
        except Exception:
            blob = None
        blobs.append(blob)
        current = current.__cause__
    return blobs


def _unpickle(blob: bytes | None) -> BaseException | None:
    if blob is None:
        return None
    try:
        value = pickle.loads(blob)
    except Exception:
        return None
    return value if isinstance(value, BaseException) else None
