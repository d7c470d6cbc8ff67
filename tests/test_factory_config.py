"""Fast tests of the pools' pure parts: vine_factory command lines and JSON configs, the CLI's
arguments, state files, status summaries, and the manager status protocol against a fake
manager. No HTCondor and no TaskVine process is needed.
"""

from __future__ import annotations

import json
import socket
import threading
from pathlib import Path

import pytest

from datavine.config import ConfigError
from datavine.deploy.pools import (
    FactoryConfig,
    PoolStatus,
    PoolTimeoutError,
    WorkerPool,
    factory_command,
    factory_json,
    query_manager,
)
from datavine.deploy.pools import cli as pool_cli
from datavine.deploy.pools.factory import (
    NO_CATALOG,
    config_from_dict,
    config_to_dict,
    factory_config_text,
)
from datavine.deploy.pools.manager_status import ManagerQueryError, connected_workers
from datavine.deploy.pools.state import (
    PoolState,
    list_states,
    read_state,
    remove_state,
    write_state,
)
from datavine.deploy.vine_auth import AUTH_IDENT, challenge, proof


def option(cmd: list[str], name: str) -> list[str]:
    """Every value given to ``name`` on the command line."""
    return [cmd[i + 1] for i, arg in enumerate(cmd[:-1]) if arg == name]


def test_defaults_keep_no_idle_workers_and_no_external_catalog() -> None:
    cmd = factory_command(FactoryConfig("mgr.example", 9123))
    assert cmd[0] == "vine_factory"
    assert option(cmd, "-T") == ["condor"]
    assert option(cmd, "--min-workers") == ["0"]
    assert option(cmd, "--max-workers") == ["1"]
    assert option(cmd, "--catalog") == [NO_CATALOG]
    assert NO_CATALOG.startswith("127.0.0.1:")
    assert option(cmd, "--timeout") == ["300"], "workers must leave when idle"
    assert cmd[-2:] == ["mgr.example", "9123"], "direct manager address, positional"
    for unwanted in ("-M", "--manager-name", "--password", "--ssl", "--parent-death",
                     "--batch-options"):
        assert unwanted not in cmd


def test_resources_features_rack_password_and_idle_timeout() -> None:
    cfg = FactoryConfig("127.0.0.1", 9000, batch="local", workers=8, min_workers=2, cores=4,
                        memory_mb=8000, disk_mb=20000, features=("gpu", "rack:A"),
                        rack="A", password_file=Path("/run/vine.pw"), ssl=True,
                        idle_timeout_s=120, factory_period_s=2, workers_per_cycle=3,
                        scratch_dir=Path("/scratch/f"))
    cmd = factory_command(cfg, binary="/opt/bin/vine_factory", config_file=Path("/s/f.json"),
                          debug_file=Path("/s/f.debug"), parent_death=True)
    assert cmd[0] == "/opt/bin/vine_factory"
    assert option(cmd, "-T") == ["local"]
    assert (option(cmd, "--min-workers"), option(cmd, "--max-workers")) == (["2"], ["8"])
    assert option(cmd, "--cores") == ["4"]
    assert option(cmd, "--memory") == ["8000"]
    assert option(cmd, "--disk") == ["20000"]
    assert option(cmd, "--feature") == ["gpu", "rack:A"], "rack feature once, in order"
    assert option(cmd, "--password") == ["/run/vine.pw"]
    assert option(cmd, "--timeout") == ["120"]
    assert option(cmd, "--factory-period") == ["2"]
    assert option(cmd, "--workers-per-cycle") == ["3"]
    assert option(cmd, "--scratch-dir") == ["/scratch/f"]
    assert option(cmd, "--config-file") == ["/s/f.json"]
    assert option(cmd, "--debug-file") == ["/s/f.debug"]
    assert "--ssl" in cmd and "--parent-death" in cmd
    assert cmd[-2:] == ["127.0.0.1", "9000"]


def test_extra_condor_submit_lines_use_vine_factorys_newline_escape() -> None:
    cfg = FactoryConfig("h", 1, extra_condor_submit=('+AccountingGroup = "cms"',
                                                     "requirements = (Machine == \"a\")"))
    (opts,) = option(factory_command(cfg), "--batch-options")
    assert opts == '+AccountingGroup = "cms"\\nrequirements = (Machine == "a")'


def test_factory_json_holds_the_rescalable_settings() -> None:
    cfg = FactoryConfig("h", 1, workers=5, min_workers=1, memory_mb=2000, idle_timeout_s=60)
    assert factory_json(cfg) == {"max-workers": 5, "min-workers": 1, "timeout": 60,
                                 "cores": 1, "memory": 2000}
    assert json.loads(factory_config_text(cfg)) == factory_json(cfg)


@pytest.mark.parametrize(("kwargs", "message"), [
    ({"batch": "slurm"}, "batch"),
    ({"manager_port": 0}, "manager_port"),
    ({"manager_host": "two words"}, "manager_host"),
    ({"workers": 0}, "workers"),
    ({"workers": 2, "min_workers": 3}, "min_workers"),
    ({"cores": 0}, "cores"),
    ({"memory_mb": 0}, "memory_mb"),
    ({"idle_timeout_s": 0}, "idle_timeout_s"),
    ({"features": ("has space",)}, "feature"),
    ({"rack": 'A"; rm -rf /'}, "feature"),
    ({"extra_condor_submit": ("a = 1\nqueue 100",)}, "one line"),
    ({"batch": "local", "extra_condor_submit": ("a = 1",)}, "condor"),
])
def test_bad_settings_are_refused_naming_the_setting(kwargs: dict, message: str) -> None:
    args = {"manager_host": "h", "manager_port": 1, **kwargs}
    with pytest.raises(ConfigError, match=message):
        FactoryConfig(**args)


def test_config_round_trips_through_json() -> None:
    cfg = FactoryConfig("h", 7, workers=3, features=("x",), rack="B",
                        password_file=Path("/p"), extra_condor_submit=("a = 1",))
    doc = json.loads(json.dumps(config_to_dict(cfg)))
    assert config_from_dict(doc) == cfg
    with pytest.raises(ConfigError, match="unknown"):
        config_from_dict({**doc, "colour": "red"})


# -- the CLI ----------------------------------------------------------------------------------
class FakePool(WorkerPool):
    """Stands in for a backend: records its config, reports a fixed status."""

    started: list[FakePool] = []

    def __init__(self, config: FactoryConfig, *, name: str, pool_dir: Path) -> None:
        self.config, self.name, self.pool_dir = config, name, pool_dir
        self.pid, self.log_path = 4242, pool_dir / "factory.log"
        self.connected = 0

    def start(self, *, detach: bool = False) -> FakePool:
        assert detach, "the CLI's pool must outlive the command"
        FakePool.started.append(self)
        return self

    def status(self) -> PoolStatus:
        return PoolStatus(self.name, "local", self.config.manager, True, self.connected,
                          {"running": self.connected})


@pytest.fixture
def fake_backend(monkeypatch: pytest.MonkeyPatch) -> type[FakePool]:
    FakePool.started = []
    monkeypatch.setattr(pool_cli, "pool_class", lambda batch: FakePool)
    return FakePool


def test_cli_start_builds_a_pre_started_pool(fake_backend: type[FakePool], tmp_path: Path,
                                             capsys: pytest.CaptureFixture[str]) -> None:
    rc = pool_cli.main(["pool", "start", "--batch", "local", "--workers", "3", "--cores", "2",
                        "--memory", "1500", "--rack", "R1", "--manager", "10.0.0.5:9123",
                        "--password", str(tmp_path / "pw"), "--name", "p1",
                        "--pool-dir", str(tmp_path)])
    assert rc == 0
    (pool,) = fake_backend.started
    cfg = pool.config
    assert (cfg.manager_host, cfg.manager_port, cfg.batch) == ("10.0.0.5", 9123, "local")
    assert (cfg.workers, cfg.min_workers, cfg.cores, cfg.memory_mb) == (3, 3, 2, 1500)
    assert cfg.all_features == ("rack:R1",)
    assert cfg.password_file == (tmp_path / "pw").resolve()
    assert "p1" in capsys.readouterr().out


def test_cli_wait_times_out_naming_manager_and_count(fake_backend: type[FakePool],
                                                     tmp_path: Path,
                                                     capsys: pytest.CaptureFixture[str]) -> None:
    rc = pool_cli.main(["pool", "start", "--workers", "2", "--min-workers", "0", "--manager",
                        "127.0.0.1:9555", "--wait", "--timeout", "0.2", "--pool-dir",
                        str(tmp_path)])
    assert rc == 1
    err = capsys.readouterr().err
    assert "127.0.0.1:9555" in err and "0 of 2" in err and "left running" in err
    assert fake_backend.started[0].config.min_workers == 0


def test_cli_wait_targets_the_pre_started_workers(fake_backend: type[FakePool],
                                                  tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                                  capsys: pytest.CaptureFixture[str]) -> None:
    monkeypatch.setattr(FakePool, "status", lambda self: PoolStatus(
        self.name, "local", self.config.manager, True, 1, {"running": 1}))
    rc = pool_cli.main(["pool", "start", "--workers", "4", "--min-workers", "1", "--manager",
                        "127.0.0.1:9555", "--wait", "--timeout", "1", "--pool-dir",
                        str(tmp_path)])
    assert rc == 0, capsys.readouterr().err


@pytest.mark.parametrize("manager", ["nohost", "host:", ":9123", "host:port"])
def test_cli_rejects_a_bad_manager_address(manager: str) -> None:
    with pytest.raises(SystemExit) as exc:
        pool_cli.main(["pool", "start", "--workers", "1", "--manager", manager])
    assert exc.value.code == 2


def test_cli_status_and_stop_without_pools(tmp_path: Path,
                                           capsys: pytest.CaptureFixture[str]) -> None:
    assert pool_cli.main(["pool", "status", "--pool-dir", str(tmp_path)]) == 0
    assert pool_cli.main(["pool", "stop", "--pool-dir", str(tmp_path)]) == 0
    assert capsys.readouterr().out.count("no pools") == 2


def test_cli_stop_needs_a_name_when_several_pools_run(tmp_path: Path,
                                                      capsys: pytest.CaptureFixture[str]) -> None:
    for name in ("a", "b"):
        write_state(tmp_path, PoolState(name, "local", 1, "h:1", "/s", "/l", 0.0,
                                        config_to_dict(FactoryConfig("h", 1))))
    assert pool_cli.main(["pool", "stop", "--pool-dir", str(tmp_path)]) == 1
    assert "--name" in capsys.readouterr().err


# -- state, status, base class ----------------------------------------------------------------
def test_state_files_round_trip(tmp_path: Path) -> None:
    state = PoolState("p-1", "condor", 123, "h:9", "/scratch", "/scratch/factory.log", 1.5,
                      config_to_dict(FactoryConfig("h", 9)))
    write_state(tmp_path, state)
    assert read_state(tmp_path, "p-1") == state
    assert list_states(tmp_path) == [state]
    remove_state(tmp_path, "p-1")
    assert read_state(tmp_path, "p-1") is None
    with pytest.raises(ConfigError, match="pool name"):
        read_state(tmp_path, "../etc/passwd")


def test_ready_workers_counts_only_this_pools_running_jobs() -> None:
    assert PoolStatus("p", "condor", "h:1", True, 5, {"running": 2, "idle": 1}).ready_workers == 2
    assert PoolStatus("p", "condor", "h:1", True, 1, {"running": 2}).ready_workers == 1
    assert PoolStatus("p", "condor", "h:1", True, 3, None).ready_workers == 3
    unknown = PoolStatus("p", "condor", "h:1", False, None, None, "no manager")
    assert unknown.ready_workers == 0
    assert "? worker(s)" in unknown.summary() and "no manager" in unknown.summary()


def test_base_pool_methods_are_abstract() -> None:
    pool = WorkerPool()
    for method in (pool.start, pool.stop, pool.status):
        with pytest.raises(NotImplementedError):
            method()


def test_wait_for_workers_times_out_with_the_count(tmp_path: Path) -> None:
    pool = FakePool(FactoryConfig("10.1.1.1", 4000), name="w", pool_dir=tmp_path)
    pool.connected = 1
    with pytest.raises(PoolTimeoutError, match=r"only 1 of 3 worker.*10\.1\.1\.1:4000"):
        pool.wait_for_workers(3, timeout_s=0.1, poll_s=0.05)
    assert pool.wait_for_workers(1, timeout_s=0.1).ready_workers == 1


# -- the manager status protocol, against a fake manager --------------------------------------
def fake_manager(password: bytes, answer: list[dict]) -> tuple[int, threading.Thread]:
    """A one-connection server speaking the project's TaskVine password exchange (0012)."""
    server = socket.create_server(("127.0.0.1", 0))
    port = server.getsockname()[1]

    def serve() -> None:
        conn, _ = server.accept()
        with conn, conn.makefile("rwb") as f, server:
            def send(line: bytes) -> None:
                f.write(line + b"\n")
                f.flush()

            send(AUTH_IDENT)
            assert f.readline().strip() == AUTH_IDENT
            mine = challenge()
            send(mine)
            theirs = f.readline().strip()
            if f.readline().strip() != proof(password, "worker", mine, theirs):
                send(b"failure")
                return
            send(proof(password, "manager", mine, theirs))
            if f.readline().strip() != b"ok":
                return
            if f.readline().strip() == b"manager_status":
                send(json.dumps(answer).encode())

    thread = threading.Thread(target=serve, daemon=True)
    thread.start()
    return port, thread


def test_status_query_authenticates_and_reads_the_worker_count(tmp_path: Path) -> None:
    pw = tmp_path / "pw"
    pw.write_bytes(b"s3cret")
    port, thread = fake_manager(b"s3cret", [{"workers": 3, "tasks_waiting": 0}])
    assert connected_workers("127.0.0.1", port, password_file=pw) == 3
    thread.join(5)


def test_status_query_with_the_wrong_password_is_refused(tmp_path: Path) -> None:
    pw = tmp_path / "pw"
    pw.write_bytes(b"wrong")
    port, thread = fake_manager(b"s3cret", [])
    with pytest.raises(ManagerQueryError, match="rejected the password"):
        query_manager("127.0.0.1", port, password_file=pw)
    thread.join(5)


def test_status_query_to_nobody_names_the_address() -> None:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]  # closed again: nothing listens
    with pytest.raises(ManagerQueryError, match=f"127.0.0.1:{port}"):
        connected_workers("127.0.0.1", port, timeout_s=1)


def test_a_local_pool_for_a_loopback_manager_listens_on_loopback_only() -> None:
    from datavine.deploy.pools.cli import local_transfer_address

    assert local_transfer_address("local", "127.0.0.1") == "127.0.0.1"
    assert local_transfer_address("local", "localhost") == "127.0.0.1"
    assert local_transfer_address("local", "mgr.box") is None  # peers on other hosts
    assert local_transfer_address("condor", "127.0.0.1") is None  # where the job lands
    cfg = FactoryConfig("127.0.0.1", 9123, batch="local", transfer_address="127.0.0.1")
    assert cfg.worker_options == "--transfer-address 127.0.0.1"
