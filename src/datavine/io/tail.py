"""A file read as it grows: the complete lines appended since the last read.

Standard library only. TaskVine's transactions log (:mod:`datavine.manager.library_log`)
and the live view's event stream (:mod:`datavine.dashboard.events`) are both read this way:
from the last offset, a line still being written kept for the next read.
"""

from __future__ import annotations

import os
import re
from pathlib import Path


class LineTail:
    """The lines appended to ``path`` since the last :meth:`lines` (none while it is
    missing)."""

    def __init__(self, path: str | os.PathLike[str]) -> None:
        self.path = Path(path)
        self.offset = 0
        self.partial = b""

    def lines(self) -> list[bytes]:
        *complete, self.partial = self._read().split(b"\n")
        return complete

    def matching(self, pattern: re.Pattern[bytes]) -> list[bytes]:
        """The new complete lines that ``pattern`` (made by :func:`line_pattern`) finds:
        searched in one pass over the new bytes, not line by line in Python (TaskVine's log
        writes six lines a task, of which a reader may want one or two)."""
        data = self._read()
        cut = data.rfind(b"\n") + 1
        self.partial = data[cut:]
        return pattern.findall(b"\n" + data, 0, cut + 1)  # one copy, up to the last newline

    def _read(self) -> bytes:
        """The partial line kept from the last read and the bytes appended since."""
        try:
            with open(self.path, "rb") as f:
                f.seek(self.offset)
                chunk = f.read()
        except OSError:
            return self.partial
        self.offset += len(chunk)
        return self.partial + chunk


def line_pattern(line: bytes) -> re.Pattern[bytes]:
    """The search :meth:`LineTail.matching` takes for whole lines that ``line`` (a regular
    expression, no groups) matches: each found after the newline before it, up to the next.
    A pattern that starts with a literal newline lets the regular expression engine skip to
    the line starts (a ``^`` under ``re.MULTILINE`` is tried at every byte: about 3x slower
    over TaskVine's log, whose long lines are mostly ones a reader skips)."""
    return re.compile(b"\n(" + line + b")(?=\n)")
