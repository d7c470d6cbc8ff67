"""SIGTERM and SIGHUP end a datavine client as cleanly as Ctrl-C does.

Batch preemption, ``timeout``, ``systemctl stop`` and a dropped SSH session send SIGTERM or
SIGHUP, whose default action ends the process at once: no ``finally`` block runs, and local
workers, XCache servers and temporary directories stay behind. While
:func:`terminate_gracefully` is active, either signal raises :class:`Terminated` (a
``KeyboardInterrupt``, so every cleanup path written for Ctrl-C runs) in the main thread; a
second signal during that cleanup is ignored, not allowed to cut it short. A process that
already handles these signals itself keeps its own handlers.
"""

from __future__ import annotations

import contextlib
import signal
import threading
from collections.abc import Iterator
from types import FrameType
from typing import Any

SIGNALS = (signal.SIGTERM, signal.SIGHUP)


class Terminated(KeyboardInterrupt):
    """The process received SIGTERM or SIGHUP; ``signum`` says which."""

    def __init__(self, signum: int) -> None:
        self.signum = signum
        super().__init__(f"received {signal.Signals(signum).name}")

    @property
    def exit_code(self) -> int:
        """The shell's convention for a death by this signal."""
        return 128 + self.signum


def _raise_terminated(signum: int, frame: FrameType | None) -> None:
    for sig in SIGNALS:  # cleanup runs next: a second signal must not interrupt it
        signal.signal(sig, signal.SIG_IGN)
    raise Terminated(signum)


_depth = 0  # nested activations (a CLI command holding a LocalCluster)


@contextlib.contextmanager
def terminate_gracefully() -> Iterator[None]:
    """Within the block, SIGTERM/SIGHUP raise :class:`Terminated` in the main thread.

    Does nothing off the main thread, or for a signal whose handler is not the default
    (the application chose its own)."""
    global _depth
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    previous: dict[int, Any] = {}
    for sig in SIGNALS:
        current = signal.getsignal(sig)
        if current in (signal.SIG_DFL, None) or (current is _raise_terminated and _depth == 0):
            previous[sig] = current
            signal.signal(sig, _raise_terminated)
    _depth += 1
    try:
        yield
    finally:
        _depth -= 1
        for sig, handler in previous.items():
            signal.signal(sig, signal.SIG_DFL if handler is None else handler)
