"""SIGTERM and SIGHUP end a datavine client as cleanly as Ctrl-C does.

Batch preemption, ``timeout``, ``systemctl stop`` and a dropped SSH session send SIGTERM or
SIGHUP, whose default action ends the process at once: no ``finally`` block runs, and local
workers, XCache servers and temporary directories stay behind. While
:func:`terminate_gracefully` is active, either signal raises :class:`Terminated` (a
``KeyboardInterrupt``, so every cleanup path written for Ctrl-C runs) in the main thread; a
second signal during that cleanup is ignored, not allowed to cut it short. A program that
does not catch :class:`Terminated` still dies by the signal once its cleanup and ``atexit``
handlers have run (exit status 128 + N in a shell), as a signalled program should; one that
catches it decides its own exit status (:func:`handled`). A process that already handles
these signals itself keeps its own handlers.
"""

from __future__ import annotations

import atexit
import contextlib
import os
import signal
import threading
from collections.abc import Iterator
from types import FrameType

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


_pending: list[int] = []  # a signal that raised Terminated and was not handled yet


def _raise_terminated(signum: int, frame: FrameType | None) -> None:
    for sig in SIGNALS:  # cleanup runs next: a second signal must not interrupt it
        signal.signal(sig, signal.SIG_IGN)
    if not _pending:
        atexit.register(_die_by_signal)
    _pending[:] = [signum]
    raise Terminated(signum)


def handled() -> None:
    """The program caught :class:`Terminated` and decides its own exit status: it is not
    killed by the signal at exit, and the signals' default actions are back."""
    _pending.clear()
    for sig in SIGNALS:
        signal.signal(sig, signal.SIG_DFL)


def _die_by_signal() -> None:
    """At exit after an unhandled Terminated: end by the signal itself (its default action),
    so that the parent sees what happened."""
    if _pending:
        signum = _pending[0]
        signal.signal(signum, signal.SIG_DFL)
        os.kill(os.getpid(), signum)


@contextlib.contextmanager
def terminate_gracefully() -> Iterator[None]:
    """Within the block, SIGTERM/SIGHUP raise :class:`Terminated` in the main thread.

    Does nothing off the main thread, or for a signal whose handler is not the default
    (the application chose its own)."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    ours = [sig for sig in SIGNALS if signal.getsignal(sig) in (signal.SIG_DFL, None)]
    for sig in ours:
        signal.signal(sig, _raise_terminated)
    try:
        yield
    finally:
        # Give back only what this block set, and only from the main thread: a cluster
        # closed by the garbage collector on another thread cannot (signal.signal raises
        # there); its handler then stays, raising Terminated as the block would have.
        if not _pending and threading.current_thread() is threading.main_thread():
            for sig in ours:  # else a Terminated unwinds: SIG_IGN stays while it cleans up
                if signal.getsignal(sig) is _raise_terminated:
                    signal.signal(sig, signal.SIG_DFL)
