"""``LocalFactoryPool``: ``vine_factory -T local``, workers as processes on this host.

The same interface and the same factory as the HTCondor pool, without a batch system: the
factory forks its workers (in its own process group, with a parent-death signal), so it is
the quickest way to try a pool's settings, and a pool for a single big machine.
"""

from __future__ import annotations

import contextlib
import os
import signal
import time
from dataclasses import replace
from pathlib import Path

from datavine.pools.base import PoolError
from datavine.pools.factory import FactoryConfig
from datavine.pools.factory_pool import FactoryPool


def _processes() -> list[tuple[int, str, int]]:
    """(pid, command name, process group) of every process."""
    out = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            stat = (entry / "stat").read_text()
        except OSError:
            continue
        comm = stat[stat.index("(") + 1:stat.rindex(")")]
        pgrp = int(stat.rsplit(")", 1)[1].split()[2])
        out.append((int(entry.name), comm, pgrp))
    return out


def _group(pgid: int) -> list[tuple[int, str]]:
    return [(pid, comm) for pid, comm, pgrp in _processes() if pgrp == pgid]


class LocalFactoryPool(FactoryPool):
    """Workers started by ``vine_factory -T local`` on this host."""

    batch = "local"

    def _prepare(self, scratch: Path) -> FactoryConfig:
        scratch.mkdir(parents=True, exist_ok=True)
        return replace(self.config, scratch_dir=scratch)

    def _launch(self, cmd: list[str], env: dict[str, str]) -> tuple[list[str], dict[str, str]]:
        full = dict(os.environ)
        full.update(env)
        full["PATH"] = f"{env['PATH']}{os.pathsep}{os.environ.get('PATH', '')}"
        return cmd, full

    def _jobs(self) -> dict[str, int]:
        # Workers stay in the factory's process group (its pid: it leads its own session).
        if self.pid is None:
            return {}
        n = sum(comm == "vine_worker" for _, comm in _group(self.pid))
        return {"running": n} if n else {}

    def _remove_jobs(self, timeout_s: float) -> None:
        # The factory kills its workers when it stops, and they have a parent-death signal;
        # what is left of the pool's process group (a library a worker forked) ends here.
        if self.pid is None:
            return
        deadline = time.monotonic() + timeout_s
        while left := _group(self.pid):
            if time.monotonic() > deadline:
                raise PoolError(f"processes of pool {self.name!r} survive SIGKILL: {left}")
            for pid, _ in left:
                with contextlib.suppress(ProcessLookupError, PermissionError):
                    os.kill(pid, signal.SIGKILL)
            time.sleep(0.1)
