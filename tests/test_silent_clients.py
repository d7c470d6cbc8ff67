"""Nothing that connects stalls the manager (patch 0013), on the real binaries.

Clients that connect to the manager's port and say nothing, or stop halfway through the
password exchange or the TLS handshake, are each held on a thread of their own until their
deadline (the manager's ``short-timeout``), then dropped; the run goes on meanwhile. On the
stock manager each such client held the whole wait loop for the deadline (with TLS, for
good), so a run could not finish while one was still connected.
"""

from __future__ import annotations

import operator
import shutil
import socket
import subprocess
import threading
import time
from pathlib import Path

import pytest
from dask import delayed

import datavine
from tests.vine_attacks import Lines, Refused

pytestmark = pytest.mark.taskvine
DEADLINE_S = 20  # the manager's short-timeout in these tests: far beyond a run's length


def still_open(sock: socket.socket) -> bool:
    """True while the manager has not closed this connection: what it sent (its ident
    line) is read and dropped, then an end of stream means closed."""
    sock.setblocking(False)
    try:
        while sock.recv(4096):
            pass
        return False
    except BlockingIOError:
        return True
    except OSError:
        return False
    finally:
        sock.setblocking(True)


def closed_within(sock: socket.socket, seconds: float) -> bool:
    """Whether the manager closes this connection within ``seconds`` (read what it says)."""
    lines = Lines(sock, timeout_s=seconds)
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        try:
            lines.readline()
        except Refused as why:
            return str(why) == "closed" or "reset" in str(why).lower()
    return False


def small_tasks(n: int) -> object:
    return delayed(sum)([delayed(operator.mul)(i, 2) for i in range(n)])


def nap(i: int) -> int:
    time.sleep(0.01)
    return 2 * i


def naps(n: int) -> object:
    return delayed(sum)([delayed(nap)(i) for i in range(n)])


def run_while_connecting(cluster: datavine.Cluster, graph: object, n: int,
                         first_line: bytes = b"") -> tuple[object, list[socket.socket]]:
    """Compute ``graph`` while a thread opens ``n`` connections that send ``first_line``
    (if any) and then nothing: they arrive during the run, as a port scanner's would (the
    port's listen queue is short, and between runs nothing accepts)."""
    opened: list[socket.socket] = []

    def connect() -> None:
        for _ in range(n):
            sock = socket.create_connection(("127.0.0.1", cluster.port), timeout=30)
            if first_line:
                sock.sendall(first_line)
            opened.append(sock)

    thread = threading.Thread(target=connect)
    thread.start()
    try:
        value = graph.compute(scheduler=cluster.get)  # type: ignore[attr-defined]
    finally:
        thread.join(60)
    assert len(opened) == n, f"only {len(opened)} of {n} connections were accepted"
    return value, opened


def test_a_run_goes_on_while_silent_clients_wait_for_their_deadline(tmp_path: Path) -> None:
    cfg = datavine.ManagerConfig(run_dir=tmp_path / "mgr")
    with datavine.LocalCluster(workers=2, manager=cfg, dashboard=False) as c:
        c.runtime.manager.tune("short-timeout", DEADLINE_S)
        assert small_tasks(10).compute(scheduler=c.get) == 90
        value, silent = run_while_connecting(c, naps(300), 8)
        halfway: list[socket.socket] = []
        try:
            assert value == 2 * sum(range(300))
            # the run did not wait for any of them: each still waits for its deadline
            assert all(still_open(s) for s in silent), "a silent client was served first"
            # one that stops halfway through the exchange, the same
            value, halfway = run_while_connecting(c, naps(100), 1,
                                                  b"auth password hmac-sha256 v2\n")
            assert value == 2 * sum(range(100))
            assert still_open(halfway[0])
            # each is dropped at its deadline, though the manager's loop is not turning
            assert closed_within(halfway[0], DEADLINE_S + 10)
            assert all(closed_within(s, 10) for s in silent)
        finally:
            for s in (*silent, *halfway):
                s.close()


@pytest.fixture
def certificate(tmp_path: Path) -> tuple[Path, Path]:
    assert shutil.which("openssl"), "openssl is missing: scripts/setup.sh installs it"
    key, cert = tmp_path / "key.pem", tmp_path / "cert.pem"
    subprocess.run(["openssl", "req", "-x509", "-newkey", "rsa:2048", "-nodes", "-keyout",
                    str(key), "-out", str(cert), "-days", "1", "-subj", "/CN=localhost",
                    "-addext", "subjectAltName=IP:127.0.0.1"],
                   check=True, capture_output=True)
    return key, cert


def test_a_silent_tls_client_is_dropped_at_its_deadline(tmp_path: Path,
                                                         certificate: tuple[Path, Path]) -> None:
    """With TLS the stock manager's SSL_accept waited for a silent client forever."""
    key, cert = certificate
    cfg = datavine.ManagerConfig(run_dir=tmp_path / "mgr", ssl_key=key, ssl_cert=cert)
    with datavine.LocalCluster(workers=1, manager=cfg, dashboard=False) as c:
        c.runtime.manager.tune("short-timeout", DEADLINE_S)
        value, silent = run_while_connecting(c, naps(100), 3)
        try:
            assert value == 2 * sum(range(100))
            assert all(still_open(s) for s in silent)
            assert all(closed_within(s, DEADLINE_S + 10) for s in silent)
            # and the manager still admits a worker with TLS afterwards
            assert small_tasks(5).compute(scheduler=c.get) == 20
        finally:
            for s in silent:
                s.close()
