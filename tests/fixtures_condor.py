"""Fixtures for the HTCondor tests: the personal pool, a password, diagnostics on failure.

``condor_pool`` makes sure the personal HTCondor pool (workers/condor) is up for the
session: it starts it with ``start_pool.sh`` when it is not running, and stops it with
``stop_pool.sh`` at the end only if it started it. The tests skip, with the reason, where the
pool is not installed (``bash workers/condor/install_pool.sh``) or the user is not root.

``condor_diagnostics`` (per test) prints ``condor_q``, ``condor_history``, the daemon logs
and the factories' logs when the test failed, on the terminal (not the captured output).
"""

from __future__ import annotations

import os
import secrets
import socket
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from datavine.deploy.pools.condor import condor_exec, pool_missing, scripts_dir
from datavine.deploy.pools.state import PROJECT_ROOT, default_pool_dir

CONDOR_ROOT = Path(os.environ.get("DATAVINE_CONDOR_ROOT", PROJECT_ROOT / "build" / "condor-root"))
DAEMON_LOGS = ("MasterLog", "SchedLog", "StartLog", "NegotiatorLog", "CollectorLog")


def condor_not_installed() -> str | None:
    """Why the pool cannot even be started here, or None."""
    if os.geteuid() != 0:
        return "the personal HTCondor pool needs root (chroot, bind mounts)"
    if not (CONDOR_ROOT / ".datavine-installed").exists():
        return (f"personal HTCondor pool not installed in {CONDOR_ROOT}: "
                "bash workers/condor/install_pool.sh (~1 min, ~400 MB)")
    try:
        import ndcctools.taskvine  # noqa: F401
    except ImportError:
        return "ndcctools.taskvine missing: run scripts/build_taskvine.sh"
    return None


def _run_script(name: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(["bash", str(scripts_dir() / name)], text=True, capture_output=True,
                          timeout=120, check=False)


def diagnostics() -> str:
    """condor_q, condor_history, the daemon logs' tails and the factories' logs."""
    parts = []
    for args in (("condor_q", "-allusers", "-nobatch"),
                 ("condor_q", "-allusers", "-af", "ClusterId", "JobStatus", "DatavinePool",
                  "HoldReason"),
                 ("condor_history", "-limit", "20", "-af", "ClusterId", "JobStatus",
                  "ExitCode", "DatavinePool", "RemoveReason")):
        result = condor_exec(*args, timeout_s=20)
        parts.append(f"$ {' '.join(args)}\n{result.stdout}{result.stderr}")
    for log in DAEMON_LOGS:
        path = CONDOR_ROOT / "var" / "log" / "condor" / log
        if path.exists():
            tail = path.read_text(errors="replace").splitlines()[-25:]
            parts.append(f"--- {path} (last 25 lines)\n" + "\n".join(tail))
    for path in sorted(default_pool_dir().glob("*/*/factory.log")):
        tail = path.read_text(errors="replace").splitlines()[-15:]
        parts.append(f"--- {path} (last 15 lines)\n" + "\n".join(tail))
    return "\n".join(parts)


def _show(request: pytest.FixtureRequest, title: str, text: str) -> None:
    reporter = request.config.pluginmanager.get_plugin("terminalreporter")
    if reporter is not None:
        reporter.write_sep("=", title)
        reporter.write_line(text)
    else:
        print(f"=== {title}\n{text}", file=sys.__stderr__)


@pytest.fixture(scope="session")
def condor_pool(request: pytest.FixtureRequest) -> Iterator[None]:
    """The personal HTCondor pool, up for the session."""
    why = condor_not_installed()
    if why:
        pytest.skip(why)
    started_here = pool_missing() is not None
    if started_here:
        result = _run_script("start_pool.sh")
        if result.returncode != 0:
            pytest.fail(f"start_pool.sh failed:\n{result.stdout}{result.stderr}\n{diagnostics()}")
        why = pool_missing()
        if why:
            pytest.fail(f"the pool started but cannot take jobs: {why}\n{diagnostics()}")
    yield
    if started_here:
        result = _run_script("stop_pool.sh")
        if result.returncode != 0:
            _show(request, "stop_pool.sh failed", result.stdout + result.stderr)


@pytest.fixture
def condor_diagnostics(request: pytest.FixtureRequest, condor_pool: None) -> Iterator[None]:
    """Print the pool's state and logs if the test using this fixture failed."""
    failed_before = request.session.testsfailed
    yield
    # The call phase's report is counted before teardown starts.
    if request.session.testsfailed > failed_before:
        _show(request, f"HTCondor state after {request.node.name} failed", diagnostics())


@pytest.fixture
def password_file(tmp_path: Path) -> Path:
    path = tmp_path / "vine.password"
    path.write_text(secrets.token_hex(32))
    path.chmod(0o600)
    return path


@pytest.fixture
def free_port() -> int:
    """A TCP port free now (for a manager that starts after its pool)."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


MANAGER_SCRIPT = """
import sys
import ndcctools.taskvine as vine
m = vine.Manager(port=0, run_info_path=sys.argv[2])
m.set_password_file(sys.argv[1])
print(m.port, flush=True)
while True:
    m.wait(1)  # serves workers and status queries
"""


@pytest.fixture
def manager_process(password_file: Path, tmp_path: Path) -> Iterator[int]:
    """A TaskVine manager in its own process (so that this one can query it); its port."""
    proc = subprocess.Popen([sys.executable, "-c", MANAGER_SCRIPT, str(password_file),
                             str(tmp_path / "vine-run-info")], stdout=subprocess.PIPE,
                            stderr=subprocess.DEVNULL, text=True)
    assert proc.stdout is not None
    line = proc.stdout.readline().strip()
    if not line.isdigit():
        proc.kill()
        pytest.fail(f"the manager process did not start (said {line!r})")
    try:
        yield int(line)
    finally:
        proc.kill()
        proc.wait(timeout=10)
