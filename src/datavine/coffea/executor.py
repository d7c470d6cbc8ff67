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
or, by default, on a :class:`datavine.LocalCluster` that the executor starts on first use
and shares with its copies until ``close()``, the end of ``with executor:``, or interpreter
exit (:mod:`datavine.coffea.session`).

Before a call travels (:mod:`datavine.coffea.prepare`): relative local paths are made
absolute, a local file that does not exist is reported at once, code the workers cannot
import is sent by value, and uproot reads through :class:`~datavine.coffea.DatavineSource`
(the file's XCache shard, with failover and near/far byte accounting).

Failures follow coffea's executor contract: ``(accumulator, 0)``, or the merge of the items
that succeeded and the first exception, ``(partial, exception)``. Raised instead: a run that
fails as a whole (no workers, a timeout), a worker that cannot load the code
(:class:`~datavine.coffea.tasks.WorkerImportError`, at the first item), a failed
preprocessing item without ``skipbadfiles`` (coffea's own executors raise it too), and a
processing call in which no item succeeded (coffea would hide the cause behind "No chunks
returned results"). Bad files are skipped under ``skipbadfiles`` with a wider net than
coffea's own (:mod:`datavine.coffea.badfiles`), reported in a
:class:`BadFilesSkippedWarning` and in :attr:`report`. A work item that overruns its memory
cap at the ceiling is split in halves by entry range, down to ``split_min_entries``
(:mod:`datavine.coffea.splitting`).

The embedded cluster serves the live view of its runs (:mod:`datavine.dashboard`): its
address is printed on stderr when the cluster starts and is ``executor.dashboard_url``
(``dashboard=False``: none); a given ``cluster`` has its own (``cluster.dashboard_url``).
"""

from __future__ import annotations

import errno
import functools
import re
import sys
import time
import uuid
import warnings
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal, Protocol, TypedDict, TypeVar, cast

from coffea.processor.accumulator import accumulate
from coffea.processor.executor import ExecutorBase

from datavine.coffea import prepare
from datavine.coffea.progress import CallProgress, EntryRange, Task, subscribed
from datavine.coffea.report import (
    BadFilesSkippedWarning,
    CallRecord,
    ExecutionReport,
    PartialResultWarning,
    skipped_message,
)

__all__ = ["BadFilesSkippedWarning", "CallRecord", "DatavineExecutor", "ExecutionReport",
           "PartialResultWarning", "build_graph", "unwrap_automatic_retries"]
from datavine.coffea.session import EmbeddedCluster
from datavine.coffea.splitting import split_failed_items
from datavine.coffea.tasks import (
    ItemFailure,
    ItemPolicy,
    Partial,
    WorkerImportError,
    decompress,
    merge_partials,
    run_item,
)
from datavine.errors import MemoryCapError, TaskLoadError
from datavine.scheduler.graph import Key, add_merge_tree

if TYPE_CHECKING:
    from datavine.dashboard.launch import DashboardConfig
    from datavine.io.shards import ShardMap
    from datavine.manager.cluster import Cluster, LocalCluster
    from datavine.scheduler.memory import MemoryPolicy

# What a coffea work item imports on a worker (~1.5 s in a fresh Python).
LIBRARY_PRELOAD = ("coffea.processor", "coffea.nanoevents", "coffea.nanoevents.methods.nanoaod",
                   "datavine.coffea.tasks", "hist")


class FileItem(Protocol):
    """A coffea work item (``WorkItem``, ``FileMeta``) as the executor reads it: its file."""

    @property
    def filename(self) -> str: ...


Item = TypeVar("Item", bound=FileItem)
T = TypeVar("T")


class GraphCluster(Protocol):
    """What the executor needs of a given cluster: a dask scheduler ``get`` (a datavine
    ``Cluster``'s, or anything with one); it also reads ``last_summary`` and ``dashboard``
    where there are."""

    def get(self, dsk: object, keys: object, **kwargs: object) -> Any: ...  # user values


class RetrySettings(TypedDict, total=False):
    """The settings ``Runner.automatic_retries`` was bound with
    (:func:`unwrap_automatic_retries`)."""

    retries: int
    skipbadfiles: bool | tuple[type[BaseException], ...]
    use_result_type: bool



@dataclass
class DatavineExecutor(ExecutorBase):
    """Run coffea work items as datavine tasks on TaskVine workers.

    Parameters
    ----------
        cluster : datavine.Cluster, optional
            A started cluster (anything with ``.get(graph, keys)`` and ``.last_summary``).
            ``None`` starts a :class:`datavine.LocalCluster` of ``workers`` x ``cores`` on
            this machine at the first call, shared by this executor and its copies until
            ``close()`` (or ``with executor:`` ends, or the interpreter exits).
        workers, cores, memory_mb : embedded cluster's size (default: one 1-core worker per
            core here).
        merge_fanin : results merged per merge task (>= 2).
        retries : extra attempts of an item whose failure a retry may cure (``Runner``
            reads it, as for coffea's own executors).
        retry_delay_s : pause before attempt n+1 is ``n * retry_delay_s``.
        skipbadfiles : ``None`` takes the ``Runner``'s setting; ``True``/``False``/a tuple
            of exception types overrides it for the items this executor runs.
        run_timeout_s : bound on one call on the embedded cluster (``RunConfig.timeout_s``).
        pickle_by_value : modules (names) to send by value in any case. Modules that a
            fresh interpreter of this Python cannot import (a file next to your script, a
            notebook's helpers) are found and sent by value without being named here.
        shardmap : the XCache shards (:class:`datavine.io.shards.ShardMap`) the embedded
            cluster reads through (a given ``cluster`` uses its own ``RunConfig.shardmap``).
        memory : the embedded cluster's :class:`datavine.scheduler.memory.MemoryPolicy`
            (``"default"``: datavine's; ``None``: no caps, no splitting).
        split_min_entries : a work item over its memory cap at the ceiling is split in
            halves by entry range while the halves have at least this many entries.
        x509_proxy : a proxy file sent with every item (``X509_USER_PROXY`` on the worker);
            ``None`` looks for one as coffea does (``$X509_USER_PROXY``, then
            ``$TMPDIR/x509up_u<uid>``); ``False`` sends none.
        extra_input_files : small files (configs, corrections) placed in each item's
            working directory on the worker, by their base name.
        report : where calls are recorded; shared with copies (``Runner`` runs copies).
        session : the embedded cluster, shared with copies (made when not given).
        dashboard : the embedded cluster's live view (``None``: on unless
            ``DATAVINE_DASHBOARD=0``; ``False``: none; a
            :class:`datavine.dashboard.launch.DashboardConfig`); its address is printed
            when the cluster starts and is :attr:`dashboard_url`.
        status, unit, desc, compression, function_name : as for coffea's executors;
            ``status`` shows bars of submitted, processed and accumulated events (files
            while preprocessing). Ctrl-C while processing returns the merge of the items
            that finished, with a :class:`PartialResultWarning`.
    """

    cluster: GraphCluster | None = None
    workers: int | None = None
    cores: int = 1
    memory_mb: int | None = None
    merge_fanin: int = 8
    retries: int = 3
    retry_delay_s: float = 0.5
    skipbadfiles: bool | tuple[type[BaseException], ...] | None = None
    run_timeout_s: float | None = None
    pickle_by_value: tuple[str, ...] = ()
    shardmap: ShardMap | None = None
    memory: MemoryPolicy | Literal["default"] | None = "default"
    split_min_entries: int = 1
    x509_proxy: str | bool | None = None
    extra_input_files: tuple[str, ...] = ()
    report: ExecutionReport | None = None
    session: EmbeddedCluster | None = None
    dashboard: bool | DashboardConfig | None = None

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
        if self.split_min_entries < 1:
            raise ValueError("DatavineExecutor.split_min_entries must be >= 1, got "
                             f"{self.split_min_entries}")
        if self.report is None:
            self.report = ExecutionReport()
        if self.session is None:
            self.session = EmbeddedCluster()
        self.pickle_by_value = tuple(self.pickle_by_value)
        self.extra_input_files = tuple(str(f) for f in self.extra_input_files)
        for name in self.pickle_by_value:
            prepare.register_module(name)

    def __enter__(self) -> DatavineExecutor:
        """Start the embedded cluster now (it would start at the first call anyway)."""
        if self.cluster is None:
            self._embedded_cluster()
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()

    @property
    def dashboard_url(self) -> str | None:
        """The live view's address of the cluster the items run on (None: no view, or no
        cluster started yet)."""
        cluster = self.cluster if self.cluster is not None else (
            self.session.cluster if self.session is not None else None)
        return getattr(cluster, "dashboard_url", None)

    def close(self) -> None:
        """Stop the embedded cluster, if one runs (shared with this executor's copies)."""
        if self.session is not None:
            self.session.close()

    def __call__(self, items: Iterable[Item], function: Callable[[Item], object],
                 accumulator: object) -> tuple[object, int | BaseException]:
        """coffea's executor call: ``function`` of each item, merged into ``accumulator``;
        (the result, 0) or (the merge of what succeeded, the first exception)."""
        items = prepare.absolute_paths(list(items))
        record = CallRecord(self.desc, len(items))
        assert self.report is not None
        self.report.calls.append(record)
        if not items:
            return accumulator, 0
        inner, policy = self.item_policy(function)
        inner, record.shipped_by_value = prepare.ship_code(inner)
        inner = prepare.with_datavine_reads(inner)
        items, skipped = self._drop_missing(items, policy)
        started = time.monotonic()
        try:
            partial = self._run(items, inner, policy, record) if items else Partial()
        except Exception as exc:
            record.error = f"{type(exc).__name__}: {exc}"
            record.wall_s = time.monotonic() - started
            if isinstance(exc, TaskLoadError):  # the task itself did not unpickle there
                module = re.search(r"No module named '([^']+)'", str(exc))
                name = module.group(1).split(".")[0] if module else "<your module>"
                exc.add_note(f"datavine: with DatavineExecutor, send it by value: "
                             f"DatavineExecutor(pickle_by_value=({name!r},))")
            elif not isinstance(exc, WorkerImportError):
                # The run itself failed (no workers, timeout, a cluster that does not
                # start): no item's output came back, so there is no partial result.
                exc.add_note(f"datavine: the {self.desc.lower()} run of {len(items)} coffea "
                             "work item(s) failed as a whole")
            raise
        record.wall_s = time.monotonic() - started
        partial.failures[:0] = skipped
        return self._finish(record, partial, accumulator)

    def _run(self, items: list[Item], function: Callable[[Item], object], policy: ItemPolicy,
             record: CallRecord) -> Partial:
        """Run the items' graph; items over their memory cap at the ceiling are split in
        halves and the graph run again with the halves (its other items too: a failed run
        keeps no results), until no item overruns or one cannot be split further. Ctrl-C
        while processing returns the merge of the items that finished."""
        cluster = self._cluster()
        unit = "events" if all(hasattr(i, "entrystop") for i in items) else self.unit
        while True:
            graph, final = build_graph(items, function, policy, self.merge_fanin,
                                       self._task_prefix())
            expect_events(cluster, graph, items)
            progress = CallProgress(graph, items, desc=self.desc, unit=unit,
                                    enabled=bool(self.status), compression=policy.compression)
            try:
                with progress, subscribed(cluster, progress):
                    partial = cast(Partial, cluster.get(graph, [final])[0])  # the final merge's
            except MemoryCapError as exc:
                record.summary = getattr(cluster, "last_summary", None)
                items, split = split_failed_items(items, graph, exc, self.split_min_entries)
                record.splits.append(split)
                continue
            except KeyboardInterrupt:
                record.summary = getattr(cluster, "last_summary", None)
                if self.desc == "Preprocessing" or progress.items_done == 0:
                    raise
                record.interrupted = progress.partial_line()
                warnings.warn(f"datavine: interrupted (Ctrl-C): the result is PARTIAL, the "
                              f"merge of what finished: {record.interrupted}",
                              PartialResultWarning, stacklevel=4)
                return progress.finished()
            record.summary = getattr(cluster, "last_summary", None)
            record.processed = (progress.processed, progress.total, unit)
            return partial

    def _drop_missing(self, items: list[Item],
                      policy: ItemPolicy) -> tuple[list[Item], list[ItemFailure]]:
        """Items whose local file does not exist here are skipped (under a ``skipbadfiles``
        that covers ``FileNotFoundError``) or reported at once, never sent to workers."""
        missing = prepare.missing_local_files(items)
        if not missing:
            return items, []
        skip = policy.skipbadfiles
        skippable = skip is True or (isinstance(skip, tuple) and any(
            issubclass(FileNotFoundError, t) for t in skip))
        item = missing[0][1]
        error = FileNotFoundError(errno.ENOENT, "No such file or directory", item.filename)
        if not skippable or policy.report_skippable:
            names = ", ".join(repr(i.filename) for _, i in missing[:5])
            error.add_note(f"datavine: {len(missing)} of the {len(items)} work item(s) of this "
                           f"{self.desc.lower()} call name local files that do not exist on "
                           f"this machine ({names}{' ...' if len(missing) > 5 else ''}); "
                           "nothing was sent to the workers")
            raise error
        skipped = [ItemFailure.capture(i, it, FileNotFoundError(
            errno.ENOENT, "No such file or directory", it.filename), 0, True, "missing")
            for i, it in missing]
        gone = {i for i, _ in missing}
        return [it for i, it in enumerate(items) if i not in gone], skipped

    # ------------------------------------------------------------------------------------
    def item_policy(self, function: Callable[[Item], T]) -> tuple[Callable[[Item], T],
                                                                  ItemPolicy]:
        """The item function without coffea's retry wrapper, and the policy replacing it."""
        inner, runner = unwrap_automatic_retries(function)
        skip = self.skipbadfiles
        if skip is None:
            skip = runner.get("skipbadfiles", False) or False
        proxy = prepare.find_x509_proxy(self.x509_proxy)
        return inner, ItemPolicy(
            retries=runner.get("retries", self.retries), skipbadfiles=skip,
            report_skippable=bool(runner.get("use_result_type", False)),
            retry_delay_s=self.retry_delay_s, compression=self.compression,
            x509_proxy=proxy.read_bytes() if proxy is not None else None,
            extra_files=tuple((Path(f).name, Path(f).read_bytes())
                              for f in self.extra_input_files))

    def _task_prefix(self) -> str:
        name = self.function_name or ("get_metadata" if self.desc == "Preprocessing"
                                      else "coffea")
        return "".join(c if c.isalnum() or c == "_" else "_" for c in name) or "coffea"

    def _cluster(self) -> GraphCluster:
        return self.cluster if self.cluster is not None else self._embedded_cluster()

    def _embedded_cluster(self) -> Cluster:
        assert self.session is not None
        starts = self.session.starts
        cluster = self.session.get(self._make_local_cluster)
        if self.session.starts != starts and getattr(cluster, "dashboard", None) is not None:
            from datavine.dashboard.launch import announce

            print(f"datavine: {announce(cluster)}", file=sys.stderr, flush=True)
        return cluster

    def _make_local_cluster(self, run_dir: Path) -> LocalCluster:
        from datavine.config import ManagerConfig, RunConfig
        from datavine.deploy.launch import local_cluster

        # The executor shows its own bars (in events). The libraries import coffea while
        # the cluster starts, on all workers at once, not in the first items' bundles.
        run = RunConfig(progress=False, timeout_s=self.run_timeout_s, preload=LIBRARY_PRELOAD,
                        pickle_by_value=self.pickle_by_value, shardmap=self.shardmap)
        if self.memory != "default":
            run = run.replace(memory=self.memory)
        return local_cluster(run, ManagerConfig(run_dir=run_dir), workers=self.workers,
                             cores=self.cores, memory_mb=self.memory_mb,
                             dashboard=self.dashboard)

    def _finish(self, record: CallRecord, partial: Partial,
                accumulator: object) -> tuple[object, int | BaseException]:
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
        if self.desc == "Preprocessing" or partial.items == 0:
            # Runner ignores a preprocessing executor's exception and then fails with
            # "Metadata for file ... could not be accessed", and when nothing succeeded
            # with "No chunks returned results": either hides the cause. Raise it here.
            exc.add_note(f"datavine: {len(record.failed)} of {record.items} work item(s) of "
                         f"this {self.desc.lower()} call failed, {partial.items} succeeded")
            exc.partial_output = out  # type: ignore[attr-defined]
            raise exc
        return out, exc


def expect_events(cluster: object, graph: Mapping[Key, Task], items: Sequence[object]) -> None:
    """Tell the cluster's live view and metrics the events of each work item's task (for
    events/s: ``Cluster.expect_events``)."""
    tell = getattr(cluster, "expect_events", None)
    if tell is None:
        return
    weights = {}
    for key, task in graph.items():
        item = task[2] if isinstance(task, tuple) and len(task) > 2 and task[0] is run_item \
            else None
        if isinstance(item, EntryRange):
            weights[key] = int(item.entrystop) - int(item.entrystart)
    tell(weights)


def unwrap_automatic_retries(function: Callable[[Item], T]) -> tuple[Callable[[Item], T],
                                                                      RetrySettings]:
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


def build_graph(items: Sequence[Item], function: Callable[[Item], object], policy: ItemPolicy,
                fanin: int, prefix: str) -> tuple[dict[Key, Task], Key]:
    """One task per item and a merge tree; returns (graph, key of the final merge).

    Keys are ``("<prefix>-item", token, i)`` and ``("<prefix>-merge", token, level, j)``:
    dask's ``key_split`` gives the categories ``<prefix>-item`` and ``<prefix>-merge``.
    Merges take contiguous ranges in item order.
    """
    token = uuid.uuid4().hex
    graph: dict[Key, Task] = {}
    for i, item in enumerate(items):
        graph[(f"{prefix}-item", token, i)] = (run_item, function, item, i, policy)
    final = add_merge_tree(graph, list(graph), fanin,
                           key=lambda depth, j: (f"{prefix}-merge", token, depth, j),
                           task=lambda keys: (merge_partials, keys, policy.compression))
    return graph, final
