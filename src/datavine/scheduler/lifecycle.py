"""The life of a bundle, as one table of phases and the moves allowed between them, and the
record of every move: what happened to a bundle or a task, and why (its *story*).

:class:`datavine.scheduler.run_state.RunState` moves a bundle in one place
(``RunState._move``), which checks the move against :data:`MOVES` here and records it as a
:class:`Step` (when, from which phase to which, the call, the reason, where). A move the
table does not allow is an :class:`IllegalMove` naming the bundle and both phases: a bug
in the state machine, caught where it happens instead of as a wrong result later.

The phases, and the table of moves (:data:`MOVES`)::

    phase        the bundle ...                                   may move to
    new          was formed by the planner                        held, sent
    held         waits for a slot near its files (delay           sent, abandoned
                 scheduling, datavine.scheduler.dispatch)
    sent         is a call in TaskVine's queue                    running, withdrawing, or an end
    running      was seen on a worker                             sent (TaskVine put it back: its
                                                                  worker or library died),
                                                                  withdrawing, or an end
    withdrawing  is being cancelled (its worker left, its         withdrawn, or an end (the call
                 library never started, an input it fetches      came back before the cancel)
                 was lost)
    done         came back and its values were taken              (end)
    retried      came back failed, or died with its worker:       (end)
                 its tasks are ready again (reason: memory
                 overrun, lost worker, time limit, input lost)
    failed-over  a shard failed under one of its reads: its       (end)
                 tasks are ready again, to read from the next
                 shard in line
    withdrawn    was cancelled: its tasks are ready again         (end)
                 (reason: lost worker, an attempt counted;
                 requeued, not its fault)
    failed       the run fails on it (a task raised, a load or    (end)
                 protocol error, retries or caps ran out)
    abandoned    was held or out when the run ended               (end)

"an end" from sent, running and withdrawing: done, retried, failed-over, failed, abandoned.

A task (dask key) is in one bundle at a time; a bundle that ends other than done gives its
tasks back to the planner, which puts them in a new bundle. So a task's story is the steps
of each bundle it was in, plus notes of its own (a value lost with a worker: run again).
The record is kept as JSON-ready data in the run's summary (``RunSummary.lifecycle``,
:meth:`Lifecycle.to_dict`) and read back with :meth:`Lifecycle.from_dict`:
``cluster.story(key)`` and ``datavine story RUN.json [KEY]`` tell it.

Pure: no clock (times come with each move), no I/O.
"""

from __future__ import annotations

import ast
import enum
import itertools
from collections.abc import Container, Hashable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from datavine.errors import DatavineError

Key = Hashable


class Phase(enum.StrEnum):
    NEW = "new"
    HELD = "held"
    SENT = "sent"
    RUNNING = "running"
    WITHDRAWING = "withdrawing"
    DONE = "done"
    RETRIED = "retried"
    FAILED_OVER = "failed-over"
    WITHDRAWN = "withdrawn"
    FAILED = "failed"
    ABANDONED = "abandoned"


class Reason(enum.StrEnum):
    """Why a bundle was retried, withdrawn or failed."""

    MEMORY = "memory overrun"
    INPUT = "input failure"  # a shard failed under a read
    LOST_WORKER = "lost worker"  # its worker or library died under it, or the worker left
    TIME_LIMIT = "time limit"
    INPUT_LOST = "input lost"  # a value another bundle kept on a worker did not arrive
    REQUEUED = "requeued"  # not its fault: its library never started, an input was lost
    TASK_ERROR = "task error"
    LOAD = "load error"  # its tasks could not be loaded on the worker
    PROTOCOL = "protocol"  # the worker and the manager run different datavines


_OUT = frozenset({Phase.DONE, Phase.RETRIED, Phase.FAILED_OVER, Phase.FAILED, Phase.ABANDONED})
# The table: from each phase, the phases a bundle may move to. A phase with none is an end.
MOVES: Mapping[Phase, frozenset[Phase]] = {
    Phase.NEW: frozenset({Phase.HELD, Phase.SENT}),
    Phase.HELD: frozenset({Phase.SENT, Phase.ABANDONED}),
    Phase.SENT: _OUT | {Phase.RUNNING, Phase.WITHDRAWING},
    Phase.RUNNING: _OUT | {Phase.SENT, Phase.WITHDRAWING},
    Phase.WITHDRAWING: _OUT | {Phase.WITHDRAWN},
    Phase.DONE: frozenset(),
    Phase.RETRIED: frozenset(),
    Phase.FAILED_OVER: frozenset(),
    Phase.WITHDRAWN: frozenset(),
    Phase.FAILED: frozenset(),
    Phase.ABANDONED: frozenset(),
}
LIVE = frozenset({Phase.HELD, Phase.SENT, Phase.RUNNING, Phase.WITHDRAWING})
OUT = frozenset({Phase.SENT, Phase.RUNNING, Phase.WITHDRAWING})  # a call in flight
ENDS = frozenset(p for p, to in MOVES.items() if not to)


class IllegalMove(DatavineError):
    """A move the lifecycle table (:data:`MOVES`) does not allow: a bug in the run state."""


class InvariantError(DatavineError):
    """The lifecycle and the rest of the run state disagree (:meth:`Lifecycle.check`)."""


@dataclass(frozen=True, slots=True)
class Step:
    """One move of a bundle (or, with ``bundle`` None, a note on a task: ``keys``)."""

    seq: int  # order of the moves in the run
    t: float  # seconds since the run started
    bundle: int | None
    call: int | None
    came_from: Phase | None
    phase: Phase | None
    reason: Reason | None = None
    detail: str = ""  # where (worker, rack, shard) and what, in words
    keys: tuple[Key, ...] = ()  # a note's tasks

    def __str__(self) -> str:
        if self.bundle is None:
            what = f"task {_shown(self.keys)}"
            move = ""
        else:
            call = f" (call {self.call})" if self.call is not None else ""
            what = f"bundle {self.bundle}{call}"
            move = f" {self.came_from} -> {self.phase}"
        why = f" [{self.reason}]" if self.reason is not None else ""
        detail = f": {self.detail}" if self.detail else ""
        return f"{self.t:9.3f} s  {what}{move}{why}{detail}"

    def as_row(self) -> list[Any]:
        """A bundle's step as JSON: ``[seq, t, call, from, to, reason, detail]`` (the
        phases and the reason are ``str`` enums: JSON writes their names)."""
        return [self.seq, self.t, self.call, self.came_from, self.phase, self.reason,
                self.detail]

    def as_note(self) -> dict[str, Any]:
        """A note on tasks as JSON."""
        return {"seq": self.seq, "t": self.t, "detail": self.detail,
                "keys": [repr(k) for k in self.keys]}


@dataclass(slots=True)
class Life:
    """One bundle: its tasks, its phase now, its call now, its steps."""

    bundle: int
    keys: tuple[Key, ...]
    phase: Phase = Phase.NEW
    call: int | None = None
    reason: Reason | None = None  # of its last move that had one
    steps: list[Step] = field(default_factory=list)


class Lifecycle:
    """Every bundle of one run, its phase and its steps; each task's bundles and notes."""

    def __init__(self, start: float = 0.0) -> None:
        self.start = start
        self.bundles: dict[int, Life] = {}
        self.of_key: dict[Key, list[int]] = {}  # task -> the bundles it was in, in order
        self.notes: dict[Key, list[Step]] = {}  # task -> notes on it
        self._seq = itertools.count()

    def move(self, bundle: int, to: Phase, now: float, *, keys: Sequence[Key] = (),
             call: int | None = None, reason: Reason | None = None, detail: str = "") -> Step:
        """Move ``bundle`` to phase ``to`` at time ``now`` (a bundle not seen yet is new, of
        ``keys``), recording the step; IllegalMove when the table does not allow it."""
        life = self.bundles.get(bundle)
        if life is None:
            life = self.bundles[bundle] = Life(bundle, tuple(keys))
            for key in life.keys:
                self.of_key.setdefault(key, []).append(bundle)
        if to not in MOVES[life.phase]:
            allowed = ", ".join(sorted(MOVES[life.phase])) or "none: it has ended"
            raise IllegalMove(
                f"bundle {bundle} (tasks {_shown(life.keys)}) cannot move from "
                f"{life.phase} to {to} (allowed from {life.phase}: {allowed}); its story:\n"
                + tell(life.steps))
        if call is not None:
            life.call = call
        step = Step(next(self._seq), round(now - self.start, 3), bundle, life.call,
                    life.phase, to, reason, detail)
        life.phase = to
        if reason is not None:
            life.reason = reason
        life.steps.append(step)
        return step

    def note(self, keys: Iterable[Key], now: float, detail: str) -> None:
        """A note on tasks outside any bundle's move (their values were lost: run again)."""
        keys = tuple(keys)
        step = Step(next(self._seq), round(now - self.start, 3), None, None, None, None,
                    detail=detail, keys=keys)
        for key in keys:
            self.notes.setdefault(key, []).append(step)

    def phase(self, bundle: int) -> Phase:
        return self.bundles[bundle].phase

    def in_phase(self, phases: frozenset[Phase]) -> list[Life]:
        return [life for life in self.bundles.values() if life.phase in phases]

    def check(self, out: Mapping[int, tuple[int, bool]], held: Iterable[int],
              done: Container[Key], tasks: Iterable[Key]) -> None:
        """InvariantError unless the lifecycle agrees with the run state's view: ``out``,
        the calls in flight (call -> (bundle, being withdrawn)); ``held``, the bundles the
        dispatcher holds; ``done``, the tasks done; ``tasks``, all of the run's tasks."""
        errors: list[str] = []
        for call, (bundle, withdrawing) in out.items():
            life = self.bundles.get(bundle)
            if life is None or life.phase not in OUT or life.call != call:
                phase = "unknown" if life is None else f"{life.phase} (call {life.call})"
                errors.append(f"call {call} is in flight but its bundle {bundle} is {phase}")
            elif (life.phase is Phase.WITHDRAWING) != withdrawing:
                errors.append(f"bundle {bundle} is {life.phase} but its call is "
                              f"{'' if withdrawing else 'not '}being withdrawn")
        call_of = {bundle: call for call, (bundle, _) in out.items()}
        held = set(held)
        errors += [f"bundle {b} is held by the dispatcher but unknown here"
                   for b in sorted(held - self.bundles.keys())]
        live: dict[Key, int] = {}
        for life in self.bundles.values():
            if life.phase in OUT and call_of.get(life.bundle) != life.call:
                errors.append(f"bundle {life.bundle} is {life.phase} but its call "
                              f"{life.call} is not in flight")
            if (life.phase is Phase.HELD) != (life.bundle in held):
                errors.append(f"bundle {life.bundle} is {life.phase} but the dispatcher "
                              f"{'holds' if life.bundle in held else 'does not hold'} it")
            came = Phase.NEW
            for step in life.steps:
                if step.came_from is not came:
                    errors.append(f"bundle {life.bundle}'s step {step.seq} comes from "
                                  f"{step.came_from}, not {came}")
                came = step.phase or came
            if came is not life.phase:
                errors.append(f"bundle {life.bundle} is {life.phase}, its last step {came}")
            for key in life.keys if life.phase in LIVE else ():
                if key in live:
                    errors.append(f"task {key!r} is in live bundles {live[key]} and "
                                  f"{life.bundle}")
                live[key] = life.bundle
                if key in done:
                    errors.append(f"task {key!r} is done and in live bundle {life.bundle}")
        for key in tasks:
            if self.key_done(key) != (key in done):
                state = "done" if key in done else "not done"
                errors.append(f"task {key!r} is {state} but its story ends "
                              f"{'done' if self.key_done(key) else 'elsewhere'}")
        if errors:
            more = f" (and {len(errors) - 10} more)" if len(errors) > 10 else ""
            raise InvariantError("; ".join(errors[:10]) + more)

    def key_done(self, key: Key) -> bool:
        """The last bundle ``key`` was in is done, and its value was not lost since."""
        bundles = self.of_key.get(key)
        if not bundles:
            return False
        last = self.bundles[bundles[-1]]
        if last.phase is not Phase.DONE:
            return False
        notes = self.notes.get(key)
        return not notes or notes[-1].seq < last.steps[-1].seq

    # --- stories -------------------------------------------------------------------------------
    def story(self, what: Any) -> list[Step]:
        """What happened to a task (its dask key, or the key's ``repr`` or ``str``) or to a
        bundle (its number, or ``"bundle N"``), step by step in the order it happened.
        KeyError when the run had no such task or bundle."""
        key = self.find_key(what)
        if key is not None:
            steps = [s for b in self.of_key.get(key, ()) for s in self.bundles[b].steps]
            steps += self.notes.get(key, [])
            return sorted(steps, key=lambda s: s.seq)
        number = _bundle_number(what)
        if number is not None and number in self.bundles:
            return list(self.bundles[number].steps)
        raise KeyError(f"no task or bundle {what!r} in this run ({len(self.of_key)} tasks, "
                       f"{len(self.bundles)} bundles)")

    def find_key(self, what: Any) -> Key | None:
        """The task ``what`` names: the key itself, or its ``repr`` or ``str``."""
        try:
            if what in self.of_key:
                return what  # type: ignore[no-any-return]
        except TypeError:  # not hashable
            return None
        if isinstance(what, str):
            for key in self.of_key:
                if what in (repr(key), str(key)):
                    return key
        return None

    def keys_story(self, keys: Iterable[Key]) -> list[Step]:
        """The steps of every bundle any of ``keys`` was in (and their notes), in order."""
        bundles = {b for k in keys for b in self.of_key.get(k, ())}
        steps = {s.seq: s for b in bundles for s in self.bundles[b].steps}
        steps.update((s.seq, s) for k in keys for s in self.notes.get(k, ()))
        return [steps[seq] for seq in sorted(steps)]

    def troubled(self) -> list[Life]:
        """Bundles that did not go straight through (failed first, then retried,
        failed over, withdrawn, abandoned, and any still out), in the order they formed."""
        rank = {Phase.FAILED: 0, Phase.RETRIED: 1, Phase.FAILED_OVER: 1, Phase.WITHDRAWN: 2,
                Phase.ABANDONED: 3}
        lives = [life for life in self.bundles.values() if life.phase is not Phase.DONE
                 or any(s.phase is Phase.SENT and s.came_from is Phase.RUNNING
                        for s in life.steps)]
        return sorted(lives, key=lambda life: (rank.get(life.phase, 4), life.bundle))

    # --- kept with the run's summary -----------------------------------------------------------
    def to_dict(self) -> dict[str, Any]:
        """JSON-ready: ``bundles``, each with its ``keys`` (as their ``repr``), ``phase`` and
        ``steps`` (rows: ``[seq, t, call, from, to, reason, detail]``), and ``notes``."""
        return {
            "bundles": [{"bundle": life.bundle, "keys": [repr(k) for k in life.keys],
                         "phase": life.phase,
                         "steps": [s.as_row() for s in life.steps]}
                        for life in self.bundles.values()],
            "notes": [s.as_note() for s in _unique(self.notes.values())],
        }

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> Lifecycle:
        """Read back what :meth:`to_dict` wrote (keys that are Python literals come back as
        the keys they were; others as their ``repr``)."""
        life = cls()
        seqs = [0]
        for entry in data.get("bundles", ()):
            keys = tuple(_key(k) for k in entry.get("keys", ()))
            bundle = int(entry["bundle"])
            one = life.bundles[bundle] = Life(bundle, keys, Phase(entry.get("phase", "new")))
            for key in keys:
                life.of_key.setdefault(key, []).append(bundle)
            for row in entry.get("steps", ()):
                one.steps.append(_row(row, bundle))
                seqs.append(one.steps[-1].seq)
            one.call = one.steps[-1].call if one.steps else None
            one.reason = next((s.reason for s in reversed(one.steps) if s.reason), None)
        for note in data.get("notes", ()):
            step = Step(int(note["seq"]), float(note["t"]), None, None, None, None,
                        detail=str(note.get("detail", "")),
                        keys=tuple(_key(k) for k in note.get("keys", ())))
            seqs.append(step.seq)
            for key in step.keys:
                life.notes.setdefault(key, []).append(step)
        life._seq = itertools.count(max(seqs) + 1)
        return life


def tell(steps: Iterable[Step], limit: int = 0) -> str:
    """Steps as lines (only the last ``limit``, when more)."""
    steps = list(steps)
    lines = [f"  {s}" for s in steps]
    if limit and len(lines) > limit:
        lines = [f"  ... {len(lines) - limit} earlier steps", *lines[-limit:]]
    return "\n".join(lines)


def _row(row: Sequence[Any], bundle: int) -> Step:
    seq, t, call, came_from, phase, reason, detail = row
    return Step(int(seq), float(t), bundle, None if call is None else int(call),
                Phase(came_from), Phase(phase), Reason(reason) if reason else None, str(detail))


def _key(text: str) -> Key:
    """A key back from its ``repr``: the literal when it is one (str, int, tuple of them)."""
    try:
        key = ast.literal_eval(text)
    except (ValueError, SyntaxError, TypeError, MemoryError, RecursionError):
        return text
    try:
        hash(key)
    except TypeError:
        return text
    return key  # type: ignore[no-any-return]


def _bundle_number(what: Any) -> int | None:
    if isinstance(what, bool):
        return None
    if isinstance(what, int):
        return what
    if isinstance(what, str):
        text = what.strip().removeprefix("bundle").strip()
        return int(text) if text.isdigit() else None
    return None


def _unique(groups: Iterable[list[Step]]) -> list[Step]:
    seen: dict[int, Step] = {}
    for steps in groups:
        for s in steps:
            seen.setdefault(s.seq, s)
    return [seen[seq] for seq in sorted(seen)]


def _shown(keys: Sequence[Key]) -> str:
    return ", ".join(repr(k) for k in keys[:3]) + (f" ... ({len(keys)} in all)"
                                                   if len(keys) > 3 else "")
