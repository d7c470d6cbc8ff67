"""``DatavineExecutor``: coffea's ``processor.Runner`` work items run on TaskVine by datavine.

Switching an analysis to datavine is one changed line::

    run = processor.Runner(executor=DatavineExecutor(), schema=NanoAODSchema)
    out = run(fileset, processor_instance=MyProcessor(), treename="Events")

Each call (``Runner`` calls once with ``desc="Preprocessing"`` and ``FileMeta`` items, then
with ``WorkItem`` s) becomes one classic dict dask graph: a task per item (its ``WorkItem``
or ``FileMeta`` stays a direct argument, so datavine sees the file the task reads and can
place it near its data) and a tree of merge tasks, ``merge_fanin`` at a time, so that
merging runs on the workers and only the final accumulator travels to the client. The graph
runs on ``cluster`` (a started :class:`datavine.Cluster` or :class:`datavine.LocalCluster`)
or, by default, on a :class:`datavine.LocalCluster` started for the call on this machine
(``with executor:`` starts it once for all calls made inside the block).

Failures follow coffea's executor contract: ``(accumulator, 0)``, or the merge of the items
that succeeded and the first exception, ``(partial, exception)``; a run that fails as a whole
(no workers, a timeout) raises its error, as there is no partial result. Items never raise on the
workers (:mod:`datavine.coffea.tasks`); bad files are skipped under ``skipbadfiles`` with a
wider net than coffea's own (:mod:`datavine.coffea.badfiles`: XRootD errors however wrapped,
corrupt baskets), reported in a :class:`BadFilesSkippedWarning` and in :attr:`report`.
"""

from __future__ import annotations

import contextlib
import functools
import gc
import os
import tempfile
import time
import uuid
import warnings
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from coffea.processor.accumulator import accumulate
from coffea.processor.executor import ExecutorBase

from datavine.coffea.tasks import (
    ItemFailure,
    ItemPolicy,
    Partial,
    decompress,
    merge_partials,
    run_item,
)
from datavine.graph import Key, add_merge_tree


class BadFilesSkippedWarning(UserWarning):
    """Work items of unreadable files were skipped (``skipbadfiles``); names the files."""


@dataclass
class CallRecord:
    """What one executor call did."""

    desc: str
    items: int
    succeeded: int = 0
    skipped: list[ItemFailure] = field(default_factory=list)
    failed: list[ItemFailure] = field(default_factory=list)
    wall_s: float = 0.0
    error: str | None = None
    summary: Any = None

    @property
    def skipped_files(self) -> list[str]:
        return list(dict.fromkeys(f.filename or f.item for f in self.skipped))


@dataclass
class ExecutionReport:
    """Records of every call of an executor and of its copies (``Runner`` copies it)."""

    calls: list[CallRecord] = field(default_factory=list)

    @property
    def skipped_files(self) -> list[str]:
        """Files with at least one skipped item, over all calls, in order of appearance."""
        return list(dict.fromkeys(name for c in self.calls for name in c.skipped_files))

    @property
    def last(self) -> CallRecord | None:
        return self.calls[-1] if self.calls else None

    def clear(self) -> None:
        self.calls.clear()


def default_workers() -> int:
    """One 1-core worker per core this process may run on."""
    return max(1, len(os.sched_getaffinity(0)))


@dataclass
class DatavineExecutor(ExecutorBase):
    """Run coffea work items as datavine tasks on TaskVine workers.

    Parameters
    ----------
        cluster : datavine.Cluster, optional
            A started cluster (anything with ``.get(graph, keys)`` and ``.last_summary``).
            ``None`` starts a :class:`datavine.LocalCluster` of ``workers`` x ``cores`` on
            this machine for each call and stops it after.
        workers, cores, memory_mb : embedded cluster's size (default: one 1-core worker per
            core here).
        merge_fanin : results merged per merge task (>= 2).
        retries : extra attempts of an item whose failure a retry may cure (``Runner``
            reads it, as for coffea's own executors).
        retry_delay_s : pause before attempt n+1 is ``n * retry_delay_s``.
        skipbadfiles : ``None`` takes the ``Runner``'s setting; ``True``/``False``/a tuple
            of exception types overrides it for the items this executor runs.
        run_timeout_s : bound on one call on the embedded cluster (``RunConfig.timeout_s``).
        pickle_by_value : modules (names) that the workers cannot import, such as the
            module of your processor class: cloudpickle sends their classes and functions
            by value (``Runner`` pickles the processor on the client). A processor defined
            in ``__main__`` travels by value anyway.
        report : where calls are recorded; shared with copies (``Runner`` runs copies).
        embedded : the cluster started by ``with executor:`` (set by ``__enter__``; copies
            made inside the ``with`` use it, so preprocessing and processing share workers).
        status, unit, desc, compression, function_name : as for coffea's executors;
            ``status`` shows datavine's progress bar on the embedded cluster.
    """

    cluster: Any = None
    workers: int | None = None
    cores: int = 1
    memory_mb: int | None = None
    merge_fanin: int = 8
    retries: int = 3
    retry_delay_s: float = 0.5
    skipbadfiles: bool | tuple[type[BaseException], ...] | None = None
    run_timeout_s: float | None = None
    pickle_by_value: tuple[str, ...] = ()
    report: ExecutionReport | None = None
    embedded: Any = None

    def __post_init__(self) -> None:
        if self.merge_fanin < 2:
            raise ValueError(f"DatavineExecutor.merge_fanin must be >= 2, got {self.merge_fanin}")
        if self.retries < 0:
            raise ValueError(f"DatavineExecutor.retries must be >= 0, got {self.retries}")
        if self.workers is not None and self.workers < 1:
            raise ValueError(f"DatavineExecutor.workers must be >= 1, got {self.workers}")
        if self.cluster is not None and not callable(getattr(self.cluster, "get", None)):
            raise TypeError(f"DatavineExecutor.cluster must be a started datavine cluster, "
                            f"got {type(self.cluster).__name__}")
        if self.report is None:
            self.report = ExecutionReport()
        self.pickle_by_value = tuple(self.pickle_by_value)
        for name in self.pickle_by_value:
            register_by_value(name)

    def __enter__(self) -> DatavineExecutor:
        """Start the embedded cluster once for several calls (``Runner`` makes two)."""
        if self.cluster is None and self.embedded is None:
            stack = contextlib.ExitStack()
            self.embedded = (stack, stack.enter_context(self._local_cluster()))
        return self

    def __exit__(self, *exc_info: object) -> None:
        if self.embedded is not None:
            stack, _ = self.embedded
            self.embedded = None
            stack.close()

    def __call__(self, items: Iterable[Any], function: Callable[[Any], Any],
                 accumulator: Any) -> tuple[Any, Any]:
        items = list(items)
        record = CallRecord(self.desc, len(items))
        assert self.report is not None
        self.report.calls.append(record)
        if not items:
            return accumulator, 0
        inner, policy = self.item_policy(function)
        graph, final = build_graph(items, inner, policy, self.merge_fanin, self._task_prefix())
        started = time.monotonic()
        try:
            with self._cluster() as cluster:
                partial: Partial = cluster.get(graph, [final])[0]
                record.summary = getattr(cluster, "last_summary", None)
        except Exception as exc:
            # The run itself failed (no workers, timeout, a cluster that does not start):
            # no item's output came back, so there is no partial result to return, and
            # Runner would hide the cause behind "No chunks returned results".
            record.error = f"{type(exc).__name__}: {exc}"
            record.wall_s = time.monotonic() - started
            exc.add_note(f"datavine: the {self.desc.lower()} run of {len(items)} coffea work "
                         "item(s) failed as a whole")
            raise
        record.wall_s = time.monotonic() - started
        return self._finish(record, partial, accumulator)

    # ------------------------------------------------------------------------------------
    def item_policy(self, function: Callable[[Any], Any]) -> tuple[Callable[[Any], Any],
                                                                    ItemPolicy]:
        """The item function without coffea's retry wrapper, and the policy replacing it."""
        inner, runner = unwrap_automatic_retries(function)
        skip = self.skipbadfiles
        if skip is None:
            skip = runner.get("skipbadfiles", False) or False
        return inner, ItemPolicy(
            retries=runner.get("retries", self.retries), skipbadfiles=skip,
            report_skippable=bool(runner.get("use_result_type", False)),
            retry_delay_s=self.retry_delay_s, compression=self.compression)

    def _task_prefix(self) -> str:
        name = self.function_name or ("get_metadata" if self.desc == "Preprocessing"
                                      else "coffea")
        return "".join(c if c.isalnum() or c == "_" else "_" for c in name) or "coffea"

    @contextlib.contextmanager
    def _cluster(self) -> Iterator[Any]:
        if self.cluster is not None:
            yield self.cluster
        elif self.embedded is not None:
            yield self.embedded[1]
        else:
            with self._local_cluster() as cluster:
                yield cluster

    @contextlib.contextmanager
    def _local_cluster(self) -> Iterator[Any]:
        from datavine.cluster import LocalCluster
        from datavine.config import ManagerConfig, RunConfig

        with tempfile.TemporaryDirectory(prefix="datavine-coffea-",
                                         ignore_cleanup_errors=True) as run_dir:
            run = RunConfig(progress=self.status, timeout_s=self.run_timeout_s,
                            pickle_by_value=self.pickle_by_value)
            cluster = LocalCluster(workers=self.workers or default_workers(), cores=self.cores,
                                   memory_mb=self.memory_mb,
                                   manager=ManagerConfig(run_dir=Path(run_dir)), run=run)
            try:
                with cluster:
                    yield cluster
            finally:
                del cluster
                gc.collect()  # the TaskVine manager writes its last logs when collected

    def _finish(self, record: CallRecord, partial: Partial,
                accumulator: Any) -> tuple[Any, Any]:
        record.succeeded = partial.items
        record.skipped = [f for f in partial.failures if f.skipped]
        record.failed = [f for f in partial.failures if not f.skipped]
        out = accumulate([decompress(partial.value), accumulator])
        if record.skipped:
            warnings.warn(skipped_message(record), BadFilesSkippedWarning, stacklevel=3)
        if not record.failed:
            return out, 0
        exc = record.failed[0].to_exception()
        if len(record.failed) > 1:
            exc.add_note(f"datavine: {len(record.failed) - 1} more work item(s) failed: "
                         + "; ".join(f.error[:200] for f in record.failed[1:6]))
        return out, exc


def register_by_value(module_name: str) -> None:
    """Have cloudpickle send ``module_name``'s classes and functions by value."""
    import importlib

    import cloudpickle

    try:
        module = importlib.import_module(module_name)
    except ImportError as exc:
        raise ValueError(f"DatavineExecutor.pickle_by_value: cannot import {module_name!r}: "
                         f"{exc}") from exc
    cloudpickle.register_pickle_by_value(module)


def unwrap_automatic_retries(function: Callable[[Any], Any]) -> tuple[Callable[[Any], Any],
                                                                      dict[str, Any]]:
    """Split ``functools.partial(Runner.automatic_retries, retries, skipbadfiles, func,
    use_result_type=...)`` (how ``Runner`` hands its item function to executors) into
    ``func`` and those settings; any other function comes back as is with ``{}``."""
    if not (isinstance(function, functools.partial)
            and getattr(function.func, "__qualname__", "") == "Runner.automatic_retries"
            and len(function.args) >= 3):
        return function, {}
    retries, skipbadfiles, inner, *extra = function.args
    keywords = dict(function.keywords)
    use_result_type = keywords.pop("use_result_type", False)
    if extra or keywords:
        inner = functools.partial(inner, *extra, **keywords)
    return inner, {"retries": retries, "skipbadfiles": skipbadfiles,
                   "use_result_type": use_result_type}


def build_graph(items: list[Any], function: Callable[[Any], Any], policy: ItemPolicy,
                fanin: int, prefix: str) -> tuple[dict[Key, Any], Key]:
    """One task per item and a merge tree; returns (graph, key of the final merge).

    Keys are ``("<prefix>-item", token, i)`` and ``("<prefix>-merge", token, level, j)``:
    dask's ``key_split`` gives the categories ``<prefix>-item`` and ``<prefix>-merge``.
    Merges take contiguous ranges in item order.
    """
    token = uuid.uuid4().hex
    graph: dict[Key, Any] = {}
    for i, item in enumerate(items):
        graph[(f"{prefix}-item", token, i)] = (run_item, function, item, i, policy)
    final = add_merge_tree(graph, list(graph), fanin,
                           key=lambda depth, j: (f"{prefix}-merge", token, depth, j),
                           task=lambda keys: (merge_partials, keys, policy.compression))
    return graph, final


def skipped_message(record: CallRecord) -> str:
    files = record.skipped_files
    shown = "; ".join(f"{f.filename or f.item} ({f.reason or 'error'}: {f.error[:160]})"
                      for f in record.skipped[:10])
    more = f"; and {len(record.skipped) - 10} more" if len(record.skipped) > 10 else ""
    return (f"{record.desc}: skipped {len(record.skipped)} work item(s) of {len(files)} bad "
            f"file(s): {shown}{more}")
