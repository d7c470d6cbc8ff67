"""Progress of one executor call in events, and the merge of what finished if it stops early.

:class:`CallProgress` subscribes to the cluster's results for the duration of a call
(:func:`subscribed`, through ``cluster.subscribe_results``): after each bundle it learns which
item and merge tasks finished and receives the bundle's output values. From that it keeps

- counts in coffea's units (events for ``WorkItem`` s, files for preprocessing): submitted,
  processed (items done) and accumulated (items merged by a finished merge task), shown as
  three bars like coffea's ``TaskVineExecutor`` when the executor's ``status`` is on. Each
  item counts once (:class:`datavine.scheduler.once.FirstSeen`): an item or a merge made
  again after a lost worker took its kept value is delivered again, and counting each
  delivery took ``processed`` past the dataset (290 of 280 events when one item was made
  again);
- the *frontier*: the outputs of finished tasks that no finished task has consumed yet.
  Their merge is the result of everything that finished, which is what Ctrl-C returns;
  each item is merged into it once (:func:`disjoint`), and :meth:`CallProgress.held` says
  which items it holds.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Hashable, Iterable, Iterator, Mapping, Sequence
from contextlib import AbstractContextManager
from types import TracebackType
from typing import TYPE_CHECKING, Protocol, cast, runtime_checkable

from datavine.coffea.tasks import Partial, merge_partials
from datavine.manager.port import ResultHook
from datavine.scheduler.once import FirstSeen

if TYPE_CHECKING:
    from rich.progress import Progress, TaskID

Key = Hashable
# a task of the executor's graph: (run_item, function, item, index, policy) for a work item,
# (merge_partials, the keys it merges, compression) for a merge
Task = tuple[object, ...]


@runtime_checkable
class EntryRange(Protocol):
    """A coffea ``WorkItem`` as far as its events go: its entry range."""

    entrystart: int
    entrystop: int


def item_size(item: object) -> int:
    """Events of a ``WorkItem`` (its entry range); 1 for anything else (a file)."""
    start, stop = getattr(item, "entrystart", None), getattr(item, "entrystop", None)
    if isinstance(start, int) and isinstance(stop, int):
        return max(0, stop - start)
    return 1


class CallProgress:
    """Counts and frontier of one call's graph (see the module docstring)."""

    def __init__(self, graph: Mapping[Key, Task], items: Sequence[object], *, desc: str,
                 unit: str, enabled: bool, compression: int | None) -> None:
        self.compression = compression
        self.order = {k: i for i, k in enumerate(graph)}
        self.size: dict[Key, int] = {}
        self.deps: dict[Key, list[Key]] = {}
        for key, task in graph.items():
            if isinstance(key, tuple) and str(key[0]).endswith("-item"):
                self.size[key] = item_size(items[int(key[2])])
            else:  # a merge: the keys it merges
                self.deps[key] = list(cast("Iterable[Key]", task[1]))
        self.total = sum(self.size.values())
        self.processed = 0
        self.accumulated = 0
        self.done_items: FirstSeen[Key] = FirstSeen()  # items delivered, each once
        self.merged_items: FirstSeen[Key] = FirstSeen()  # items a finished merge consumed
        self.frontier: dict[Key, Partial] = {}
        self.desc, self.unit, self.enabled = desc, unit, enabled
        self._bars: Progress | None = None
        self._ids: list[TaskID] = []

    @property
    def items_done(self) -> int:
        """Work items finished (each once, however often it was delivered)."""
        return len(self.done_items)

    # --- the results' subscriber -------------------------------------------------------
    def __call__(self, keys: list[Key], values: dict[Key, object]) -> None:
        size = self.size.__getitem__
        self.processed += self.done_items.count((k for k in keys if k in self.size), size)
        for key in keys:
            deps = self.deps.get(key, ())
            for dep in deps:
                self.frontier.pop(dep, None)
            self.accumulated += self.merged_items.count((d for d in deps if d in self.size),
                                                        size)
        for key, value in values.items():
            if isinstance(value, Partial):
                self.frontier[key] = value
        self._refresh()

    def covers(self, key: Key) -> frozenset[Key]:
        """The work items whose results ``key``'s value holds (itself, for an item)."""
        items: set[Key] = set()
        todo = [key]
        while todo:
            k = todo.pop()
            if k in self.size:
                items.add(k)
            todo.extend(self.deps.get(k, ()))
        return frozenset(items)

    def kept(self) -> list[Key]:
        """The frontier's keys that go into :meth:`finished`: in item order, each item held
        by one of them only."""
        ordered = sorted(self.frontier, key=self.order.__getitem__)
        return disjoint(ordered, self.covers)

    def held(self) -> frozenset[Key]:
        """The work items whose results :meth:`finished` merges."""
        return frozenset().union(*(self.covers(k) for k in self.kept()))

    def finished(self) -> Partial:
        """The merge of every output that finished (in item order, each item once); never
        raises."""
        parts = [self.frontier[k] for k in self.kept()]
        return merge_partials(parts, self.compression) if parts else Partial()

    # --- display -------------------------------------------------------------------------
    def __enter__(self) -> CallProgress:
        if self.enabled:
            from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn

            self._bars = Progress(TextColumn("{task.description:>12}"), BarColumn(),
                                  MofNCompleteColumn(), TextColumn(self.unit))
            self._bars.__enter__()
            self._ids = [self._bars.add_task(name, total=self.total) for name in
                         ("Submitted", "Processed", "Accumulated")]
            self._bars.update(self._ids[0], completed=self.total)
        return self

    def __exit__(self, exc_type: type[BaseException] | None, exc: BaseException | None,
                 tb: TracebackType | None) -> None:
        if self._bars is not None:
            self._refresh()
            self._bars.__exit__(exc_type, exc, tb)
            self._bars = None

    def _refresh(self) -> None:
        if self._bars is not None:
            self._bars.update(self._ids[1], completed=self.processed)
            self._bars.update(self._ids[2], completed=self.accumulated)

    def line(self) -> str:
        return (f"{self.processed:,} of {self.total:,} {self.unit} processed, "
                f"{self.accumulated:,} accumulated ({self.items_done} of {len(self.size)} "
                "work items)")

    def partial_line(self) -> str:
        """:meth:`line`, and what :meth:`finished` holds where it holds fewer items (values
        kept on a lost worker, or that could not be fetched after Ctrl-C)."""
        held = self.held()
        if len(held) >= self.items_done:
            return self.line()
        events = sum(self.size[k] for k in held)
        return (f"{self.line()}; the result holds {len(held)} of them ({events:,} "
                f"{self.unit}): the others' values were lost with a worker or could not be "
                "fetched")


def disjoint(keys: Iterable[Key], covers: Callable[[Key], frozenset[Key]]) -> list[Key]:
    """Of ``keys`` (values to merge, in order), those to merge so that no item is merged
    twice: a value whose items overlap those of a value taken before it, or of a larger one
    after it, is left out (the larger value holds more of the work)."""
    keys = list(keys)
    ranked = sorted(keys, key=lambda k: -len(covers(k)))  # stable: ties keep their order
    taken: set[Key] = set()
    chosen: set[Key] = set()
    for key in ranked:
        items = covers(key)
        if not items & taken:
            taken |= items
            chosen.add(key)
    return [k for k in keys if k in chosen]


@runtime_checkable
class ResultSource(Protocol):
    """A cluster whose runs hand their results to subscribers (a datavine ``Cluster``)."""

    def subscribe_results(self, hook: ResultHook) -> AbstractContextManager[None]:
        ...


@contextlib.contextmanager
def subscribed(cluster: object, hook: ResultHook) -> Iterator[None]:
    """``hook`` subscribed to ``cluster``'s results for the block; a cluster that offers no
    subscription (any object with ``get``) gets none: no progress, no partial result on
    Ctrl-C."""
    if not isinstance(cluster, ResultSource):
        yield
        return
    with cluster.subscribe_results(hook):
        yield
