"""Manager side: values that stay on the worker that made them, as TaskVine temp files.

A bundle's outputs that only other bundles consume are written by the worker to ONE file in
the call's sandbox (:mod:`datavine.worker.value_file`: each value pickled once, its arrays'
memory written straight out, and mapped by the consumer), declared to TaskVine as a temp
(``Manager.declare_temp``): TaskVine keeps it in that worker's cache, runs a consumer where
those bytes are when it can (its scheduler ranks workers by the bytes of a task's inputs they
hold), and otherwise moves it worker-to-worker. Only the graph's requested outputs, and values
of at most ``inline_max`` bytes (cheaper inline than in a file; the worker leaves them out of
the file), come back to the manager.

One file per bundle, not one per output: TaskVine's cost is per file (the worker's stage-out,
a cache update per file, an unlink per file when it is dropped): 500 small outputs kept as
500 temps took ~1 s of a bundle that computes in milliseconds (a 2,001-task graph ran at
~900 tasks/s against ~5,000 with ``keep_on_workers=False``). A consumer fetches the whole
file of each bundle it reads from (a value is never split from its siblings); a file is
undeclared once every value it holds is consumed, or lost, or when the call that was to make
it failed.

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
    """A value kept on a worker: its bundle's temp file, its size and the worker that made it."""

    file: Any
    nbytes: int
    worker: str | None


@dataclass
class Plan:
    """How one call moves values: outputs to store (key -> file name: one file for all of
    them), inputs to fetch (key -> file name: one per held file they are in), and the temp
    declared for its outputs (key -> that file)."""

    store: dict[Key, str] = field(default_factory=dict)
    fetch: dict[Key, str] = field(default_factory=dict)
    declared: dict[Key, Any] = field(default_factory=dict)


class Intermediates:
    """Which values are held on workers, in which bundle files, and what each call stores
    and fetches."""

    def __init__(self, declare: Callable[[], Any], undeclare: Callable[[Any], None],
                 largest: dict[str, int] | None = None) -> None:
        self._declare = declare
        self._undeclare = undeclare
        self.held: dict[Key, Stored] = {}
        self._in_file: dict[int, set[Key]] = {}  # id(file) -> held keys in it
        self._names = itertools.count()
        self.kept_bytes = 0  # made and left on workers, over the run
        self.peer_bytes = 0  # fetched by a call on another worker than the one holding them
        # largest output seen per task category; ``largest``: the manager's, kept across runs
        self.largest: dict[str, int] = {} if largest is None else largest

    def observe(self, category: str, nbytes: int) -> None:
        self.largest[category] = max(nbytes, self.largest.get(category, 0))

    def worth_keeping(self, category: str, inline_max: int) -> bool:
        """Whether outputs of ``category`` may be larger than ``inline_max`` bytes: unknown
        yet (the first bundles of a category keep theirs), or seen so (in this run or, when
        the manager's record is passed in, an earlier one). A category whose outputs all came
        back small stops making temp files; one that turns out large again is kept again
        from its next bundle on (:meth:`observe` records the larger size)."""
        seen = self.largest.get(category)
        return seen is None or seen > inline_max

    def plan(self, outputs: Iterable[Key], inputs: Iterable[Key]) -> Plan:
        """Declare one temp for the outputs to keep (outputs other bundles consume); name
        each held file the call's inputs are in. The caller adds ``plan.declared`` /
        ``held[key].file`` to the call under these names."""
        plan = Plan()
        outputs = list(outputs)
        if outputs:
            name, file = f"dv-{next(self._names)}", self._declare()
            for key in outputs:
                plan.store[key] = name
                plan.declared[key] = file
        names: dict[int, str] = {}
        for key in inputs:
            held = self.held.get(key)
            if held is not None:
                fid = id(held.file)
                if fid not in names:
                    names[fid] = f"dv-in-{next(self._names)}"
                plan.fetch[key] = names[fid]
        return plan

    def made(self, plan: Plan, stored: dict[Key, int], inline: Iterable[Key],
             worker: str | None) -> None:
        """The call succeeded: hold the outputs that were written to its file (not those
        that came back inline); a file that holds none is undeclared at once."""
        inline = set(inline)
        files: dict[int, Any] = {}
        for key, file in plan.declared.items():
            files[id(file)] = file
            if key in stored and key not in inline:
                self.held[key] = Stored(file, stored[key], worker)
                self._in_file.setdefault(id(file), set()).add(key)
                self.kept_bytes += stored[key]
        for fid, file in files.items():
            if fid not in self._in_file:
                self._undeclare(file)

    def fetched(self, plan: Plan, worker: str | None) -> None:
        """A call that fetched held files ran on ``worker``: count the bytes moved (a whole
        file moves, whichever of its values the call needs)."""
        seen: set[int] = set()
        for key in plan.fetch:
            held = self.held.get(key)
            if held is None or held.worker == worker or id(held.file) in seen:
                continue
            seen.add(id(held.file))
            self.peer_bytes += sum(self.held[k].nbytes for k in self._in_file[id(held.file)])

    def failed(self, plan: Plan) -> None:
        """The call did not succeed: its declared temp will never hold anything."""
        for fid, file in {id(f): f for f in plan.declared.values()}.items():
            if fid not in self._in_file:
                self._undeclare(file)
        plan.declared.clear()

    def consumed(self, key: Key) -> None:
        """Every consumer of ``key`` succeeded: forget it; its file is dropped with the last
        value it holds."""
        held = self.held.pop(key, None)
        if held is not None:
            siblings = self._in_file[id(held.file)]
            siblings.discard(key)
            if not siblings:
                del self._in_file[id(held.file)]
                self._undeclare(held.file)

    def lost_on(self, workers: set[str]) -> list[Key]:
        """Held values whose only copy was on one of ``workers`` (gone): forgotten here;
        returns their keys, whose producers must run again."""
        return self.lose([k for k, h in self.held.items() if h.worker in workers])

    def lose(self, keys: Iterable[Key]) -> list[Key]:
        """These held values are gone (a call could not fetch them): forget them and every
        value in the same files (a file is lost whole); returns those that were held."""
        lost: list[Key] = []
        for key in keys:
            held = self.held.get(key)
            if held is None:
                continue
            fid = id(held.file)
            for sibling in sorted(self._in_file.pop(fid), key=repr):
                lost.append(sibling)
                del self.held[sibling]
            self._undeclare(held.file)
        return lost

    def clear(self) -> None:
        for key in list(self.held):
            self.consumed(key)
