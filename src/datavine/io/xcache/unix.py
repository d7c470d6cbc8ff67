"""Host helpers for the testbed: free loopback ports, folder permissions, logs, stopping."""

from __future__ import annotations

import grp
import pwd
import re
import socket
import stat
import subprocess
from pathlib import Path
from typing import Protocol


class _HasLog(Protocol):
    @property
    def log(self) -> Path: ...


def free_ports(n: int) -> list[int]:
    """``n`` distinct TCP ports free on 127.0.0.1 right now (held open until all are found)."""
    socks: list[socket.socket] = []
    try:
        for _ in range(n):
            s = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
            s.bind(("127.0.0.1", 0))
            socks.append(s)
        return [s.getsockname()[1] for s in socks]
    finally:
        for s in socks:
            s.close()


def _allows(path: Path, uid: int, gids: set[int], bits: int) -> bool:
    """Whether user ``uid`` (groups ``gids``) has permission ``bits`` (r=4, w=2, x=1)."""
    st = path.stat()
    if uid == 0:
        return True
    if st.st_uid == uid:
        mode = (st.st_mode >> 6) & 7
    elif st.st_gid in gids:
        mode = (st.st_mode >> 3) & 7
    else:
        mode = st.st_mode & 7
    return mode & bits == bits


def check_reachable(path: Path, user: str, need_read: bool) -> None:
    """Raise ``PermissionError`` unless ``user`` can reach ``path`` (and list it, if asked).

    The servers run as an unprivileged user: a folder under a root-only parent (pytest's
    ``/tmp/pytest-of-root`` is mode 0700) is invisible to them, and they fail late and
    obscurely. Mode bits only; ACLs are not consulted.
    """
    pw = pwd.getpwnam(user)
    gids = {pw.pw_gid} | {g.gr_gid for g in grp.getgrall() if user in g.gr_mem}
    path = path.resolve()
    for p in [*reversed(path.parents), path]:
        if not _allows(p, pw.pw_uid, gids, 1):
            raise PermissionError(
                f"user {user} cannot enter {p} (mode {stat.filemode(p.stat().st_mode)}), so "
                f"the xrootd servers cannot use {path}: choose a folder outside it, or "
                f"chmod o+x {p}")
    if need_read and not _allows(path, pw.pw_uid, gids, 4):
        raise PermissionError(f"user {user} cannot list {path}: chmod o+rx {path}")


def log_tail(server: _HasLog, lines: int = 12) -> str:
    """The log's error lines (with the directive each names) and its last lines."""
    try:
        text = server.log.read_text(errors="replace").splitlines()
    except OSError:
        return f"(no log at {server.log})"
    bad = [bool(re.search(r"\berror\b|invalid|unable", x, re.I)) for x in text]
    # An error in a directive is followed by the directive, echoed after "=====>".
    errors = [x for i, x in enumerate(text) if bad[i] or (i > 0 and bad[i - 1]
                                                          and x.startswith("=====>"))]
    picked = [*errors[:10], "...", *text[-lines:]] if errors else text[-lines:]
    return "\n".join(picked)


def terminate(proc: subprocess.Popen[bytes] | None, grace_s: float = 5.0) -> None:
    """SIGTERM, then SIGKILL after ``grace_s``; reaps the process. No-op if it has exited."""
    if proc is None or proc.poll() is not None:
        return
    proc.terminate()
    try:
        proc.wait(timeout=grace_s)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait(timeout=grace_s)
