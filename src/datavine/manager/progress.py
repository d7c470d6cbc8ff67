"""A rich progress bar for a run, and the closing summary on the terminal."""

from __future__ import annotations

from types import TracebackType

from rich.console import Console
from rich.progress import (
    BarColumn,
    MofNCompleteColumn,
    Progress,
    TaskID,
    TextColumn,
    TimeElapsedColumn,
)

from datavine.scheduler.summary import RunSummary


class RunProgress:
    """Progress of one run; does nothing when disabled (the default in libraries and tests)."""

    def __init__(self, total: int, *, enabled: bool, console: Console | None = None) -> None:
        self.enabled = enabled
        self.console = console or Console(stderr=True)
        self._progress: Progress | None = None
        self._task: TaskID | None = None
        self._total = total

    def __enter__(self) -> RunProgress:
        if self.enabled:
            self._progress = Progress(
                TextColumn("[bold]datavine"), BarColumn(), MofNCompleteColumn(),
                TextColumn("tasks"), TimeElapsedColumn(), console=self.console, transient=False)
            self._progress.__enter__()
            self._task = self._progress.add_task("run", total=self._total)
        return self

    def __exit__(self, exc_type: type[BaseException] | None, exc: BaseException | None,
                 tb: TracebackType | None) -> None:
        if self._progress is not None:
            self._progress.__exit__(exc_type, exc, tb)
            self._progress = None

    def advance(self, n: int) -> None:
        if self._progress is not None and self._task is not None:
            self._progress.advance(self._task, n)

    def print_summary(self, summary: RunSummary) -> None:
        """Each of the summary's lines as it is: never wrapped by rich (a pipe or a file is
        80 columns to it, which broke ``... MB worker to`` / ``worker``; a terminal wraps
        long lines itself), never read as markup (``[transfer server]`` would vanish)."""
        for line in summary.lines():
            self.console.print(line, soft_wrap=True, markup=False, highlight=False, emoji=False)
