"""A real-time alarm around a block of code: the one SIGALRM timer of the package.

:func:`alarm` raises an exception of the caller's choice in the block once its seconds of
wall time are up. The worker stops a task at its time limit with it
(:mod:`datavine.worker.remote`), and the benchmarks bound a peer that hangs
(``benchmarks/common.py``). The signal interrupts Python code and sleeps, not a C call
that never returns to the interpreter (a capped bundle's child has its hard limit for that,
:mod:`datavine.worker.capped_child`).

Imported on workers: standard library only.
"""

from __future__ import annotations

import contextlib
import signal
import threading
from collections.abc import Callable, Iterator
from types import FrameType


@contextlib.contextmanager
def alarm(seconds: float | None, expired: Callable[[], BaseException]) -> Iterator[None]:
    """Raise ``expired()`` in the block after ``seconds`` of real time. No limit when
    ``seconds`` is None or 0, or off the main thread (only it receives signals). When the
    block ends the timer is stopped and the SIGALRM handler found is put back."""
    if not seconds or threading.current_thread() is not threading.main_thread():
        yield
        return

    def ring(signum: int, frame: FrameType | None) -> None:
        raise expired()

    previous = signal.signal(signal.SIGALRM, ring)
    signal.setitimer(signal.ITIMER_REAL, seconds)
    try:
        yield
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, previous)
