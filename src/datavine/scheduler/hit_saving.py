"""Pure learning: what a task saves by running where a worker's column cache holds its
pieces, per category of task.

A held task waits for the worker whose cache holds its pieces (delay scheduling,
:mod:`datavine.scheduler.placement`). Waiting pays only while the wait is shorter than what
decoding the task's columns from its file costs over taking them from memory: a worker that
sits idle longer than that would have finished the task sooner by reading it cold (a run's
end: one worker holds the last file's pieces, the others have nothing left). This module
learns that difference from the bundles' results. Per category, a bundle's time is fitted
as ``tasks x base + decoded bytes x per_byte`` (least squares over the recent bundles:
bundles of hits, cold reads and both in one call tell the two apart), and the bytes a task
reads as the moving average of what its bundles decoded or took from memory; a hit saves
``per_byte x bytes``. A ZSTD chunk of the default scale test saves ~35 ms; an LZMA one
many times that, so a warm LZMA rerun still waits for the worker that holds its columns.

No I/O: the run state feeds results in, the dispatcher asks for the saving.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import NamedTuple

from datavine.protocol import ReadRecordDict

FORGET = 0.8  # weight of what was learned before each new bundle (recent bundles count most)
CONDITION = 1e-3  # the least determinant, relative to its terms, that tells the two apart


def bytes_split(reads: Iterable[ReadRecordDict]) -> tuple[int, int]:
    """A bundle's decoded bytes: those decoded from their files and those the column cache
    served (0, 0 without a column cache) (pure)."""
    decoded = cached = 0
    for r in reads:
        decoded += r.get("decoded", 0)
        cached += r.get("cached", 0)
    return decoded, cached


@dataclass
class _Fit:
    """One category's least-squares sums for ``seconds = tasks x base + decoded x
    per_byte``, older bundles weighted down by :data:`FORGET` each, and the decoded bytes
    a task reads (moving average)."""

    nn: float = 0.0
    nd: float = 0.0
    dd: float = 0.0
    nt: float = 0.0
    dt: float = 0.0
    task_bytes: float = 0.0

    def add(self, tasks: int, decoded: float, seconds: float, task_bytes: float) -> None:
        f = FORGET
        self.nn = f * self.nn + tasks * tasks
        self.nd = f * self.nd + tasks * decoded
        self.dd = f * self.dd + decoded * decoded
        self.nt = f * self.nt + tasks * seconds
        self.dt = f * self.dt + decoded * seconds
        self.task_bytes = (task_bytes if not self.task_bytes
                           else self.task_bytes + (1 - f) * (task_bytes - self.task_bytes))

    def costs(self) -> TaskCosts | None:
        """A task's time read from memory (``base``) and from its file (``base + per_byte
        x bytes a task reads``), or None while the bundles seen do not tell the two apart
        (all hits, all cold alone, or one mix throughout)."""
        det = self.nn * self.dd - self.nd * self.nd
        if det <= 0.0 or det <= CONDITION * self.nn * self.dd:
            return None
        per_byte = max((self.nn * self.dt - self.nd * self.nt) / det, 0.0)
        base = max((self.dd * self.nt - self.nd * self.dt) / det, 0.0)
        return TaskCosts(base, base + per_byte * self.task_bytes)


class TaskCosts(NamedTuple):
    """What one task of a category takes: its columns from memory, and from its file."""

    hit_s: float
    cold_s: float

    @property
    def saving_s(self) -> float:
        """What a hit saves over a cold read."""
        return self.cold_s - self.hit_s


@dataclass
class HitSaving:
    """Per category, what a task whose columns a worker's memory holds saves there."""

    fits: dict[str, _Fit] = field(default_factory=dict)
    told: dict[str, TaskCosts] = field(default_factory=dict)  # the last each fit told

    def observe(self, category: str, tasks: int, seconds: float, decoded: int,
                cached: int) -> None:
        """A bundle ran ``tasks`` tasks of ``category`` in ``seconds``, decoding
        ``decoded`` bytes of columns from their files and taking ``cached`` from memory
        (a bundle that did neither, no column cache, teaches nothing)."""
        if tasks <= 0 or seconds < 0 or decoded + cached <= 0:
            return
        fit = self.fits.setdefault(category, _Fit())
        fit.add(tasks, float(decoded), seconds, (decoded + cached) / tasks)
        if (costs := fit.costs()) is not None:
            self.told[category] = costs

    def saving_s(self, category: str) -> float | None:
        """What a hit saves over a cold read of ``category`` (seconds, >= 0); None until
        the bundles seen tell it."""
        costs = self.told.get(category)
        return None if costs is None else costs.saving_s

    def costs(self, category: str) -> TaskCosts | None:
        """A task of ``category``'s time from memory and from its file; None until the
        bundles seen tell them apart."""
        return self.told.get(category)
