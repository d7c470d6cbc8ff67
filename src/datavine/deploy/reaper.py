"""A watchdog process that cleans up after this client when it dies without doing so itself.

A client that is SIGKILLed (the OOM killer, ``kill -9``, a batch system's hard limit) runs no
``finally`` block: the local ``vine_worker`` s, the testbed's ``xrootd`` s and the temporary
directories it made would stay behind (workers for their 15-minute idle timeout). So the
first time a client registers something, it starts one reaper: ``python -m datavine.deploy.reaper``
in a session of its own, holding the read end of a pipe. The client writes one line per
change (``+s SID`` / ``-s SID`` for a process session, ``+p PATH`` / ``-p PATH`` for a
directory). When the client's process ends (the reaper watches it through a pidfd, and sees
the pipe's end-of-file), the reaper stops every session still registered
(:func:`datavine.deploy.sessions.stop_session`) and removes every path still registered, then exits.
A client that closes what it started unregisters it first, so a clean exit leaves the reaper
nothing to do: at a clean exit the client closes the pipe and waits for the reaper to end (at
most :data:`EXIT_WAIT_S`; it cleans what is still registered, if anything, on its own), so
that no reaper outlives a client that ended well. Things meant to outlive the client
(``datavine pool start``) never register.
"""

from __future__ import annotations

import atexit
import contextlib
import os
import select
import shutil
import subprocess
import sys
import tempfile
import threading
from collections.abc import Iterator
from pathlib import Path

GRACE_S = 3.0  # SIGTERM to SIGKILL, per session
EXIT_WAIT_S = 1.0  # a clean exit waits this long for its reaper (it has nothing left to do)


class Reaper:
    """The client's side: registers what the reaper must clean up should this process die."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._proc: subprocess.Popen[bytes] | None = None
        self._owner = 0  # the PID that started the reaper (a forked child needs its own)

    def add_session(self, sid: int) -> None:
        self._send(f"+s {int(sid)}")

    def remove_session(self, sid: int) -> None:
        self._send(f"-s {int(sid)}", start=False)

    def add_path(self, path: str | os.PathLike[str]) -> None:
        self._send(f"+p {Path(path).resolve()}")

    def remove_path(self, path: str | os.PathLike[str]) -> None:
        self._send(f"-p {Path(path).resolve()}", start=False)

    @property
    def pid(self) -> int | None:
        proc = self._proc
        return proc.pid if proc is not None and self._owner == os.getpid() else None

    def _send(self, line: str, *, start: bool = True) -> None:
        if "\n" in line:
            raise ValueError(f"reaper: a path with a newline cannot be registered: {line!r}")
        with self._lock:
            if self._owner != os.getpid() or self._proc is None or self._proc.poll() is not None:
                if not start:
                    return
                self._start()
            assert self._proc is not None and self._proc.stdin is not None
            try:
                self._proc.stdin.write(line.encode() + b"\n")
                self._proc.stdin.flush()
            except (BrokenPipeError, OSError):
                self._proc = None  # it died: the next registration starts another

    def _start(self) -> None:
        self._proc = subprocess.Popen(
            [sys.executable, "-m", "datavine.deploy.reaper", str(os.getpid())],
            stdin=subprocess.PIPE, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
            start_new_session=True)  # a Ctrl-C or SIGHUP to the client's group spares it
        if self._owner != os.getpid():
            atexit.register(self.close)
        self._owner = os.getpid()

    def close(self) -> None:
        """This process ends well (``atexit``): close the pipe, and wait up to
        :data:`EXIT_WAIT_S` for the reaper to end (it cleans what is still registered
        first). Left running past that, it goes on alone."""
        with self._lock:
            proc = self._proc
            if proc is None or self._owner != os.getpid():
                return
            self._proc = None
            with contextlib.suppress(OSError):
                if proc.stdin is not None:
                    proc.stdin.close()
            with contextlib.suppress(subprocess.TimeoutExpired):
                proc.wait(EXIT_WAIT_S)


_REAPER = Reaper()


def reaper() -> Reaper:
    """This process's reaper (started on the first registration)."""
    return _REAPER


@contextlib.contextmanager
def temporary_directory(prefix: str) -> Iterator[Path]:
    """A new temporary directory, removed when the block ends, or by the reaper should this
    process be killed inside the block."""
    path = Path(tempfile.mkdtemp(prefix=prefix))
    reaper().add_path(path)
    try:
        yield path
    finally:
        shutil.rmtree(path, ignore_errors=True)
        reaper().remove_path(path)


# --- the reaper process ------------------------------------------------------------------
def apply(line: str, sessions: set[int], paths: set[str]) -> None:
    """Apply one registration line to the sets (pure)."""
    op, _, arg = line.rstrip("\n").partition(" ")
    if op in ("+s", "-s") and arg.strip().isdigit():
        (sessions.add if op == "+s" else sessions.discard)(int(arg))
    elif op in ("+p", "-p") and arg:
        (paths.add if op == "+p" else paths.discard)(arg)


def clean(sessions: set[int], paths: set[str]) -> None:
    from datavine.deploy.sessions import stop_session

    for sid in sessions:
        with contextlib.suppress(OSError):
            stop_session(sid, GRACE_S)
    for path in paths:
        shutil.rmtree(path, ignore_errors=True)


def main(parent: int) -> int:
    sessions: set[int] = set()
    paths: set[str] = set()
    watched = [sys.stdin.fileno()]
    with contextlib.suppress(OSError, AttributeError):  # gone already, or no pidfd: the pipe
        watched.append(os.pidfd_open(parent))
    buffer = b""
    while True:
        ready, _, _ = select.select(watched, [], [])
        if len(watched) > 1 and watched[1] in ready:
            break  # the client's process ended
        chunk = os.read(watched[0], 65536)
        if not chunk:
            break  # every holder of the pipe's write end closed it
        buffer += chunk
        *lines, buffer = buffer.split(b"\n")
        for line in lines:
            apply(line.decode(errors="replace"), sessions, paths)
    # Registrations written just before the client died are still in the pipe.
    with contextlib.suppress(OSError):
        os.set_blocking(watched[0], False)
        while chunk := os.read(watched[0], 65536):
            buffer += chunk
    for line in buffer.split(b"\n"):
        apply(line.decode(errors="replace"), sessions, paths)
    clean(sessions, paths)
    return 0


if __name__ == "__main__":
    sys.exit(main(int(sys.argv[1])))
