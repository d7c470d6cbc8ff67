"""No one gets in without the password (patch 0012), on the real binaries.

An outsider who knows only a port tries the attacks of ``tests/vine_attacks.py`` on the
three places TaskVine's password exchange guards: the manager's port, a worker's transfer
server, and a worker's check of its manager (a fake manager). Each attack got in on the
stock exchange (``auth password sha1``); each must be refused here, and the right
password must still be accepted, a wrong one refused, and a peer speaking the old
exchange refused with a line naming both.
"""

from __future__ import annotations

import contextlib
import socket
import subprocess
import time
from collections.abc import Callable, Iterator
from concurrent.futures import Future, ThreadPoolExecutor
from pathlib import Path
from typing import TypeVar

import pytest

from datavine.config import ManagerConfig
from datavine.deploy.binaries import vine_binary
from datavine.deploy.pools.manager_status import ManagerQueryError, connected_workers
from datavine.deploy.sessions import stop_session
from datavine.deploy.vine_auth import AUTH_IDENT, AUTH_IDENT_V1, proof
from datavine.manager.cluster import make_password_file
from datavine.manager.runtime import Runtime
from tests import vine_attacks as attack

pytestmark = pytest.mark.taskvine
T = TypeVar("T")


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@contextlib.contextmanager
def manager(tmp_path: Path) -> Iterator[Runtime]:
    """A bare manager with a password; its short timeout at 2 s (refusals come sooner)."""
    rt = Runtime(ManagerConfig(run_dir=tmp_path / "manager",
                               password_file=make_password_file(tmp_path / "secret")))
    rt.manager.tune("short-timeout", 2)
    try:
        yield rt
    finally:
        rt.close()


def pumped(rt: Runtime, fn: Callable[[], T], timeout_s: float = 30.0) -> T:
    """``fn()`` run on a thread while this one serves the manager (its ``wait``)."""
    with ThreadPoolExecutor(1) as pool:
        future: Future[T] = pool.submit(fn)
        deadline = time.monotonic() + timeout_s
        while not future.done() and time.monotonic() < deadline:
            rt.manager.wait(1)
        return future.result(timeout=1)


def serve(rt: Runtime, seconds: float) -> int:
    """Serve the manager for a while; how many workers are connected then."""
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        rt.manager.wait(1)
    return rt.connected_workers()


def start_worker(port: int, workspace: Path, password: Path, *extra: str) -> subprocess.Popen:
    return subprocess.Popen(
        [str(vine_binary("vine_worker")), "127.0.0.1", str(port), "--cores", "1",
         "--password", str(password), "--workspace", str(workspace), "--timeout", "30",
         *extra],
        stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, start_new_session=True)


def stop(proc: subprocess.Popen) -> str:
    stop_session(proc.pid)
    _, err = proc.communicate(timeout=10)
    return err.decode(errors="replace") if err else ""


# --- the manager's port ---------------------------------------------------------------

@pytest.mark.parametrize(("attempt", "why"), [
    (attack.reflect_to_server, "the manager accepted its own challenge's answer"),
    (attack.relay_to_server, "the manager answered one connection's challenge on another"),
], ids=["reflection", "relay"])
def test_the_manager_refuses_an_outsider(tmp_path: Path,
                                         attempt: Callable[..., bool], why: str) -> None:
    held: list[attack.Lines] = []
    with manager(tmp_path) as rt:
        got_in = pumped(rt, lambda: attempt(rt.port, hold=held))
        workers = serve(rt, 1.5)
        for lines in held:
            lines.close()
    assert not got_in, why
    assert workers == 0


def test_right_password_in_wrong_and_old_exchange_out(tmp_path: Path,
                                                       capfd: pytest.CaptureFixture[str]) -> None:
    wrong = tmp_path / "wrong.password"
    wrong.write_text("not-the-secret")
    wrong.chmod(0o600)
    with manager(tmp_path) as rt:
        password = password_of(rt)
        bad = start_worker(rt.port, tmp_path / "bad", wrong)
        assert serve(rt, 3) == 0
        assert "wrong password" in stop(bad)
        # a client of the old exchange: refused, and the manager says why, naming both
        old = attack.connect(rt.port)
        ident, closed = pumped(rt, lambda: speak_the_old_exchange(old))
        assert (ident, closed) == (AUTH_IDENT, True)
        assert f"'{AUTH_IDENT_V1.decode()}'" in capfd.readouterr().err
        good = start_worker(rt.port, tmp_path / "good", password)
        try:
            assert serve_until(rt, lambda: rt.connected_workers() == 1, 30)
            # datavine's own client speaks the same exchange and checks the manager's proof
            assert pumped(rt, lambda: connected_workers("127.0.0.1", rt.port,
                                                        password_file=password)) == 1
            with pytest.raises(ManagerQueryError, match="rejected the password"):
                pumped(rt, lambda: connected_workers("127.0.0.1", rt.port,
                                                      password_file=wrong))
        finally:
            stop(good)


def password_of(rt: Runtime) -> Path:
    assert rt.manager_config.password_file is not None
    return Path(rt.manager_config.password_file)


def speak_the_old_exchange(lines: attack.Lines) -> tuple[bytes, bool]:
    """(the manager's ident, whether it then closed on us) after we announce the old one."""
    ident = lines.readline()
    lines.send(AUTH_IDENT_V1)
    try:
        lines.readline()
    except attack.Refused:
        return ident, True
    return ident, False


def serve_until(rt: Runtime, what: Callable[[], bool], seconds: float) -> bool:
    deadline = time.monotonic() + seconds
    while not what() and time.monotonic() < deadline:
        rt.manager.wait(1)
    return what()


# --- a worker's transfer server -------------------------------------------------------

@contextlib.contextmanager
def worker_with_transfer_port(tmp_path: Path) -> Iterator[tuple[Runtime, int]]:
    """A manager and one worker connected to it, its transfer server on a known port."""
    with manager(tmp_path) as rt:
        port = free_port()
        worker = start_worker(rt.port, tmp_path / "w", password_of(rt), "--transfer-port",
                              str(port))
        try:
            assert serve_until(rt, lambda: rt.connected_workers() == 1, 30), \
                "the worker did not connect"
            yield rt, port
        finally:
            stop(worker)


def transfer_server_serves(lines: attack.Lines) -> bool:
    """After getting in: does the transfer server answer a request at all?"""
    lines.send(b"get no-such-file")
    try:
        lines.readline()
    except attack.Refused:
        return False
    return True


def test_a_transfer_server_refuses_reflection_and_relay(tmp_path: Path) -> None:
    with worker_with_transfer_port(tmp_path) as (rt, port):
        held: list[attack.Lines] = []
        reflected = pumped(rt, lambda: attack.reflect_to_server(port, hold=held))
        relayed = pumped(rt, lambda: attack.relay_to_server(port, hold=held))
        served = [transfer_server_serves(lines) for lines in held]
    assert not reflected, "the transfer server accepted its own challenge's answer"
    assert not relayed, "the transfer server answered one connection's challenge on another"
    assert not any(served)


# --- a worker facing a fake manager ---------------------------------------------------

def test_a_worker_refuses_a_fake_manager_that_reflects(tmp_path: Path) -> None:
    password = make_password_file(tmp_path / "secret")
    server = attack.fake_server()
    worker = start_worker(server.getsockname()[1], tmp_path / "w", password)
    try:
        got_in = attack.reflect_to_client(server)
    finally:
        stop(worker)
        server.close()
    assert not got_in, "the worker took a fake manager's reflected answer for a proof"


def test_a_worker_refuses_a_fake_manager_relaying_a_transfer_server(tmp_path: Path) -> None:
    """A fake manager hands the worker's challenge to a transfer server of the same pool
    (it shares the password and answers challenges): its proof is for another service."""
    with worker_with_transfer_port(tmp_path) as (rt, transfer_port):
        server = attack.fake_server()
        victim = start_worker(server.getsockname()[1], tmp_path / "victim", password_of(rt))
        try:
            got_in = pumped(rt, lambda: attack.relay_client_to(server, transfer_port))
        finally:
            stop(victim)
            server.close()
    assert not got_in, "the worker took a transfer server's answer for its manager's"


def test_the_worker_verifies_the_manager_proof() -> None:
    """The proofs bind the role: the manager's is never the worker's, for any challenges."""
    password, s, c = b"pw", b"a" * 64, b"b" * 64
    assert proof(password, "manager", s, c) != proof(password, "worker", s, c)
    assert proof(password, "manager", s, c) != proof(password, "manager", c, s)
    assert proof(password, "manager", s, c) != proof(password, "transfer-server", s, c)
