"""What each call of a :class:`~datavine.coffea.DatavineExecutor` did: items, failures,
skipped bad files, splits, code sent by value, and the run's summary (near/far bytes).

``Runner`` copies the executor for each call; the copies share one
:class:`ExecutionReport`, so ``executor.report`` holds the preprocessing and processing
calls of every ``Runner`` call made with it.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from datavine.coffea.splitting import Split
from datavine.coffea.tasks import ItemFailure

if TYPE_CHECKING:
    from datavine.scheduler.summary import RunSummary


class PartialResultWarning(UserWarning):
    """The call was interrupted (Ctrl-C): its result merges only the items that finished."""


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
    summary: RunSummary | None = None
    splits: list[Split] = field(default_factory=list)
    shipped_by_value: list[str] = field(default_factory=list)
    interrupted: str | None = None  # what finished, when Ctrl-C stopped the call
    processed: tuple[int, int, str] | None = None  # (done, submitted, unit)

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

    def lines(self) -> list[str]:
        """A few lines per call: items, failures, splits, and the run's own summary."""
        out = []
        for c in self.calls:
            out.append(f"{c.desc}: {c.succeeded}/{c.items} work items in {c.wall_s:.2f} s, "
                       f"{len(c.skipped)} skipped, {len(c.failed)} failed")
            if c.processed is not None:
                out.append(f"  {c.processed[0]:,} of {c.processed[1]:,} {c.processed[2]} "
                           "processed")
            if c.interrupted:
                out.append(f"  INTERRUPTED (Ctrl-C), the result is partial: {c.interrupted}")
            if c.shipped_by_value:
                out.append(f"  sent by value: {', '.join(c.shipped_by_value)}")
            out.extend(f"  {s.describe()}" for s in c.splits)
            if c.summary is not None:
                out.extend(f"  {line}" for line in c.summary.lines())
        return out


def skipped_message(record: CallRecord) -> str:
    files = record.skipped_files
    shown = "; ".join(f"{f.filename or f.item} ({f.reason or 'error'}: {f.error[:160]})"
                      for f in record.skipped[:10])
    more = f"; and {len(record.skipped) - 10} more" if len(record.skipped) > 10 else ""
    return (f"{record.desc}: skipped {len(record.skipped)} work item(s) of {len(files)} bad "
            f"file(s): {shown}{more}")
