"""Workers authenticate to the manager: without the password (or SSL when set) they are refused."""

from __future__ import annotations

import contextlib
import operator
import os
import shutil
import signal
import subprocess
import time
from pathlib import Path

import pytest
from dask import delayed

import datavine
from datavine.deploy.binaries import vine_binary
from datavine.deploy.local_workers import worker_environment

pytestmark = pytest.mark.taskvine


def start_worker(port: int, workspace: Path, *extra: str) -> subprocess.Popen:
    return subprocess.Popen(
        [str(vine_binary("vine_worker")), "127.0.0.1", str(port), "--cores", "1",
         "--workspace", str(workspace), "--timeout", "30", *extra],
        stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, env=worker_environment(),
        start_new_session=True)  # its own group: stop() also ends its transfer server


def stop(proc: subprocess.Popen) -> None:
    with contextlib.suppress(ProcessLookupError):
        os.killpg(proc.pid, signal.SIGKILL)
    proc.wait(timeout=10)


def connected_after(cluster: datavine.Cluster, seconds: float) -> int:
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        cluster.runtime.manager.wait(1)
    return cluster.runtime.connected_workers()


def test_workers_without_the_password_are_rejected(tmp_path: Path) -> None:
    cfg = datavine.ManagerConfig(run_dir=tmp_path / "mgr")
    wrong = tmp_path / "wrong.password"
    wrong.write_text("not-the-secret")
    with datavine.Cluster(cfg) as c:
        intruders = [start_worker(c.port, tmp_path / "w0"),
                     start_worker(c.port, tmp_path / "w1", "--password", str(wrong))]
        try:
            assert connected_after(c, 3) == 0
            good = start_worker(c.port, tmp_path / "w2", "--password", str(c.password_file))
            try:
                c.runtime.wait_for_workers(1, 20)
                assert connected_after(c, 1) == 1
                assert delayed(operator.add)(2, 3).compute(scheduler=c.get) == 5
            finally:
                stop(good)
        finally:
            for p in intruders:
                stop(p)


def test_ssl_manager_needs_ssl_workers(tmp_path: Path) -> None:
    assert shutil.which("openssl"), "openssl is missing: scripts/setup.sh installs it"
    key, cert = tmp_path / "key.pem", tmp_path / "cert.pem"
    subprocess.run(["openssl", "req", "-x509", "-newkey", "rsa:2048", "-nodes", "-keyout",
                    str(key), "-out", str(cert), "-days", "1", "-subj", "/CN=localhost"],
                   check=True, capture_output=True)
    cfg = datavine.ManagerConfig(run_dir=tmp_path / "mgr", ssl_key=key, ssl_cert=cert)
    with datavine.Cluster(cfg) as c:
        plain = start_worker(c.port, tmp_path / "w0", "--password", str(c.password_file))
        try:
            assert connected_after(c, 3) == 0
            tls = start_worker(c.port, tmp_path / "w1", "--password", str(c.password_file),
                               "--ssl")
            try:
                c.runtime.wait_for_workers(1, 20)
                assert delayed(operator.mul)(4, 5).compute(scheduler=c.get) == 20
            finally:
                stop(tls)
        finally:
            stop(plain)
