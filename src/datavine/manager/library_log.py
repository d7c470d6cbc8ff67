"""TaskVine's transactions log as it grows: each connected worker's library, and the calls
TaskVine put back in its queue by itself. Read once per look, for both.

TaskVine records when it sends a worker the library (``LIBRARY <id> SENT <worker>``), when
the library answers (``STARTED``), and when its task ends (``TASK <id> DONE ...``); the
Python bindings expose none of it, nor a call's try count (:func:`requeued_task`).
:class:`LibraryLog` reads the new lines at each look and
keeps, per worker address, a :class:`datavine.scheduler.network.LibraryState` whose ``since``
is the reader's clock when the line was read (within a second of TaskVine writing it), so a
library "sent" and never started is seen by :class:`datavine.scheduler.network.NetworkWatch`.
"""

from __future__ import annotations

import contextlib
from collections.abc import Mapping
from pathlib import Path

from datavine.io.tail import LineTail, line_pattern
from datavine.scheduler.network import (
    LIBRARY_ENDED,
    LIBRARY_SENT,
    LIBRARY_STARTED,
    LibraryState,
)

_LIBRARY_STATES = {b"SENT": LIBRARY_SENT, b"STARTED": LIBRARY_STARTED,
                   b"FAILURE": LIBRARY_ENDED}
# the lines read here: workers joining and leaving, libraries, a task's READY and DONE (of
# its six lines; a worker's transfers and cache updates are half of the rest)
_READ_LINES = line_pattern(rb"\d+ \d+ (?:WORKER \S+ (?:CONNECTION|DISCONNECTION)|LIBRARY"
                           rb"|TASK \d+ (?:READY|DONE))(?: [^\n]*)?")


def _fields(line: bytes) -> list[bytes]:
    """time pid KIND id STATE ... as far as this module reads (the rest is left whole)."""
    return line.split(maxsplit=8)


def library_event(line: bytes) -> tuple[str, str, str] | None:
    """What a transactions-log line says of workers and libraries (pure):
    ``("connect", worker id, address)``, ``("disconnect", worker id, "")``,
    ``(state, library task id, worker id)`` for a LIBRARY line, ``("done", task id, "")``
    for a task that ended (a library's or not); None for any other line."""
    return _library_event(_fields(line))


def _library_event(fields: list[bytes]) -> tuple[str, str, str] | None:
    if len(fields) < 5 or fields[0].startswith(b"#"):
        return None
    kind = fields[2]
    if kind == b"WORKER" and fields[4] == b"CONNECTION" and len(fields) >= 6:
        return "connect", fields[3].decode(), fields[5].decode()
    if kind == b"WORKER" and fields[4] == b"DISCONNECTION":
        return "disconnect", fields[3].decode(), ""
    if kind == b"LIBRARY" and fields[4] in _LIBRARY_STATES and len(fields) >= 6:
        return _LIBRARY_STATES[fields[4]], fields[3].decode(), fields[5].decode()
    if kind == b"TASK" and fields[4] == b"DONE":
        return "done", fields[3].decode(), ""
    return None


def requeued_task(line: bytes) -> int | None:
    """The task id of a transactions-log line that requeues a task (``TASK <id> READY
    <category> <how> <attempt>`` with an attempt above 1: its worker or library died), else
    None (pure). A task put back without a new attempt (its library died: TaskVine calls it
    forsaken) shows as a second READY line of its id: :class:`LibraryLog` counts those."""
    ready = _ready_task(_fields(line))
    return ready[0] if ready is not None and ready[1] > 1 else None


def _ready_task(fields: list[bytes]) -> tuple[int, int] | None:
    """(task id, attempt) of a ``TASK <id> READY`` line's fields, else None."""
    # time pid TASK id READY category allocation attempt ...
    if len(fields) >= 8 and fields[2] == b"TASK" and fields[4] == b"READY":
        with contextlib.suppress(ValueError):
            return int(fields[3]), int(fields[7])
    return None


class LibraryLog:
    """Library states by worker address, and the calls requeued since :meth:`requeued`,
    from the transactions log at ``path``."""

    def __init__(self, path: Path) -> None:
        self._tail = LineTail(path)
        self._requeued: list[int] = []
        self._ready: set[int] = set()  # tasks whose READY line was read, until their DONE
        self.address: dict[str, str] = {}  # TaskVine worker id -> address (host:port)
        self.library_on: dict[str, str] = {}  # library task id -> worker id
        self.states: dict[str, LibraryState] = {}  # address -> its library
        self.hosts: dict[str, str] = {}  # address -> host name, as the runtime learns them
        self.ended = 0  # library instances seen ending (failed, or their task done)
        self.version = 0  # counts the changes of ``states``
        self._read_at: float | None = None

    def read(self, now: float) -> dict[str, LibraryState]:
        """The states after the lines written since the last read (``now``: the caller's
        clock, recorded as the time of each change); a second read at the same ``now`` (one
        look asks for the requeued calls and the libraries) reads nothing again."""
        if now == self._read_at:
            return self.states
        self._read_at = now
        for line in self._tail.matching(_READ_LINES):  # not a task's other states
            fields = _fields(line)  # split once for both readings
            event = _library_event(fields)
            if event is not None:
                self._apply(event, now)
            elif (ready := _ready_task(fields)) is not None:
                task, attempt = ready
                if attempt > 1 or task in self._ready:  # put back, with a new attempt or not
                    self._requeued.append(task)
                self._ready.add(task)
        return self.states

    def requeued(self, now: float) -> list[int]:
        """Task ids TaskVine requeued since the last call (after reading new lines)."""
        self.read(now)
        out, self._requeued = self._requeued, []
        return out

    def _apply(self, event: tuple[str, str, str], now: float) -> None:
        what, first, second = event
        self.version += 1
        if what == "connect":
            self.address[first] = second
        elif what == "disconnect":
            address = self.address.pop(first, None)
            if address is not None:
                self.states.pop(address, None)
                self.hosts.pop(address, None)
        elif what == "done":
            with contextlib.suppress(ValueError):
                self._ready.discard(int(first))
            worker = self.library_on.pop(first, None)
            if worker is not None:
                self.ended += 1
            address = self.address.get(worker or "")
            if address is not None and address in self.states:
                self.states[address] = LibraryState(LIBRARY_ENDED, now,
                                                    self.hosts.get(address, ""))
        else:  # a library's state on a worker
            if what == LIBRARY_ENDED:
                self.ended += 1
            self.library_on[first] = second
            address = self.address.get(second)
            if address is not None:
                self.states[address] = LibraryState(what, now, self.hosts.get(address, ""))

    def connected(self) -> set[str]:
        """Addresses of the workers connected, as far as the log was read."""
        return set(self.address.values())

    def missing_hosts(self) -> bool:
        return any(address not in self.hosts for address in self.states)

    def name_hosts(self, hosts: Mapping[str, str]) -> None:
        """Host names by address (TaskVine's worker list): filled into the states."""
        for address, state in list(self.states.items()):
            host = hosts.get(address)
            if host:
                self.hosts[address] = host
                if state.host != host:
                    self.states[address] = LibraryState(state.state, state.since, host)
                    self.version += 1
