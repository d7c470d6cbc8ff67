"""A bare datavine manager (:class:`datavine.manager.runtime.Runtime`) with real one-core
``vine_worker``s, and the waits the tests of TaskVine's patches drive it with
(``test_taskvine_patches.py``, ``test_taskvine_writes.py``, ``test_peer_transfers.py``)."""

from __future__ import annotations

import contextlib
import subprocess
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import TypeVar

from datavine.config import ManagerConfig
from datavine.deploy.binaries import vine_binary
from datavine.deploy.sessions import stop_session
from datavine.manager.runtime import Runtime

T = TypeVar("T")


def until(what: Callable[[], T], timeout_s: float = 20.0, every_s: float = 0.1) -> T:
    """``what()`` once it is true, or its last value after ``timeout_s``."""
    deadline = time.monotonic() + timeout_s
    while True:
        value = what()
        if value or time.monotonic() > deadline:
            return value
        time.sleep(every_s)


def one_core_worker(rt: Runtime, workspace: Path, *options: str) -> subprocess.Popen[bytes]:
    return subprocess.Popen(
        [str(vine_binary("vine_worker")), "127.0.0.1", str(rt.port), "--cores", "1",
         "--workspace", str(workspace), "--timeout", "60", *options],
        stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True)


@contextlib.contextmanager
def manager_with_workers(tmp_path: Path, n: int, debug_log: bool = False,
                         features: tuple[str, ...] = ()) -> Iterator[Runtime]:
    """A bare datavine manager with ``n`` one-core vine_workers connected (the i-th with
    feature ``features[i]`` where given); both stopped after."""
    rt = Runtime(ManagerConfig(run_dir=tmp_path / "manager", debug_log=debug_log))
    workers = [one_core_worker(rt, tmp_path / f"w{i}",
                               *(("--feature", features[i]) if i < len(features) else ()))
               for i in range(n)]
    try:
        until(lambda: rt.manager.wait(1) is None and rt.connected_workers() == n, 30)
        assert rt.connected_workers() == n, f"only {rt.connected_workers()} of {n} connected"
        yield rt
    finally:
        for worker in workers:
            stop_session(worker.pid)
            worker.wait(timeout=10)
        rt.close()


def run_all(rt: Runtime, ids: list[int], timeout_s: float = 60) -> None:
    """Wait until every task of ``ids`` came back successful."""
    left = set(ids)
    deadline = time.monotonic() + timeout_s
    while left and time.monotonic() < deadline:
        task = rt.manager.wait(1)
        if task is not None:
            assert task.successful(), (task.id, task.result, task.output)
            left.discard(task.id)
    assert not left, f"tasks {sorted(left)} did not finish in {timeout_s} s"
