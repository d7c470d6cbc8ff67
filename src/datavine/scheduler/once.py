"""Counting each task once, however often its value is delivered.

A run delivers a task's value again when it is made again: a value kept on a worker that
was lost is remade (``Planner.undo``), and the task's consumers may be remade with it. The
value is the same (a task is a pure function of its inputs), so the result is right, but
every count kept per delivery (tasks done, events processed, work items merged, files read)
would grow past the graph. :class:`FirstSeen` is the one rule for such counts: they are
keyed by the task's identity (its key) and a key counts the first time it is seen.

Pure: no clock, no I/O; used by the run's state (``RunSummary.tasks``, and ``Deliver.again``,
which the progress bar and the live view's records take from it) and the coffea executor's
progress (events processed and accumulated).
"""

from __future__ import annotations

from collections.abc import Callable, Hashable, Iterable
from typing import Generic, TypeVar

K = TypeVar("K", bound=Hashable)


class FirstSeen(Generic[K]):
    """The keys seen so far; :meth:`first` says which of some keys are new."""

    def __init__(self) -> None:
        self.seen: set[K] = set()

    def __len__(self) -> int:
        return len(self.seen)

    def __contains__(self, key: object) -> bool:
        return key in self.seen

    def first(self, keys: Iterable[K]) -> list[K]:
        """The keys not seen before, in their order and each once (a key repeated within
        ``keys`` too); from now on they are seen."""
        new: list[K] = []
        for key in keys:
            if key not in self.seen:
                self.seen.add(key)
                new.append(key)
        return new

    def count(self, keys: Iterable[K], size: Callable[[K], int] = lambda _: 1) -> int:
        """The summed ``size`` of the keys in ``keys`` not seen before (then seen)."""
        return sum(size(k) for k in self.first(keys))
