"""datavine's TaskVine patches (scripts/patches/cctools), on real managers and workers.

- ``0001``: a worker's features (``--feature rack:X``) appear in ``Manager.status("workers")``
  as soon as it connects, from the worker itself: no shared file tells the manager.
- ``0002``: the manager listens on one address (``VINE_LISTEN_ADDRESS``, set by
  :class:`~datavine.config.ManagerConfig`'s ``listen_host``) and a worker's transfer server
  on one address (``--transfer-address``); the embedded default keeps both on loopback, so
  neither answers on another address of this host. Checked with ``ss -ltnp`` (who listens
  where) and by connecting to this host's non-loopback address where it has one.
- ``0003``: the scheduler skips workers without the task's features or a free slot before
  ranking them (a cost that grew with the workers, see ``benchmarks/README.md``): the
  choice must not change, so tasks pinned by a feature run on that worker, a task whose
  feature no worker has is never sent, and free tasks still run anywhere.
- ``0004``: with every worker busy, the manager tries no ready task (one pass over the
  workers instead of a pass per ready task), and a worker's libraries sit in a small table:
  tasks beyond the pool's slots must still each run once, as slots free, never more at once
  than there are slots; function calls beyond a library's slots likewise.
- ``0005``: a task's description goes to its worker in one write, and a small buffer input
  (a call's arguments, up to 64 KB) with its header lines in one more: the worker reads the
  same stream, so calls with small and large arguments both run (every test with a cluster
  runs through it).
- ``0006``: taking a result no longer walks every worker for statistics nothing read; the
  result's report is still recorded, so TaskVine's capacity estimate (made from those
  reports) still comes out of finished tasks.
- ``0007``: a worker whose watched file grew is asked for its updates, and no other worker:
  the manager's debug log shows every ``send_results`` to a worker after that worker's own
  ``available_results``.
- ``0008``: the performance log gets a row at most once per its interval, not one per
  result: dozens of results in a second add a row or two.
- ``0009``: a library logs its count of running functions when it changes, not every 5 s:
  an idle library's log (watched by the manager) does not grow.
- ``0010``: on Linux the manager waits on an epoll set of its links instead of polling
  every worker at each turn: the manager process holds an epoll descriptor, and workers that
  leave (their links unregistered before they close) and workers that join after them
  (descriptors reused) are all served, and a wait with nothing to do sleeps; bytes a link
  read ahead are served though its socket has nothing more to say (a worker's hello that
  came in with the end of its password exchange).
- ``0011``: a connection that does not finish the password exchange within the manager's
  short timeout is logged as such, a failed exchange (a wrong password) as one.
- ``0012``, ``0013``, ``0014``: the password exchange that cannot be reflected or relayed,
  handshakes off the wait loop, workers that verify the manager's certificate: see
  ``tests/test_auth_attacks.py``, ``tests/test_silent_clients.py`` and
  ``tests/test_tls_verify.py``; ``0021`` (peer transfers without Nagle's algorithm):
  ``tests/test_peer_transfers.py``.
- ``0022``-``0024`` (the manager's writes): ``tests/test_taskvine_writes.py``.
- ``0025``-``0027`` (where a function call goes without a walk over every worker; links read
  ahead, drained workers): ``tests/test_library_queue.py``; the read-ahead links: the
  hello read with the password exchange, below.
- ``0029``: the worker's kill of a task reaches its process though the process is not the
  leader of a group (a loaded host could exec it before the worker made its group, and a
  library killed while it started then held its worker in ``waitpid`` for good): the
  worker goes on to its next task.
- ``0031``: a task's standard output of up to 32 KB comes with its completion message, by
  its length: the manager does not ask for it (no ``send_stdout`` in its debug log), and it
  arrives whole; a longer one is asked for, as before.
- Arguments and results of datavine's calls travel as TaskVine buffers
  (:func:`datavine.manager.taskvine_internals.in_memory_calls`): no staging file is made for them.
"""

from __future__ import annotations

import os
import re
import shutil
import socket
import subprocess
import time
from pathlib import Path

import pytest

import datavine
from datavine.config import ManagerConfig
from datavine.deploy.binaries import vine_binary
from datavine.deploy.sessions import stop_session
from datavine.manager.runtime import Runtime
from tests.bare_manager import manager_with_workers, one_core_worker, run_all, until

pytestmark = [pytest.mark.taskvine,
              pytest.mark.skipif(shutil.which("ss") is None, reason="ss (iproute2) is missing")]
WILDCARDS = {"0.0.0.0", "*", "[::]", "::"}


def tcp_listeners() -> list[tuple[str, int, set[int]]]:
    """(local address, port, owning PIDs) of every listening TCP socket, from ``ss``."""
    out = subprocess.run(["ss", "-ltnpH"], capture_output=True, text=True, timeout=10,
                         check=True).stdout
    found = []
    for line in out.splitlines():
        fields = line.split()
        if len(fields) < 4:
            continue
        host, _, port = fields[3].rpartition(":")
        found.append((host, int(port), {int(p) for p in re.findall(r"pid=(\d+)", line)}))
    return found


def hosts_on(port: int) -> set[str]:
    return {host for host, p, _ in tcp_listeners() if p == port}


def ports_of(pid: int) -> dict[int, set[str]]:
    """The ports process ``pid`` listens on, with their addresses."""
    out: dict[int, set[str]] = {}
    for host, port, pids in tcp_listeners():
        if pid in pids:
            out.setdefault(port, set()).add(host)
    return out


def other_address() -> str | None:
    """An IPv4 address of this host that is not loopback, or None."""
    try:
        out = subprocess.run(["ip", "-o", "-4", "addr", "show"], capture_output=True,
                             text=True, timeout=10, check=False).stdout
    except OSError:
        return None
    for match in re.finditer(r"\binet (\d+\.\d+\.\d+\.\d+)/", out):
        if not match.group(1).startswith("127."):
            return match.group(1)
    return None


def refused(host: str, port: int) -> bool:
    try:
        with socket.create_connection((host, port), timeout=3):
            return False
    except ConnectionRefusedError:
        return True


def test_worker_features_reach_the_manager_from_the_worker(tmp_path: Path) -> None:
    """A vine_worker started by hand with its rack: the manager's status names it at once."""
    rt = Runtime(ManagerConfig(run_dir=tmp_path / "manager"))
    worker = subprocess.Popen(
        [str(vine_binary("vine_worker")), "127.0.0.1", str(rt.port), "--feature", "rack:X",
         "--feature", "worker:by-hand", "--workspace", str(tmp_path / "w"), "--timeout", "60"],
        stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True)
    try:
        def workers() -> list[dict]:
            rt.manager.wait(1)  # accepts the worker and reads what it says
            return [w for w in rt.manager.status("workers") if w.get("features")]

        found = until(workers, timeout_s=30)
        assert found, f"no worker with features in {rt.manager.status('workers')}"
        (w,) = found
        assert {"rack:X", "worker:by-hand"} <= set(w["features"])
        # the worker's own name (uname -n, as its resolver completes it)
        assert w["hostname"].split(".")[0] == os.uname().nodename.split(".")[0]
    finally:
        stop_session(worker.pid)
        worker.wait(timeout=10)
        rt.close()


def test_embedded_default_listens_on_loopback_only(tmp_path: Path) -> None:
    """LocalCluster: the manager and its worker's transfer server on 127.0.0.1 only."""
    manager = ManagerConfig(run_dir=tmp_path / "manager")
    with datavine.LocalCluster(workers=1, cores=1, racks=("X",), manager=manager,
                               warm_up=False) as cluster:
        port = cluster.port
        assert hosts_on(port) == {"127.0.0.1"}
        assert cluster.workers is not None
        worker_pid = cluster.workers.procs[0].pid
        transfer = until(lambda: ports_of(worker_pid))
        assert transfer, "the worker's transfer server is not listening"
        assert set().union(*transfer.values()) == {"127.0.0.1"}, transfer
        other = other_address()
        if other is not None:  # nothing answers on this host's other address
            assert refused(other, port)
            for tport in transfer:
                assert refused(other, tport)
        assert not refused("127.0.0.1", port)
        (w,) = cluster.runtime.manager.status("workers")
        assert {"rack:X", "worker:local-0"} <= set(w["features"])


def test_listen_host_moves_the_manager(tmp_path: Path) -> None:
    """``listen_host`` decides: every interface, or this host's other address only."""
    rt = Runtime(ManagerConfig(run_dir=tmp_path / "everywhere", listen_host="0.0.0.0"))
    try:
        assert rt.listen_address is None and rt.contact_host == "127.0.0.1"
        assert hosts_on(rt.port) <= WILDCARDS and hosts_on(rt.port)
    finally:
        rt.close()
    other = other_address()
    if other is None:
        pytest.skip("this host has no address but loopback")
    rt = Runtime(ManagerConfig(run_dir=tmp_path / "other", listen_host=other))
    try:
        assert hosts_on(rt.port) == {other} and rt.contact_host == other
        assert refused("127.0.0.1", rt.port) and not refused(other, rt.port)
    finally:
        rt.close()


def test_local_workers_follow_a_manager_on_another_address(tmp_path: Path) -> None:
    """A manager on this host's other address: local workers connect there, and their
    transfer servers listen there, where peers on other hosts would reach them."""
    other = other_address()
    if other is None:
        pytest.skip("this host has no address but loopback")
    manager = ManagerConfig(run_dir=tmp_path / "manager", listen_host=other)
    with datavine.LocalCluster(workers=1, cores=1, manager=manager, warm_up=False) as cluster:
        assert cluster.workers is not None
        transfer = until(lambda: ports_of(cluster.workers.procs[0].pid))
        assert transfer and set().union(*transfer.values()) == {other}, transfer
        (w,) = cluster.runtime.manager.status("workers")
        assert w["addrport"].startswith(f"{other}:")


def test_tasks_pinned_by_a_feature_run_there_and_nowhere_else(tmp_path: Path) -> None:
    rt = Runtime(ManagerConfig(run_dir=tmp_path / "manager"))
    names = ("a", "b", "c")
    workers = [subprocess.Popen(
        [str(vine_binary("vine_worker")), "127.0.0.1", str(rt.port), "--cores", "1",
         "--feature", f"worker:w-{name}", "--workspace", str(tmp_path / name),
         "--timeout", "60"],
        stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True)
        for name in names]
    vine = rt.taskvine.vine
    try:
        def connected() -> dict[str, str]:
            rt.manager.wait(1)
            return {f: w["addrport"] for w in rt.manager.status("workers")
                    for f in w.get("features", []) if f.startswith("worker:")}

        where = until(lambda: len(connected()) == 3 and connected(), timeout_s=30)
        assert where, f"3 workers did not connect: {rt.manager.status('workers')}"
        submitted: dict[int, str | None] = {}
        for i in range(9):
            task = vine.Task("true")
            pin = f"worker:w-{names[i % 2]}" if i < 6 else None  # 3 on a, 3 on b, 3 free
            if pin:
                task.add_feature(pin)
            submitted[rt.manager.submit(task)] = pin
        nowhere = vine.Task("true")
        nowhere.add_feature("worker:w-nobody")
        never = rt.manager.submit(nowhere)
        ran: dict[int, str] = {}
        deadline = time.monotonic() + 60
        while len(ran) < len(submitted) and time.monotonic() < deadline:
            task = rt.manager.wait(1)
            if task is not None:
                assert task.id != never, "a task whose feature no worker has was sent"
                assert task.successful(), task.result
                ran[task.id] = task.addrport
        assert len(ran) == len(submitted), f"only {len(ran)} of {len(submitted)} tasks ran"
        for task_id, pin in submitted.items():
            if pin is not None:
                assert ran[task_id] == where[pin], (pin, ran[task_id], where)
        assert nowhere.state == "READY", nowhere.state  # still waiting for its worker
    finally:
        for worker in workers:
            stop_session(worker.pid)
            worker.wait(timeout=10)
        rt.close()


def test_tasks_beyond_the_slots_wait_and_each_runs_once(tmp_path: Path) -> None:
    with manager_with_workers(tmp_path, 2) as rt:
        vine = rt.taskvine.vine
        ids = []
        for i in range(8):
            task = vine.Task(f"date +%s.%N; sleep 0.3; echo {i}; date +%s.%N")
            task.set_cores(1)
            ids.append(rt.manager.submit(task))
        spans: dict[int, tuple[float, float, str]] = {}
        deadline = time.monotonic() + 90
        while len(spans) < len(ids) and time.monotonic() < deadline:
            task = rt.manager.wait(1)
            if task is not None:
                assert task.successful(), task.result
                assert task.id not in spans, f"task {task.id} came back twice"
                start, which, end = task.output.split()
                spans[task.id] = (float(start), float(end), which)
        assert len(spans) == len(ids), f"only {len(spans)} of {len(ids)} tasks ran"
        assert sorted(w for _, _, w in spans.values()) == sorted(str(i) for i in range(8))
        edges = sorted([(s, 1) for s, _, _ in spans.values()] +
                       [(e, -1) for _, e, _ in spans.values()])
        running = most = 0
        for _, step in edges:
            running += step
            most = max(most, running)
        assert most <= 2, f"{most} tasks ran at once on 2 one-core workers"


def test_calls_beyond_the_library_slots_all_run_from_memory(tmp_path: Path) -> None:
    """More bundles than slots through datavine's library: every value comes back, and the
    manager's staging folder holds no argument or output file of a call (buffers)."""
    run_dir = tmp_path / "run"
    with datavine.LocalCluster(workers=2, cores=1,
                               manager=ManagerConfig(run_dir=run_dir)) as cluster:
        graph: dict[object, object] = {("square", i): (pow, i, 2) for i in range(24)}
        graph["total"] = (sum, [("square", i) for i in range(24)])
        big = bytes(range(256)) * 1024  # 256 KB of arguments: past patch 0005's one write
        graph["big"] = (len, big)
        assert cluster.get(graph, ["total", "big"]) == (sum(i * i for i in range(24)), len(big))
        # os.walk passes over a worker's trash folder emptied while it looks (rglob raised)
        staged = [Path(d) / f for d, _, files in os.walk(run_dir) for f in files
                  if Path(d).name in ("arguments", "outputs")]
        assert staged == [], f"calls left staging files: {staged[:3]}"


def test_finished_tasks_still_feed_the_capacity_estimate(tmp_path: Path) -> None:
    with manager_with_workers(tmp_path, 1) as rt:
        vine = rt.taskvine.vine
        default = rt.manager.stats.capacity_tasks  # no report yet: TaskVine's default (10)
        for _ in range(4):
            task = vine.Task("sleep 0.5")
            task.set_cores(1)
            rt.manager.submit(task)
        done = 0
        deadline = time.monotonic() + 60
        while done < 4 and time.monotonic() < deadline:
            task = rt.manager.wait(1)
            if task is not None:
                assert task.successful(), task.result
                done += 1
        assert done == 4
        assert rt.manager.stats.tasks_done == 4
        # estimated from the tasks' reports: 0.5 s of work against milliseconds of sending
        # and taking each is a capacity of many tasks, above the default it starts from
        assert rt.manager.stats.capacity_tasks > default, (default,
                                                           rt.manager.stats.capacity_tasks)


def test_only_the_worker_with_news_is_asked_for_its_watched_files(tmp_path: Path) -> None:
    with manager_with_workers(tmp_path, 2, debug_log=True) as rt:
        vine = rt.taskvine.vine
        out = rt.manager.declare_file(str(tmp_path / "grows.txt"))
        # 7 s: a worker looks at its watched files when it wakes, at least every 5 s
        task = vine.Task("for i in $(seq 14); do echo $i >> grows.txt; sleep 0.5; done")
        task.set_cores(1)
        task.add_output(out, "grows.txt", watch=True)
        run_all(rt, [rt.manager.submit(task)])
        assert (tmp_path / "grows.txt").read_text().split() == [str(i) for i in range(1, 15)]
        log = (rt.taskvine.info_dir / "vine-logs" / "debug").read_text(errors="replace")
    announced: dict[str, bool] = {}
    asked: dict[str, int] = {}
    for line in log.splitlines():
        said = re.search(r"(?:rx from|tx to) \S+ \(([^)]+)\): (available_results|send_results)",
                         line)
        if said is None:
            continue
        worker, what = said.groups()
        if what == "available_results":
            announced[worker] = True
        else:
            assert announced.get(worker), f"{worker} was asked for results it never announced"
            announced[worker] = False
            asked[worker] = asked.get(worker, 0) + 1
    assert len(asked) == 1 and sum(asked.values()) >= 1, asked  # the task's worker, only


def test_the_performance_log_keeps_its_interval_under_many_results(tmp_path: Path) -> None:
    with manager_with_workers(tmp_path, 1) as rt:
        perf_log = rt.taskvine.info_dir / "vine-logs" / "performance"
        rows_before = len(perf_log.read_text().splitlines())
        vine = rt.taskvine.vine
        ids = []
        for _ in range(40):
            task = vine.Task("true")
            task.set_cores(1)
            ids.append(rt.manager.submit(task))
        started = time.monotonic()
        run_all(rt, ids)
        seconds = time.monotonic() - started
        added = len(perf_log.read_text().splitlines()) - rows_before
    # a row per interval (5 s by default) that saw a change, not one per result (40)
    assert added <= seconds / 5 + 2, (added, seconds)


def test_an_idle_library_does_not_grow_its_watched_log(tmp_path: Path) -> None:
    with datavine.LocalCluster(workers=1, cores=1,
                               manager=ManagerConfig(run_dir=tmp_path / "run")) as cluster:
        assert cluster.get({"one": (abs, -1)}, "one") == 1  # the library is up
        manager = cluster.runtime.taskvine.manager
        idle_until = time.monotonic() + 12  # two of the library's 5-s log periods, and more
        while time.monotonic() < idle_until:
            manager.wait(1)  # the manager takes what the worker says meanwhile
        logs = list((cluster.runtime.taskvine.info_dir / "library-logs").glob("*.log"))
        assert logs, "no library log was watched"
        counts = [log.read_text().count("functions running concurrently") for log in logs]
    assert counts == [1] * len(logs), counts  # the first count, and no repeat of it


def epoll_descriptors() -> int:
    """How many epoll instances this process holds (Linux: /proc/self/fd)."""
    fds = Path("/proc/self/fd")
    return sum(1 for fd in fds.iterdir()
               if "eventpoll" in (os.readlink(fd) if fd.is_symlink() else ""))


@pytest.mark.skipif(not Path("/proc/self/fd").is_dir(), reason="Linux only (epoll)")
def test_the_manager_waits_on_epoll_as_workers_leave_and_join(tmp_path: Path) -> None:
    before = epoll_descriptors()
    with manager_with_workers(tmp_path, 3) as rt:
        assert epoll_descriptors() == before + 1  # the manager's set
        vine = rt.taskvine.vine

        def run_tasks(n: int) -> None:
            ids = []
            for i in range(n):
                task = vine.Task(f"echo {i}")
                task.set_cores(1)
                ids.append(rt.manager.submit(task))
            run_all(rt, ids)

        run_tasks(12)
        # two more join, then two of the first leave: their links leave the set before they
        # close, and the descriptors the next workers get may be theirs
        extra = [one_core_worker(rt, tmp_path / f"x{i}") for i in range(2)]
        try:
            until(lambda: rt.manager.wait(1) is None and rt.connected_workers() == 5, 30)
            assert rt.connected_workers() == 5
            removed = rt.manager.stats.workers_removed
            for worker in extra:
                stop_session(worker.pid)
                worker.wait(timeout=10)
            until(lambda: rt.manager.wait(1) is None and
                  rt.manager.stats.workers_removed == removed + 2, 30)
            assert rt.connected_workers() == 3, "workers that left are still counted"
            again = [one_core_worker(rt, tmp_path / f"y{i}") for i in range(2)]
            extra += again
            until(lambda: rt.manager.wait(1) is None and rt.connected_workers() == 5, 30)
            assert rt.connected_workers() == 5, "workers that joined after others left"
            run_tasks(20)
            # with nothing to do a wait sleeps in epoll: it does not spin
            cpu, started = time.thread_time(), time.monotonic()
            while time.monotonic() - started < 3:
                rt.manager.wait(1)
            assert time.thread_time() - cpu < 0.5 * (time.monotonic() - started), \
                "an idle wait kept the CPU busy"
        finally:
            for worker in extra:
                stop_session(worker.pid)
                worker.wait(timeout=10)
    assert epoll_descriptors() == before  # closed with the manager


def test_a_silent_connection_is_not_called_a_wrong_password(tmp_path: Path) -> None:
    from datavine.manager.cluster import make_password_file

    password = make_password_file(tmp_path / "pw")
    rt = Runtime(ManagerConfig(run_dir=tmp_path / "manager", password_file=password))
    wrong = make_password_file(tmp_path / "other")
    log = rt.taskvine.info_dir / "vine-logs" / "debug"
    worker = None
    try:
        with socket.create_connection(("127.0.0.1", rt.port)):  # says nothing
            said = until(lambda: rt.manager.wait(1) is None and
                         "did not complete the password exchange" in log.read_text(), 20)
        assert said, "no notice of the silent connection"
        assert "wrong password" not in log.read_text()
        worker = subprocess.Popen(
            [str(vine_binary("vine_worker")), "127.0.0.1", str(rt.port), "--password",
             str(wrong), "--workspace", str(tmp_path / "w"), "--timeout", "30"],
            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True)
        assert until(lambda: rt.manager.wait(1) is None and
                     "failed the password exchange" in log.read_text(), 20)
        assert rt.connected_workers() == 0
    finally:
        if worker is not None:
            stop_session(worker.pid)
            worker.wait(timeout=10)
        rt.close()


# cctools 7.15.9's taskvine/src/manager/vine_protocol.h (the version build_taskvine.sh pins)
VINE_PROTOCOL_VERSION = 12
HELLO_WITH_AUTH = """
import socket, sys, time
from pathlib import Path
from datavine.deploy.pools.manager_status import _Lines
from datavine.deploy.vine_auth import AUTH_IDENT, challenge, proof
password = Path(sys.argv[2]).read_bytes()
sock = socket.create_connection(("127.0.0.1", int(sys.argv[1])), timeout=20)
lines = _Lines(sock)
lines.send(AUTH_IDENT)
assert lines.readline() == AUTH_IDENT
mine = challenge()
lines.send(mine)
theirs = lines.readline()
lines.send(proof(password, "worker", theirs, mine))
assert lines.readline() == proof(password, "manager", theirs, mine)
# the verdict and the worker's hello in one write: the manager reads both at once
sock.sendall(b"ok\\ntaskvine %s read-ahead linux x86_64 7.15.9\\n" % sys.argv[3].encode())
time.sleep(30)  # connected until the test ends
"""


def test_a_hello_read_with_the_password_exchange_is_served(tmp_path: Path) -> None:
    """The manager reads a new connection's password exchange line by line; a worker that
    sends its hello right behind its last line has both read at once, and its socket then
    says nothing more. The wait must still see the hello (the worker is counted)."""
    import sys

    from datavine.manager.cluster import make_password_file

    password = make_password_file(tmp_path / "pw")
    rt = Runtime(ManagerConfig(run_dir=tmp_path / "manager", password_file=password))
    client = subprocess.Popen([sys.executable, "-c", HELLO_WITH_AUTH, str(rt.port),
                               str(password), str(VINE_PROTOCOL_VERSION)],
                              stderr=subprocess.PIPE, start_new_session=True)
    try:
        counted = until(lambda: rt.manager.wait(1) is None and rt.connected_workers() == 1,
                        20)
        assert client.poll() is None, client.communicate()[1].decode()[-2000:]
        assert counted, "the hello read with the password exchange was never served"
        (worker,) = rt.manager.status("workers")
        assert worker["hostname"] == "read-ahead"
    finally:
        stop_session(client.pid)
        client.wait(timeout=10)
        rt.close()


# a library that never answers, out of the group its worker made for it (the worker's own, as
# when the worker's setpgid lost the race with its exec), until it is killed
LIBRARY_OUT_OF_ITS_GROUP = """#!{python}
import os, time
os.setpgid(0, os.getpgid(os.getppid()))
with open({pid_file!r} + ".part", "w") as f:
    f.write(str(os.getpid()))
os.rename({pid_file!r} + ".part", {pid_file!r})
time.sleep(120)
"""


def test_a_library_killed_out_of_its_group_does_not_hold_its_worker(tmp_path: Path) -> None:
    """0029: a library whose process is not the leader of its own group is killed all the
    same when the manager cancels it (as TaskVine does to make room for another task, or to
    remove a library), and its worker runs the next task. Before, the worker
    sent the kill to the group (none) and blocked in ``waitpid`` until the library ended on
    its own: seen at 256 workers on 2 cores, where a library was killed before it ran."""
    import sys

    pid_file = tmp_path / "library.pid"
    exe = tmp_path / "library_exe"
    exe.write_text(LIBRARY_OUT_OF_ITS_GROUP.format(python=sys.executable,
                                                   pid_file=str(pid_file)))
    exe.chmod(0o755)
    with manager_with_workers(tmp_path, 1) as rt:
        vine, m = rt.taskvine.vine, rt.manager
        library = vine.LibraryTask("exec ./library_exe", "stuck")
        library.add_input(m.declare_file(str(exe), cache=True), "library_exe")
        m.install_library(library)
        m.submit(vine.FunctionCall("stuck", "f"))  # sends the library out
        started = until(lambda: m.wait(1) is None and pid_file.exists(), 30)
        assert started, "the library never started"
        pid = int(pid_file.read_text())
        assert os.getpgid(pid) != pid  # out of its own group, as the test means
        (instance,) = [int(t["task_id"]) for t in m.status("tasks")
                       if t.get("provides_library") == "stuck"]
        m.cancel_by_task_id(instance)  # the worker is told to kill it, as TaskVine does
        echo = vine.Task("echo next")
        m.submit(echo)
        done = until(lambda: (t := m.wait(1)) is not None and t.id == echo.id, 40)
        assert done and echo.successful() and echo.output.strip() == "next", (
            "the worker did not run the next task: it still waits for the killed library")
        assert until(lambda: not os.path.exists(f"/proc/{pid}") or
                     "zombie" in Path(f"/proc/{pid}/status").read_text(), 10)


def test_an_output_of_up_to_32_kb_comes_with_its_completion(tmp_path: Path) -> None:
    sizes = [500, 5_000, 30_000, 40_000]
    with manager_with_workers(tmp_path, 1, debug_log=True) as rt:
        vine = rt.taskvine.vine
        size_of: dict[int, int] = {}
        for n in sizes:
            task = vine.Task(f"head -c {n} /dev/zero | tr '\\0' x")
            task.set_cores(1)
            size_of[rt.manager.submit(task)] = n
        outputs: dict[int, str] = {}
        deadline = time.monotonic() + 60
        while len(outputs) < len(size_of) and time.monotonic() < deadline:
            task = rt.manager.wait(1)
            if task is not None:
                assert task.successful(), (task.id, task.result, task.output)
                outputs[task.id] = task.output
        log = (rt.taskvine.info_dir / "vine-logs" / "debug").read_text(errors="replace")
    assert {size_of[t]: len(o) for t, o in outputs.items()} == {n: n for n in sizes}
    assert all(set(o) == {"x"} for o in outputs.values())
    asked = {int(t) for t in re.findall(r"tx to \S+ \([^)]+\): send_stdout (\d+)", log)}
    assert asked == {t for t, n in size_of.items() if n > 32 * 1024}, asked
