"""``LocalFactoryPool``: ``vine_factory -T local``, workers as processes on this host.

The same interface and the same factory as the HTCondor pool, without a batch system: the
factory forks its workers (in its own process group, with a parent-death signal), so it is
the quickest way to try a pool's settings, and a pool for a single big machine.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import signal
import time
from dataclasses import replace
from pathlib import Path

from datavine.deploy.pools.base import PoolError
from datavine.deploy.pools.factory import FactoryConfig
from datavine.deploy.pools.factory_pool import FactoryPool
from datavine.deploy.pools.identity import local_name


def _group(pgid: int) -> list[tuple[int, int]]:
    """(pid, parent pid) of the members of a process group."""
    out = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            fields = (entry / "stat").read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue
        if int(fields[2]) == pgid:
            out.append((int(entry.name), int(fields[1])))
    return out


def _mentions_vine(pid: int) -> bool:
    try:
        return b"vine" in Path(f"/proc/{pid}/cmdline").read_bytes()
    except OSError:
        return False


def _is_worker(pid: int) -> bool:
    """A vine_worker process (the wrapper execs it, so it keeps the wrapper's pid)."""
    try:
        argv0 = Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0", 1)[0]
    except OSError:
        return False
    return Path(argv0.decode(errors="replace")).name == "vine_worker"


class LocalFactoryPool(FactoryPool):
    """Workers started by ``vine_factory -T local`` on this host."""

    batch = "local"
    WORKSPACES = "workspaces"  # the workers' TMPDIR, in the pool's scratch folder

    @property
    def workspaces(self) -> Path:
        """Where the workers make their workspaces (their ``TMPDIR``): the factory stops its
        workers with SIGKILL, which leaves a workspace behind, so the pool removes the
        folder once its workers are gone, rather than leaving it in the host's /tmp."""
        return self.scratch_dir / self.WORKSPACES

    def _prepare(self, scratch: Path) -> FactoryConfig:
        (scratch / self.WORKSPACES).mkdir(parents=True, exist_ok=True)
        return replace(self.config, scratch_dir=scratch)

    def _launch(self, cmd: list[str], env: dict[str, str]) -> tuple[list[str], dict[str, str]]:
        full = dict(os.environ)
        full.update(env)
        full["PATH"] = f"{env['PATH']}{os.pathsep}{os.environ.get('PATH', '')}"
        full["TMPDIR"] = str(self.workspaces)
        return cmd, full

    def _jobs(self) -> dict[str, int]:
        # The factory forks one child per worker job (``sh -c ./vine_worker ...``); they
        # stay in its process group, whose id is the factory's pid (it leads its session).
        if self.pid is None:
            return {}
        n = sum(ppid == self.pid for _, ppid in _group(self.pid))
        return {"running": n} if n else {}

    def worker_names(self) -> list[str]:
        if self.pid is None or not self.config.named:
            return []
        return sorted(local_name(self.name, pid) for pid, _ in _group(self.pid)
                      if _is_worker(pid))

    def _remove_jobs(self, timeout_s: float, factory_seen: bool) -> None:
        # The factory kills its workers when it stops, and they have a parent-death signal;
        # what is left of the pool's process group (a library a worker forked) ends here.
        # A group id is not reused while the group has members, so after a factory seen
        # alive the group is surely the pool's; otherwise only vine processes are touched.
        if self.pid is None:
            return
        deadline = time.monotonic() + timeout_s
        while left := [pid for pid, _ in _group(self.pid)
                       if factory_seen or _mentions_vine(pid)]:
            if time.monotonic() > deadline:
                raise PoolError(f"processes of pool {self.name!r} survive SIGKILL: {left}")
            for pid in left:
                with contextlib.suppress(ProcessLookupError, PermissionError):
                    os.kill(pid, signal.SIGKILL)
            time.sleep(0.1)
        shutil.rmtree(self.workspaces, ignore_errors=True)
