"""Slowing one host of the box down: a CPU quota on its processes, a token bucket on its link.

Stragglers made without touching the code under test (benchmarks/stragglers.py):

- :class:`CpuQuota`: a cgroup v1 child group of the CPU controller
  (``/sys/fs/cgroup/cpu/<name>``, ``cpu.cfs_period_us`` 100000, ``cpu.cfs_quota_us`` the
  fraction of it) holding the processes put into it, all of them together, to that fraction
  of one core. A process forked inside the group stays in it, but one forked just before its
  parent was moved does not, so :meth:`CpuQuota.follow` keeps adding a process's
  descendants (a worker's library and the library's child) while the block runs. Only
  processes the caller names, and their descendants, are moved; leaving the block moves the
  ones still alive back to the root group and removes the group.
- :func:`shaped`: ``tc tbf`` on one interface of a namespace (its egress), removed on leaving;
  :func:`slow_host_link` shapes both ends of a host's cable (what it sends and what it
  receives), as :func:`host_link` finds them in the box's plan.

Needs root: the cgroup filesystem and ``tc`` (:func:`cpu_quota_missing` says why not).
"""

from __future__ import annotations

import contextlib
import os
import subprocess
import threading
from collections.abc import Iterable, Iterator
from pathlib import Path
from types import TracebackType

from datavine.deploy.box.net import Box, BoxError

CPU_ROOT = Path("/sys/fs/cgroup/cpu")
PERIOD_US = 100_000


def cpu_quota_missing(root: Path = CPU_ROOT) -> str | None:
    """Why no CPU quota can be set here, or None (cgroup v1's CPU controller, writable)."""
    if not (root / "cpu.cfs_quota_us").exists():
        return f"no cgroup v1 CPU controller at {root} (cpu.cfs_quota_us)"
    if not os.access(root, os.W_OK):
        return f"cannot make a group in {root}: run as root"
    return None


def descendants(pid: int) -> list[int]:
    """The processes below ``pid`` (children, their children, ...), from ``/proc``."""
    children: dict[int, list[int]] = {}
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            stat = (entry / "stat").read_text()
        except OSError:  # gone meanwhile
            continue
        # "pid (comm) state ppid ...": comm may hold spaces and parentheses
        ppid = int(stat[stat.rindex(")") + 2:].split()[1])
        children.setdefault(ppid, []).append(int(entry.name))
    found: list[int] = []
    todo = [pid]
    while todo:
        for child in children.get(todo.pop(), []):
            found.append(child)
            todo.append(child)
    return found


class CpuQuota:
    """A cgroup holding the processes put into it to ``fraction`` of one core, together.

    ``with CpuQuota("dvslow", 0.25) as quota: quota.add_tree(pid)``. The group must not exist
    yet (one left by a crash is named in the error, to be removed by hand).
    """

    def __init__(self, name: str, fraction: float, root: Path = CPU_ROOT) -> None:
        if not 0 < fraction <= 64:
            raise ValueError(f"CpuQuota fraction={fraction}: of one core, > 0")
        if not name or "/" in name or name.startswith("."):
            raise ValueError(f"CpuQuota name={name!r}: one folder name")
        self.path = root / name
        self.root = root
        self.fraction = fraction
        self._stop = threading.Event()
        self._followers: list[threading.Thread] = []

    @property
    def quota_us(self) -> int:
        return max(1000, round(PERIOD_US * self.fraction))

    def __enter__(self) -> CpuQuota:
        try:
            self.path.mkdir()
        except FileExistsError:
            raise BoxError(f"cgroup {self.path} exists already (left by an earlier run?): "
                           f"remove it with rmdir once nothing runs in it") from None
        try:
            (self.path / "cpu.cfs_period_us").write_text(str(PERIOD_US))
            (self.path / "cpu.cfs_quota_us").write_text(str(self.quota_us))
        except BaseException:
            self.path.rmdir()
            raise
        return self

    def __exit__(self, kind: type[BaseException] | None, exc: BaseException | None,
                 tb: TracebackType | None) -> None:
        self.close()

    def close(self) -> None:
        """Stop following, move what is left back to the root group, remove the group."""
        self._stop.set()
        for thread in self._followers:
            thread.join(timeout=5)
        if not self.path.exists():
            return
        for _ in range(20):  # a process forking while we move: move again
            left = self.pids()
            if not left:
                break
            for pid in left:
                with contextlib.suppress(ProcessLookupError, OSError):
                    (self.root / "cgroup.procs").write_text(str(pid))
        with contextlib.suppress(FileNotFoundError):
            self.path.rmdir()

    def pids(self) -> list[int]:
        """The processes in the group now."""
        try:
            text = (self.path / "cgroup.procs").read_text()
        except FileNotFoundError:
            return []
        return [int(p) for p in text.split()]

    def add(self, pid: int) -> bool:
        """Move ``pid`` into the group; False when it is gone."""
        try:
            (self.path / "cgroup.procs").write_text(str(pid))
        except (ProcessLookupError, FileNotFoundError):
            return False
        except OSError as exc:
            if not Path(f"/proc/{pid}").exists():
                return False
            raise BoxError(f"cannot move process {pid} into {self.path}: {exc}") from exc
        return True

    def add_tree(self, pid: int) -> int:
        """Move ``pid`` and its descendants not yet inside; returns how many were moved."""
        inside = set(self.pids())
        return sum(self.add(p) for p in [pid, *descendants(pid)] if p not in inside)

    def follow(self, pids: Iterable[int], every_s: float = 0.1) -> None:
        """Keep moving ``pids``' descendants into the group (every ``every_s``) until the
        block ends: processes forked later (a worker's library, its child) are held too."""
        roots = list(pids)
        for pid in roots:
            self.add_tree(pid)

        def loop() -> None:
            while not self._stop.wait(every_s):
                for pid in roots:
                    with contextlib.suppress(BoxError):
                        self.add_tree(pid)

        thread = threading.Thread(target=loop, name=f"follow {self.path.name}", daemon=True)
        thread.start()
        self._followers.append(thread)

    def stat(self) -> dict[str, int]:
        """``cpu.stat``: nr_periods, nr_throttled, throttled_time (ns), ..."""
        try:
            lines = (self.path / "cpu.stat").read_text().splitlines()
        except FileNotFoundError:
            return {}
        return {k: int(v) for k, v in (line.split() for line in lines if line.strip())}


def _tc(argv: list[str], what: str) -> subprocess.CompletedProcess[str]:
    done = subprocess.run(argv, capture_output=True, text=True, timeout=20, check=False)
    if done.returncode != 0:
        raise BoxError(f"{what}: '{' '.join(argv)}' failed ({done.returncode}): "
                       f"{(done.stderr or done.stdout).strip()}")
    return done


@contextlib.contextmanager
def shaped(namespace: str, interface: str, mbit: float, *, burst_kb: int = 256,
           latency_ms: int = 200) -> Iterator[None]:
    """``interface`` in ``namespace`` sends at most ``mbit`` (tc tbf as its root qdisc) in
    the block; the qdisc is removed after it. The interface must have no root qdisc of its
    own (a host's cable has none; the spine's are the box's)."""
    if mbit <= 0:
        raise ValueError(f"shaped mbit={mbit}: must be positive")
    _tc(["tc", "-n", namespace, "qdisc", "add", "dev", interface, "root", "tbf", "rate",
         f"{mbit:g}mbit", "burst", f"{burst_kb}kb", "latency", f"{latency_ms}ms"],
        f"shaping {interface} in {namespace}")
    try:
        yield
    finally:
        # the namespace may be gone (the box taken down inside the block): nothing to undo
        subprocess.run(["tc", "-n", namespace, "qdisc", "del", "dev", interface, "root"],
                       capture_output=True, timeout=20, check=False)


def host_link(box: Box, host: str) -> list[tuple[str, str]]:
    """(namespace, interface) of both ends of ``host``'s cable: its own ``eth0`` (what it
    sends) and its router's port (what it receives)."""
    h = box.plan.host(host)
    for v in box.plan.veths:
        if v.a_ns == h.namespace:
            return [(v.a_ns, v.a_if), (v.b_ns, v.b_if)]
    raise BoxError(f"no cable of host {host!r} in box {box.plan.spec.name!r}")


@contextlib.contextmanager
def slow_host_link(box: Box, host: str, mbit: float, *, burst_kb: int = 256) -> Iterator[None]:
    """``host``'s cable shaped to ``mbit`` both ways in the block (a slow host's network:
    an XCache shard whose clients, and whose own reads from the origin, crawl)."""
    with contextlib.ExitStack() as stack:
        for namespace, interface in host_link(box, host):
            stack.enter_context(shaped(namespace, interface, mbit, burst_kb=burst_kb))
        yield


def service_pids(box: Box, host: str, name: str) -> list[int]:
    """The PIDs of the services called ``name`` that the box started on ``host``."""
    return [int(s["pid"]) for s in box.services() if s["host"] == host and s["name"] == name]
