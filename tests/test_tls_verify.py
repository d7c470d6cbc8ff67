"""Workers check the manager's certificate (issue 28, item 3; TaskVine patch 0014).

With TLS on, a worker used to wrap its connection without looking at the certificate, so
whoever held the manager's address could play the manager. Here, on the real binaries, a
worker given the site's CA (``--ssl-ca``) or the manager's pinned fingerprint
(``--ssl-fingerprint``) connects to its manager and runs a task, and refuses an impostor
whose self-signed certificate carries the same subject and address, saying why; a worker
with plain ``--ssl`` does connect to that impostor (the attack the checks stop). The
impostor even holds the password (a relay, a leaked password): only the certificate check
stands between it and the worker. A ``LocalCluster`` with TLS pins its workers to its own
certificate, pools carry the checks through ``vine_factory`` (a real local pool too),
facility files and ``datavine pool start`` name them, and datavine's status client checks
the manager as the workers do, sending nothing to an impostor.

The certificates: ``tests/tls_certs.py``. The settings that carry the checks (options,
facility keys, ``pool start``, refusals) are tested without TaskVine in
``tests/test_tls_settings.py``.
"""

from __future__ import annotations

import contextlib
import operator
import os
import shutil
import socket
import ssl
import subprocess
import threading
import time
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import TypeVar

import pytest
from dask import delayed

import datavine
from datavine.config import LocalWorkersConfig
from datavine.deploy.binaries import vine_binary
from datavine.deploy.facility import FacilityCluster, load_facility
from datavine.deploy.local_workers import worker_command, worker_environment
from datavine.deploy.pools.ca_file import CA_NAME
from datavine.deploy.pools.condor import CondorPool
from datavine.deploy.pools.factory import FactoryConfig
from datavine.deploy.pools.local import LocalFactoryPool
from datavine.deploy.pools.manager_status import ManagerQueryError, connected_workers
from datavine.deploy.pools.state import default_pool_dir
from datavine.deploy.sessions import stop_session
from datavine.deploy.tls import ManagerTrust, certificate_fingerprint
from datavine.deploy.vine_auth import AUTH_IDENT
from datavine.manager.cluster import manager_pin
from tests.tls_certs import Certs, facility, make_certs, openssl_fingerprint

pytest_plugins = ["tests.fixtures_condor"]  # condor_diagnostics (and the personal pool)
taskvine = pytest.mark.taskvine
T = TypeVar("T")
REFUSED_S = 4.0  # how long a refused worker is watched not to connect (it retries each ~1 s)


@pytest.fixture(scope="module")
def certs(tmp_path_factory: pytest.TempPathFactory) -> Certs:
    return make_certs(tmp_path_factory.mktemp("certs"))


# --- managers and hand-started workers --------------------------------------------------------
@contextlib.contextmanager
def tls_manager(tmp_path: Path, key: Path, cert: Path) -> Iterator[datavine.Cluster]:
    cfg = datavine.ManagerConfig(run_dir=tmp_path / "mgr", ssl_key=key, ssl_cert=cert)
    with datavine.Cluster(cfg, dashboard=False) as c:
        yield c


@dataclass
class Worker:
    proc: subprocess.Popen[bytes]
    log: Path

    def stop(self) -> str:
        """Stop it (and what it started); what it wrote."""
        stop_session(self.proc.pid)
        with contextlib.suppress(subprocess.TimeoutExpired):
            self.proc.wait(timeout=10)
        return self.log.read_text(errors="replace")


def start_worker(c: datavine.Cluster, tmp_path: Path, name: str, *extra: str) -> Worker:
    log = tmp_path / f"{name}.log"
    with open(log, "wb") as out:
        proc = subprocess.Popen(
            [str(vine_binary("vine_worker")), "127.0.0.1", str(c.port), "--cores", "1",
             "--password", str(c.password_file), "--workspace", str(tmp_path / name),
             "--timeout", "30", *extra],
            stdout=out, stderr=subprocess.STDOUT, env=worker_environment(),
            start_new_session=True)
    return Worker(proc, log)


def connected_after(c: datavine.Cluster, seconds: float) -> int:
    assert c.runtime is not None
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        c.runtime.manager.wait(1)
    return c.runtime.connected_workers()


def runs_a_task(c: datavine.Cluster) -> None:
    assert c.runtime is not None
    c.runtime.wait_for_workers(1, 20)
    assert delayed(operator.add)(2, 3).compute(scheduler=c.get) == 5


def pumped(c: datavine.Cluster, fn: Callable[[], T], timeout_s: float = 20.0) -> T:
    """``fn()`` on a thread while this one serves the manager (its ``wait``)."""
    assert c.runtime is not None
    with ThreadPoolExecutor(1) as pool:
        future = pool.submit(fn)
        deadline = time.monotonic() + timeout_s
        while not future.done() and time.monotonic() < deadline:
            c.runtime.manager.wait(1)
        return future.result(timeout=1)


def checks(kind: str, certs: Certs) -> tuple[str, ...]:
    """The worker's options of one kind of check, for the real manager's certificate."""
    if kind == "ca":
        return (f"--ssl-ca={certs.ca}",)
    return (f"--ssl-fingerprint={openssl_fingerprint(certs.cert)}",)  # openssl's own form


# --- on the real binaries ---------------------------------------------------------------------
@taskvine
@pytest.mark.parametrize("kind", ["ca", "fingerprint"])
def test_a_worker_that_checks_connects_to_its_manager_and_runs_a_task(
        kind: str, certs: Certs, tmp_path: Path) -> None:
    with tls_manager(tmp_path, certs.key, certs.cert) as c:
        worker = start_worker(c, tmp_path, "w", *checks(kind, certs))
        try:
            runs_a_task(c)
        finally:
            worker.stop()


@taskvine
@pytest.mark.parametrize("kind", ["ca", "fingerprint"])
def test_a_worker_that_checks_refuses_an_impostor_that_plain_ssl_serves(
        kind: str, certs: Certs, tmp_path: Path) -> None:
    """The impostor's certificate has the manager's subject and address, and it holds the
    password: a worker that checks does not connect, and says why; one with plain --ssl
    connects to it (what the check stops)."""
    why = "does not verify against" if kind == "ca" else "pinned SHA-256 fingerprint"
    with tls_manager(tmp_path, certs.impostor_key, certs.impostor_cert) as c:
        checked = start_worker(c, tmp_path, "checked", *checks(kind, certs))
        try:
            assert connected_after(c, REFUSED_S) == 0, "a checking worker served an impostor"
            plain = start_worker(c, tmp_path, "plain", "--ssl")
            try:
                runs_a_task(c)  # the attack, without the check: the worker serves the impostor
                assert connected_after(c, 1) == 1  # the plain one; the checked one still out
            finally:
                plain.stop()
        finally:
            said = checked.stop()
    assert why in said, said
    assert "could not setup ssl connection (or the manager's certificate did not verify)" in said


@taskvine
def test_a_worker_with_the_ca_refuses_a_certificate_for_another_host(
        certs: Certs, tmp_path: Path) -> None:
    """Signed by the right CA, but naming another host: the name check refuses it."""
    with tls_manager(tmp_path, certs.elsewhere_key, certs.elsewhere_cert) as c:
        worker = start_worker(c, tmp_path, "w", f"--ssl-ca={certs.ca}")
        try:
            assert connected_after(c, REFUSED_S) == 0
        finally:
            said = worker.stop()
    assert "as '127.0.0.1'" in said and "mismatch" in said.lower(), said


@taskvine
def test_a_local_cluster_with_tls_pins_its_workers_and_runs_a_graph(
        certs: Certs, tmp_path: Path) -> None:
    cfg = datavine.ManagerConfig(run_dir=tmp_path / "mgr", ssl_key=certs.key,
                                 ssl_cert=certs.cert)
    pin = f"--ssl-fingerprint={certificate_fingerprint(certs.cert)}"
    with datavine.LocalCluster(workers=1, manager=cfg, dashboard=False) as c:
        assert c.workers is not None
        for proc in c.workers.procs:  # the command each was started with
            assert pin in proc.args and "--ssl" in proc.args
        total = delayed(sum)([delayed(operator.mul)(i, 2) for i in range(10)])
        assert total.compute(scheduler=c.get) == 90
    trust = manager_pin(cfg)
    assert trust is not None
    cmd = worker_command(LocalWorkersConfig(workers=1), 9123, tmp_path, password_file=None,
                         ssl=True, trust=trust, binary="vine_worker")
    assert pin in cmd
    assert manager_pin(datavine.ManagerConfig(run_dir=tmp_path)) is None  # no TLS, no pin


@taskvine
def test_a_local_pool_ships_the_ca_to_its_workers(certs: Certs, tmp_path: Path) -> None:
    """Through a real vine_factory: the CA file travels with the job, named there by its
    name alone; the worker finds it (patch 0014), checks the manager with it and connects."""
    with tls_manager(tmp_path, certs.key, certs.cert) as c:
        cfg = FactoryConfig("127.0.0.1", c.port, batch="local", workers=1, min_workers=1,
                            password_file=c.password_file, ssl_ca=certs.ca,
                            idle_timeout_s=60, factory_period_s=1)
        with LocalFactoryPool(cfg, name="t-tls", pool_dir=tmp_path / "pools") as pool:
            assert c.runtime is not None
            c.runtime.wait_for_workers(1, 25)
            (pid,) = _pool_workers(pool.pid)
            args = Path(f"/proc/{pid}/cmdline").read_text().split("\0")
            (ca,) = [a.removeprefix("--ssl-ca=") for a in args if a.startswith("--ssl-ca=")]
            assert ca == CA_NAME  # relative to the job's folder, where the worker starts
            shipped = pool.scratch_dir / CA_NAME  # vine_factory's copy, in the job's folder
            assert shipped.read_bytes() == certs.ca.read_bytes()


@taskvine
def test_a_factory_checks_the_manager_on_its_own_connection(certs: Certs,
                                                            tmp_path: Path) -> None:
    """vine_factory asks the manager how many workers it needs, with its password proof:
    pinned to another certificate, it refuses this manager (and so do its workers)."""
    with tls_manager(tmp_path, certs.key, certs.cert) as c:
        cfg = FactoryConfig("127.0.0.1", c.port, batch="local", workers=1, min_workers=1,
                            password_file=c.password_file,
                            ssl_fingerprint=certificate_fingerprint(certs.impostor_cert),
                            idle_timeout_s=60, factory_period_s=1)
        with LocalFactoryPool(cfg, name="t-pin", pool_dir=tmp_path / "pools") as pool:
            assert c.runtime is not None
            deadline = time.monotonic() + 6
            while time.monotonic() < deadline:
                c.runtime.manager.wait(1)
            assert c.runtime.connected_workers() == 0
            said = pool.log_path.read_text(errors="replace")
    assert "certificate did not verify" in said, said[-2000:]


@taskvine
def test_a_facility_with_tls_runs_on_pool_workers_pinned_to_its_manager(
        certs: Certs, tmp_path: Path) -> None:
    """``datavine run --facility``'s cluster: TLS named, nothing else; its pool's workers
    are pinned to the manager's certificate, connect, and run a graph."""
    path = facility(tmp_path, certs, f'run_dir = "{tmp_path / "mgr"}"\nworkers_timeout_s = 60')
    with FacilityCluster(load_facility(path), pool_dir=tmp_path / "pools") as c:
        (pool,) = c.pools
        assert pool.config.ssl_fingerprint == certificate_fingerprint(certs.cert)
        (pid,) = _pool_workers(pool.pid)
        pin = f"--ssl-fingerprint={certificate_fingerprint(certs.cert)}"
        assert pin in Path(f"/proc/{pid}/cmdline").read_text().split("\0")
        total = delayed(sum)([delayed(operator.add)(i, 1) for i in range(6)])
        assert total.compute(scheduler=c.get) == 21


@taskvine
@pytest.mark.condor
def test_a_condor_pool_ships_the_ca_to_its_jobs(certs: Certs, tmp_path: Path,
                                                condor_diagnostics: None) -> None:
    """The same through HTCondor: the CA file reaches the job's own folder (not a shared
    one), where the worker finds it by its full path, checks the manager and connects."""
    with tls_manager(tmp_path, certs.key, certs.cert) as c:
        cfg = FactoryConfig("127.0.0.1", c.port, workers=1, min_workers=1,
                            password_file=c.password_file, ssl_ca=certs.ca,
                            idle_timeout_s=60, factory_period_s=1)
        with CondorPool(cfg, name="t-tls-ca", pool_dir=default_pool_dir()) as pool:
            assert c.runtime is not None
            c.runtime.wait_for_workers(1, 90)
            assert (pool.scratch_dir / CA_NAME).read_bytes() == certs.ca.read_bytes()


def _pool_workers(pgid: int | None) -> list[int]:
    """The vine_worker processes of a local pool (its factory's process group)."""
    found: list[tuple[int, int]] = []  # (pid, parent)
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        with contextlib.suppress(OSError):
            if os.getpgid(int(entry.name)) != pgid:
                continue
            argv0 = (entry / "cmdline").read_bytes().split(b"\0", 1)[0]
            if Path(argv0.decode()).name == "vine_worker":
                parent = int((entry / "stat").read_text().rsplit(")", 1)[1].split()[1])
                found.append((int(entry.name), parent))
    # a worker's own children (its transfer server, forked) carry its name: not workers
    pids = {pid for pid, _ in found}
    return [pid for pid, parent in found if parent not in pids]


@taskvine
def test_the_status_client_checks_the_manager_as_workers_do(certs: Certs,
                                                            tmp_path: Path) -> None:
    right = ManagerTrust(fingerprint=openssl_fingerprint(certs.cert))
    wrong = ManagerTrust(fingerprint=certificate_fingerprint(certs.impostor_cert))
    other_ca = ManagerTrust(ca_file=certs.impostor_cert)  # a CA that did not sign it
    with tls_manager(tmp_path, certs.key, certs.cert) as c:
        def ask(trust: ManagerTrust) -> int:
            return connected_workers("127.0.0.1", c.port, password_file=c.password_file,
                                     trust=trust, timeout_s=5)

        assert pumped(c, lambda: ask(ManagerTrust(ca_file=certs.ca))) == 0
        assert pumped(c, lambda: ask(right)) == 0
        with pytest.raises(ManagerQueryError, match="not the pinned"):
            pumped(c, lambda: ask(wrong))
        with pytest.raises(ManagerQueryError, match="does not verify against"):
            pumped(c, lambda: ask(other_ca))


# --- the status client against an impostor: nothing is sent -----------------------------------
@contextlib.contextmanager
def impostor(certs: Certs) -> Iterator[tuple[int, list[bytes]]]:
    """A TLS server with the impostor's certificate; what its one client sent."""
    ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    ctx.load_cert_chain(certs.impostor_cert, certs.impostor_key)
    server = socket.create_server(("127.0.0.1", 0))
    heard: list[bytes] = []

    def serve() -> None:
        conn, _ = server.accept()
        conn.settimeout(5)
        with contextlib.suppress(OSError), ctx.wrap_socket(conn, server_side=True) as tls:
            heard.append(tls.recv(4096))

    thread = threading.Thread(target=serve, daemon=True)
    thread.start()
    try:
        yield server.getsockname()[1], heard
    finally:
        thread.join(10)
        server.close()


def test_the_status_client_tells_an_impostor_nothing(certs: Certs, tmp_path: Path) -> None:
    password = tmp_path / "pw"
    password.write_text("s3cret")
    pin = ManagerTrust(fingerprint=certificate_fingerprint(certs.cert))
    with impostor(certs) as (port, heard), pytest.raises(ManagerQueryError,
                                                         match="not the pinned"):
        connected_workers("127.0.0.1", port, password_file=password, trust=pin, timeout_s=3)
    assert heard in ([], [b""]), f"the impostor heard {heard}"
    # without a check (plain ssl), the same client talks to it: its password exchange starts
    with impostor(certs) as (port, heard), pytest.raises(ManagerQueryError):
        connected_workers("127.0.0.1", port, password_file=password, ssl=True, timeout_s=2)
    assert heard and heard[0].startswith(AUTH_IDENT), "without a check it spoke to the impostor"


@taskvine
def test_a_worker_reads_a_relative_ca_file_from_where_it_started(certs: Certs,
                                                                  tmp_path: Path) -> None:
    """vine_worker moves into its workspace before it connects: the job's relative name
    (how a pool ships the CA) must still be found (patch 0014 makes it absolute)."""
    job = tmp_path / "job"
    job.mkdir()
    shutil.copyfile(certs.ca, job / CA_NAME)
    out = subprocess.run([str(vine_binary("vine_worker")), f"--ssl-ca={CA_NAME}", "--help"],
                         cwd=job, capture_output=True, text=True, timeout=30)
    assert "ssl-ca" in out.stdout + out.stderr
    missing = subprocess.run([str(vine_binary("vine_worker")), "--ssl-ca=nowhere.pem",
                              "127.0.0.1", "1"], cwd=job, capture_output=True, text=True,
                             timeout=30)
    assert missing.returncode != 0 and "nowhere.pem" in missing.stderr
