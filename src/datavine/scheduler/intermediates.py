"""Manager side: values that stay on the worker that made them, as TaskVine temp files.

A bundle's output that only other bundles consume is written by the worker to a file in the
call's sandbox, declared to TaskVine as a temp (``Manager.declare_temp``): TaskVine keeps it
in that worker's cache, runs a consumer where those bytes are when it can (its scheduler
ranks workers by the bytes of a task's inputs they hold), and otherwise moves them
worker-to-worker. Only the graph's requested outputs, and values of at most ``inline_max``
bytes (cheaper inline than as a file), come back to the manager. A temp is undeclared as
soon as its last consumer succeeded, or when the call that was to make it failed.

:class:`Intermediates` is the bookkeeping; TaskVine is reached only through the two
callables it is given (declare, undeclare), so it is tested without TaskVine.
"""

from __future__ import annotations

import itertools
from collections.abc import Callable, Hashable, Iterable
from dataclasses import dataclass, field
from typing import Any

Key = Hashable



@dataclass
class Stored:
    """A value kept on a worker: its temp file, size and the worker that made it."""

    file: Any
    nbytes: int
    worker: str | None


@dataclass
class Plan:
    """How one call moves values: outputs to store (key -> file name), inputs to fetch
    (key -> file name), and the temp files declared for its outputs."""

    store: dict[Key, str] = field(default_factory=dict)
    fetch: dict[Key, str] = field(default_factory=dict)
    declared: dict[Key, Any] = field(default_factory=dict)


class Intermediates:
    """Which values are held on workers, and what each call stores and fetches."""

    def __init__(self, declare: Callable[[], Any], undeclare: Callable[[Any], None]) -> None:
        self._declare = declare
        self._undeclare = undeclare
        self.held: dict[Key, Stored] = {}
        self._names = itertools.count()
        self.kept_bytes = 0  # made and left on workers, over the run
        self.peer_bytes = 0  # fetched by a call on another worker than the one holding them
        self.largest: dict[str, int] = {}  # largest output seen per task category

    def observe(self, category: str, nbytes: int) -> None:
        self.largest[category] = max(nbytes, self.largest.get(category, 0))

    def worth_keeping(self, category: str, inline_max: int) -> bool:
        """Whether outputs of ``category`` may be larger than ``inline_max`` bytes: unknown
        yet (the first bundles of a category keep theirs), or seen so in this run. A
        category whose outputs all came back small stops making temp files."""
        seen = self.largest.get(category)
        return seen is None or seen > inline_max

    def plan(self, outputs: Iterable[Key], inputs: Iterable[Key]) -> Plan:
        """Declare a temp per output to keep (outputs other bundles consume); name the held
        inputs the call fetches. The caller adds ``plan.declared`` / ``held[key].file`` to the
        call under these names."""
        plan = Plan()
        for key in outputs:
            name = f"dv-{next(self._names)}"
            plan.store[key] = name
            plan.declared[key] = self._declare()
        for key in inputs:
            if key in self.held:
                plan.fetch[key] = f"dv-in-{next(self._names)}"
        return plan

    def made(self, plan: Plan, stored: dict[Key, int], inline: Iterable[Key],
             worker: str | None) -> None:
        """The call succeeded: keep the temps of outputs that did not come back inline."""
        inline = set(inline)
        for key, file in plan.declared.items():
            if key in stored and key not in inline:
                self.held[key] = Stored(file, stored[key], worker)
                self.kept_bytes += stored[key]
            else:
                self._undeclare(file)

    def fetched(self, plan: Plan, worker: str | None) -> None:
        """A call that fetched held values ran on ``worker``: count the bytes moved."""
        for key in plan.fetch:
            held = self.held.get(key)
            if held is not None and held.worker != worker:
                self.peer_bytes += held.nbytes

    def failed(self, plan: Plan) -> None:
        """The call did not succeed: its declared temps will never hold anything."""
        for file in plan.declared.values():
            self._undeclare(file)
        plan.declared.clear()

    def consumed(self, key: Key) -> None:
        """Every consumer of ``key`` succeeded: drop its temp."""
        held = self.held.pop(key, None)
        if held is not None:
            self._undeclare(held.file)

    def lost_on(self, workers: set[str]) -> list[Key]:
        """Held values whose only copy was on one of ``workers`` (gone): forgotten here;
        returns their keys, whose producers must run again."""
        return self.lose([k for k, h in self.held.items() if h.worker in workers])

    def lose(self, keys: Iterable[Key]) -> list[Key]:
        """These held values are gone (a call could not fetch them): forget them; returns
        those that were held."""
        lost = [k for k in keys if k in self.held]
        for key in lost:
            self._undeclare(self.held.pop(key).file)
        return lost

    def clear(self) -> None:
        for key in list(self.held):
            self.consumed(key)
