"""The TaskVine capability record (datavine.manager.capabilities): its lines, its probes
checked against what the TaskVine in use does (the GIL, the listen address, the password
exchange, vine_worker's options), and the options local workers and pools pass."""

from __future__ import annotations

import subprocess
import threading
import time
from pathlib import Path

import pytest

from datavine.config import ConfigError, ManagerConfig
from datavine.deploy.local_workers import fit_options
from datavine.deploy.pools.factory import FactoryConfig, factory_command, fit_to_programs
from datavine.deploy.tls import ManagerTrust
from datavine.deploy.vine_options import options_in_help, unsupported
from datavine.manager.capabilities import (
    CAPABILITIES,
    Capabilities,
    _addresses,
    listen_honoured,
)

ALL = frozenset({"--transfer-address", "--ssl-ca", "--ssl-fingerprint", "--cores"})
STOCK = frozenset({"--cores", "--ssl"})
FINGERPRINT = "ab" * 32


# --- the record's lines (pure) ----------------------------------------------------------------
def test_one_line_per_missing_capability_with_what_is_lost_and_the_remedy() -> None:
    record = Capabilities({c.key: True for c in CAPABILITIES})
    assert record.lines() == []
    record.found["gil-released"] = False
    record.found["library-queue"] = None  # not known: no line
    record.broken["file-pointer"] = "File.__init__ has no self._file"
    (gil, internals) = record.lines()
    assert "GIL" in gil and "swig -threads" in gil and "scripts/build_taskvine.sh" in gil
    assert "file-pointer" in internals and "self._file" in internals


def test_worker_features_are_learned_from_the_first_complete_worker() -> None:
    record = Capabilities({"worker-features": None})
    record.saw_workers([{"addrport": "1.2.3.4:9", "cores_total": 0}])  # not reported yet
    assert record.found["worker-features"] is None
    record.saw_workers([{"addrport": "1.2.3.4:9", "cores_total": 1}])
    assert record.found["worker-features"] is False
    record = Capabilities({"worker-features": None})
    record.saw_workers([{"addrport": "1.2.3.4:9", "cores_total": 1, "features": []}])
    assert record.found["worker-features"] is True


def test_the_kernel_table_says_where_a_port_listens() -> None:
    table = ("  sl  local_address rem_address   st\n"
             "   0: 0100007F:1F90 00000000:0000 0A\n"   # 127.0.0.1:8080 LISTEN
             "   1: 00000000:1F91 00000000:0000 0A\n"   # 0.0.0.0:8081 LISTEN
             "   2: 0100007F:1F92 0100007F:D431 01\n")  # established: not a listener
    assert _addresses(table, 8080, v6=False) == {"127.0.0.1"}
    assert _addresses(table, 8081, v6=False) == {"0.0.0.0"}
    assert _addresses(table, 8082, v6=False) == set()
    assert listen_honoured("127.0.0.1", {"127.0.0.1"}) is True
    assert listen_honoured("127.0.0.1", {"0.0.0.0"}) is False
    assert listen_honoured(None, {"0.0.0.0"}) is None


# --- options: what local workers and pools pass (pure) ----------------------------------------
def test_options_are_read_from_help_text() -> None:
    text = ("Use: vine_worker [options] <host> <port>\n -C,--catalog=<catalog>  ...\n"
            " --transfer-address=<addr>  Listen for worker-worker transfers\n --ssl  TLS\n")
    found = options_in_help(text)
    assert {"--catalog", "--transfer-address", "--ssl"} <= found
    assert unsupported(["--ssl-ca=/x", "--ssl", "--ssl-ca=/y"], found) == ["--ssl-ca"]


def test_local_workers_leave_out_what_their_vine_worker_lacks(tmp_path: Path) -> None:
    trust = ManagerTrust(None, FINGERPRINT)
    assert fit_options("127.0.0.1", trust, ALL) == ("127.0.0.1", trust)
    assert fit_options("127.0.0.1", trust, STOCK) == (None, None)


def test_a_pool_never_passes_an_option_its_workers_do_not_take() -> None:
    cfg = FactoryConfig("127.0.0.1", 9123, batch="local", transfer_address="127.0.0.1")
    fitted, dropped = fit_to_programs(cfg, ALL, ALL)
    assert fitted == cfg and dropped == []
    fitted, dropped = fit_to_programs(cfg, STOCK, STOCK)
    assert fitted.transfer_address is None and "--transfer-address" in dropped[0]
    assert not any(a.startswith("--transfer-address") or "transfer-address" in a
                   for a in factory_command(fitted))


@pytest.mark.parametrize("program", ["workers", "factory"])
def test_a_certificate_check_a_pool_cannot_make_is_an_error(program: str) -> None:
    cfg = FactoryConfig("127.0.0.1", 9123, batch="local", ssl_fingerprint=FINGERPRINT)
    worker, factory = (STOCK, ALL) if program == "workers" else (ALL, STOCK)
    with pytest.raises(ConfigError, match=r"--ssl-fingerprint.*patch 0014"):
        fit_to_programs(cfg, worker, factory)


# --- the probes against what the TaskVine in use does ------------------------------------------
@pytest.fixture
def port(tmp_path: Path):  # type: ignore[no-untyped-def]
    from datavine.manager.cluster import make_password_file
    from datavine.manager.taskvine_port import TaskVinePort

    port = TaskVinePort(ManagerConfig(run_dir=tmp_path / "run",
                                      password_file=make_password_file(tmp_path)))
    try:
        yield port
    finally:
        port.close()


@pytest.mark.taskvine
def test_the_gil_probe_says_what_wait_does(port) -> None:  # type: ignore[no-untyped-def]
    """While the manager waits 2 s for nothing, a thread counting every millisecond counts
    on when the bindings release the GIL, and not at all when they hold it."""
    ticks = [0]
    stop = threading.Event()

    def count() -> None:
        while not stop.is_set():
            ticks[0] += 1
            time.sleep(0.001)

    thread = threading.Thread(target=count, daemon=True)
    thread.start()
    time.sleep(0.05)
    before = ticks[0]
    port.wait_task(2)
    during = ticks[0] - before
    stop.set()
    thread.join(5)
    if port.capabilities.has("gil-released"):
        assert during > 50, f"the thread counted {during} while the manager waited"
    else:
        assert during < 10, f"the GIL is said to be held, yet the thread counted {during}"


@pytest.mark.taskvine
def test_the_listen_probe_reads_the_manager_socket(port) -> None:  # type: ignore[no-untyped-def]
    from datavine.manager.capabilities import listening_on

    bound = listening_on(port.port)
    assert bound, "the manager's listening socket is in the kernel's table"
    expected = {"127.0.0.1"} if port.capabilities.has("listen-address") else {"0.0.0.0"}
    assert bound == expected


@pytest.mark.taskvine
def test_the_password_probe_says_whether_reflection_gets_in(port) -> None:  # type: ignore[no-untyped-def]
    """The stock exchange lets a client without the password in by sending the manager's
    challenge back (tests/vine_attacks.py); patch 0012's does not. The attack runs in a
    process of its own: a stock manager holds the GIL while it waits for the answer."""
    import sys

    attack = subprocess.Popen(
        [sys.executable, "-c", "import sys; from tests import vine_attacks as a; "
         f"print(a.reflect_to_server({port.port}))"],
        stdout=subprocess.PIPE, text=True, cwd=Path(__file__).resolve().parents[1])
    deadline = time.monotonic() + 30
    while attack.poll() is None and time.monotonic() < deadline:
        port.wait_task(1)
    out, _ = attack.communicate(timeout=10)
    assert out.strip() in ("True", "False"), out
    assert (out.strip() == "True") is not port.capabilities.has("password-hmac")


@pytest.mark.taskvine
def test_the_worker_option_probe_matches_vine_worker_help(port) -> None:  # type: ignore[no-untyped-def]
    from datavine.deploy.binaries import vine_binary

    done = subprocess.run([str(vine_binary("vine_worker")), "--help"], capture_output=True,
                          text=True, timeout=10, check=False)
    text = done.stdout + done.stderr
    assert port.capabilities.has("worker-transfer-address") == ("--transfer-address" in text)
    assert port.capabilities.has("worker-checks-manager") == ("--ssl-fingerprint" in text)
