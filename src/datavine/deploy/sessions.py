"""Process sessions: stop a program datavine started together with everything it left behind.

datavine starts each helper program (a ``vine_worker``, an ``xrootd``) as the leader of a new
session (``start_new_session=True``), so the session id is the program's PID. Its descendants
keep that session id even when they move to process groups of their own (``vine_worker``
puts each library in its own group) or are orphaned when the program dies (a SIGKILLed
``vine_worker`` leaves its ``[transfer server]`` child holding the manager's connection, and
its library processes running: FINDINGS). Scanning ``/proc`` for the session id finds them
all; nothing here ever matches processes by name.
"""

from __future__ import annotations

import contextlib
import os
import signal
import time
from pathlib import Path

PROC = Path("/proc")


def proc_stat(pid: int) -> tuple[int, int, str] | None:
    """(parent PID, session id, state letter) of ``pid``, or None when it is gone."""
    try:
        stat = Path(PROC, str(pid), "stat").read_text()
        # pid (comm) state ppid pgrp session ...: comm may hold spaces and parentheses
        fields = stat[stat.rindex(")") + 2:].split()
        return int(fields[1]), int(fields[3]), fields[0]
    except (OSError, ValueError, IndexError):
        return None


def live_processes() -> dict[int, tuple[int, int]]:
    """Every live (not zombie) process: PID -> (parent PID, session id)."""
    found = {}
    for entry in PROC.iterdir():
        if entry.name.isdigit():
            info = proc_stat(int(entry.name))
            if info is not None and info[2] != "Z":
                found[int(entry.name)] = info[:2]
    return found


def session_pids(sid: int) -> list[int]:
    """PIDs of the live processes whose session id is ``sid`` (zombies excluded)."""
    return [pid for pid, (_, session) in live_processes().items() if session == sid]


def signal_session(sid: int, sig: int) -> int:
    """Send ``sig`` to every process of session ``sid``; returns how many were signalled."""
    sent = 0
    for pid in session_pids(sid):
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.kill(pid, sig)
            sent += 1
    return sent


def stop_session(sid: int, grace_s: float = 3.0, poll_s: float = 0.05) -> int:
    """SIGTERM session ``sid`` (SIGCONT too, so stopped processes can act on it), wait up to
    ``grace_s`` for it to empty, then SIGKILL what is left. Returns the processes killed."""
    if not signal_session(sid, signal.SIGTERM):
        return 0
    signal_session(sid, signal.SIGCONT)
    deadline = time.monotonic() + grace_s
    while session_pids(sid) and time.monotonic() < deadline:
        time.sleep(poll_s)
    return signal_session(sid, signal.SIGKILL)


def kill_session(sid: int) -> int:
    """SIGKILL every process of session ``sid`` at once (a worker declared dead)."""
    return signal_session(sid, signal.SIGKILL)
