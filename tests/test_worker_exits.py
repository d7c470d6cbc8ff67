"""The local workers' exit watch (:class:`datavine.deploy.local_workers._ExitWatch`): real
processes, no TaskVine. It must wake for an exit, for a worker started after it began (and
one gone before it was watched), and for a stop, and sleep otherwise."""

from __future__ import annotations

import os
import subprocess
import time
from collections.abc import Iterator

import pytest

from datavine.deploy.local_workers import _eventfd, _ExitWatch


@pytest.fixture
def procs() -> Iterator[list[subprocess.Popen[bytes]]]:
    started: list[subprocess.Popen[bytes]] = []
    yield started
    for proc in started:
        proc.kill()
        proc.wait()


def sleeper() -> subprocess.Popen[bytes]:
    return subprocess.Popen(["sleep", "30"], stdin=subprocess.DEVNULL)


def test_the_watch_wakes_for_an_exit_and_for_a_stop(procs: list[subprocess.Popen[bytes]]
                                                    ) -> None:
    wake = _eventfd()
    watch = _ExitWatch.open(wake)
    if watch is None:
        pytest.skip("no pidfds here: the watch thread polls each worker")
    assert wake is not None
    try:
        procs += [sleeper() for _ in range(3)]
        t0 = time.monotonic()
        assert watch.wait(procs, 0.2) == []  # all running: it slept its timeout out
        assert time.monotonic() - t0 >= 0.15
        procs[1].kill()
        t0 = time.monotonic()
        assert watch.wait(procs, 10) == [1]
        assert time.monotonic() - t0 < 2  # woken by the exit, not by the timeout
        assert procs[1].poll() is not None
        assert watch.wait(procs, 0.05) == []  # an ended worker is not reported again
        quick = subprocess.Popen(["true"])
        quick.wait()  # started after the watch began, and reaped before it was watched
        procs.append(quick)
        assert watch.wait(procs, 10) == [3]
        procs.append(sleeper())  # started later: watched from the next wait
        assert watch.wait(procs, 0.05) == []
        procs[4].kill()
        assert watch.wait(procs, 10) == [4]
        os.eventfd_write(wake, 1)  # what LocalWorkers.stop does
        t0 = time.monotonic()
        assert watch.wait(procs, 10) == []
        assert time.monotonic() - t0 < 2
        assert sorted(watch.fds.values()) == [0, 2]  # the running ones, still watched
    finally:
        watch.close()
        os.close(wake)
    assert not watch.fds
