"""A file read as it grows: the complete lines appended since the last read.

Standard library only. TaskVine's transactions log (:mod:`datavine.manager.library_log`)
and the live view's event stream (:mod:`datavine.dashboard.events`) are both read this way:
from the last offset, a line still being written kept for the next read.
"""

from __future__ import annotations

import os
from pathlib import Path


class LineTail:
    """The lines appended to ``path`` since the last :meth:`lines` (none while it is
    missing)."""

    def __init__(self, path: str | os.PathLike[str]) -> None:
        self.path = Path(path)
        self.offset = 0
        self.partial = b""

    def lines(self) -> list[bytes]:
        try:
            with open(self.path, "rb") as f:
                f.seek(self.offset)
                chunk = f.read()
        except OSError:
            return []
        self.offset += len(chunk)
        *complete, self.partial = (self.partial + chunk).split(b"\n")
        return complete
