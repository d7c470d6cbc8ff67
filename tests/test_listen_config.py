"""Fast tests of where things listen and whom they accept (no TaskVine, no xrootd process):
the manager's listening address, local workers' transfer address, the pools' catalog and
their workers' options, the facility file's ``[manager]`` keys, and the XCache servers'
allow rules and report destination."""

from __future__ import annotations

import os
import socket
from pathlib import Path

import pytest

from datavine.config import ConfigError, LocalWorkersConfig, ManagerConfig
from datavine.deploy.facility import FacilityError, PoolSettings, load_facility
from datavine.deploy.local_workers import worker_command
from datavine.deploy.pools.factory import NO_CATALOG, FactoryConfig, factory_command, is_host_port
from datavine.errors import ManagerStartError
from datavine.io.xcache.config import ServerPaths, origin_config, shard_config
from datavine.io.xcache.stats import SummaryListener
from datavine.manager.listen import (
    ENV_LISTEN,
    contact_host,
    listen_address,
    listening_on,
)


# --- the manager -------------------------------------------------------------------------------
def test_manager_listens_on_loopback_by_default() -> None:
    cfg = ManagerConfig()
    assert cfg.listen_host == "127.0.0.1" and not cfg.listens_everywhere
    assert listen_address(cfg) == "127.0.0.1"
    assert contact_host(listen_address(cfg)) == "127.0.0.1"


@pytest.mark.parametrize("host", ["0.0.0.0", "::", "*"])
def test_every_interface_is_spelled_three_ways(host: str) -> None:
    cfg = ManagerConfig(listen_host=host)
    assert cfg.listens_everywhere and listen_address(cfg) is None
    assert contact_host(None) == "127.0.0.1"  # local workers then come in on loopback


def test_a_listen_host_name_is_resolved_to_its_address() -> None:
    assert listen_address(ManagerConfig(listen_host="localhost")) in ("127.0.0.1", "::1")
    assert listen_address(ManagerConfig(listen_host="192.0.2.10")) == "192.0.2.10"


def test_a_listen_host_that_does_not_resolve_is_named() -> None:
    with pytest.raises(ManagerStartError, match=r"no-such-host\.invalid.*listen_host"):
        listen_address(ManagerConfig(listen_host="no-such-host.invalid"))


@pytest.mark.parametrize("host", ["", "a b", "host\n"])
def test_listen_host_must_be_a_host(host: str) -> None:
    with pytest.raises(ConfigError, match="listen_host"):
        ManagerConfig(listen_host=host)


def test_listen_address_is_in_the_environment_only_while_the_manager_starts(
        monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv(ENV_LISTEN, raising=False)
    with listening_on("127.0.0.1"):
        assert os.environ[ENV_LISTEN] == "127.0.0.1"
    assert ENV_LISTEN not in os.environ
    monkeypatch.setenv(ENV_LISTEN, "10.0.0.1")  # set by the user: put back afterwards
    with listening_on(None):
        assert ENV_LISTEN not in os.environ
    assert os.environ[ENV_LISTEN] == "10.0.0.1"


# --- local workers ------------------------------------------------------------------------------
def test_local_worker_binds_its_transfer_server_where_asked(tmp_path: Path) -> None:
    cfg = LocalWorkersConfig(workers=1)
    cmd = worker_command(cfg, 9123, tmp_path, password_file=None, ssl=False,
                         transfer_address="127.0.0.1", binary="vine_worker")
    assert cmd[:3] == ["vine_worker", "127.0.0.1", "9123"]
    assert cmd[cmd.index("--transfer-address") + 1] == "127.0.0.1"
    bare = worker_command(cfg, 9123, tmp_path, password_file=None, ssl=False,
                          binary="vine_worker")
    assert "--transfer-address" not in bare  # every interface: a build without the option


# --- pools --------------------------------------------------------------------------------------
def test_catalog_is_loopback_by_default_and_configurable() -> None:
    cfg = FactoryConfig("mgr.box", 9123)
    assert cfg.catalog == NO_CATALOG and NO_CATALOG.startswith("127.0.0.1:")
    cmd = factory_command(FactoryConfig("mgr.box", 9123, catalog="catalog.box:9097"))
    assert cmd[cmd.index("--catalog") + 1] == "catalog.box:9097"


@pytest.mark.parametrize("text,ok", [("127.0.0.1:9097", True), ("catalog.box:9097", True),
                                     ("[::1]:9097", True), ("catalog.box", False),
                                     (":9097", False), ("a b:9097", False),
                                     ("host:0", False), ("host:x", False)])
def test_host_port(text: str, ok: bool) -> None:
    assert is_host_port(text) is ok


def test_a_bad_catalog_is_refused() -> None:
    with pytest.raises(ConfigError, match="catalog"):
        FactoryConfig("mgr.box", 9123, catalog="nowhere")


def test_pool_workers_get_their_transfer_address_through_the_factory() -> None:
    cmd = factory_command(FactoryConfig("127.0.0.1", 9123, batch="local",
                                        transfer_address="127.0.0.1"))
    assert cmd[cmd.index("--extra-options") + 1] == "--transfer-address 127.0.0.1"
    assert "--extra-options" not in factory_command(FactoryConfig("127.0.0.1", 9123))


def test_only_local_pools_bind_their_workers_to_the_managers_address() -> None:
    local = PoolSettings("here", batch="local").factory_config(
        "127.0.0.1", 9123, transfer_address="127.0.0.1", catalog="c.box:9097")
    condor = PoolSettings("there", batch="condor").factory_config(
        "mgr.box", 9123, transfer_address="198.18.0.2")
    assert local.transfer_address == "127.0.0.1" and local.catalog == "c.box:9097"
    assert condor.transfer_address is None  # workers on other hosts listen on theirs


# --- the facility file --------------------------------------------------------------------------
def _facility(tmp_path: Path, manager: str) -> Path:
    path = tmp_path / "site.toml"
    path.write_text("[manager]\n" + manager)
    return path


def test_facility_manager_listens_where_it_is_reached_by_default(tmp_path: Path) -> None:
    f = load_facility(_facility(tmp_path, 'host = "mgr.box"\n'))
    assert f.manager_host == "mgr.box" and f.manager.listen_host == "mgr.box"
    assert f.catalog == NO_CATALOG
    default = load_facility(_facility(tmp_path, "port = 9123\n"))
    assert default.manager_host == "127.0.0.1" and default.manager.listen_host == "127.0.0.1"


def test_facility_names_the_listening_address_and_catalog(tmp_path: Path) -> None:
    f = load_facility(_facility(tmp_path, 'host = "mgr.box"\nlisten_host = "198.18.0.2"\n'
                                          'catalog = "mgr.box:9097"\n'))
    assert f.manager.listen_host == "198.18.0.2" and f.catalog == "mgr.box:9097"
    everywhere = load_facility(_facility(tmp_path, 'listen_host = "0.0.0.0"\n'))
    assert everywhere.manager.listens_everywhere


@pytest.mark.parametrize("line,key", [('catalog = "mgr.box"', "manager.catalog"),
                                      ('listen_host = ""', "manager.listen_host"),
                                      ('listen = "198.18.0.2"', "manager.listen")])
def test_facility_refuses_bad_listening_settings(tmp_path: Path, line: str, key: str) -> None:
    with pytest.raises(FacilityError, match=key):
        load_facility(_facility(tmp_path, line + "\n"))


# --- XCache servers ------------------------------------------------------------------------------
def test_xrootd_allows_the_given_hosts_and_reports_to_the_given_host(tmp_path: Path) -> None:
    paths = ServerPaths(tmp_path / "o", "origin")
    text = origin_config(tmp_path, 1094, paths, report_port=9931, allow_hosts=("*.box",),
                         report_host="198.18.0.2")
    assert "xrd.allow host *.box" in text and "xrd.allow host localhost" not in text
    assert "xrd.report 198.18.0.2:9931 " in text
    shard = shard_config(1094, 1095, paths, report_port=9931, report_host="::1")
    assert "xrd.allow host localhost" in shard and "xrd.report [::1]:9931 " in shard
    assert "xrd.report" not in shard_config(1094, 1095, paths)  # no reports unless asked


def test_summary_listener_binds_its_host_only() -> None:
    listener = SummaryListener()
    try:
        assert listener.host == "127.0.0.1"
        assert listener._sock.getsockname()[0] == "127.0.0.1"
        with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
            s.sendto(b"<statistics ins='x'/>", ("127.0.0.1", listener.port))
        assert listener.latest(["x"], fresh=False, timeout_s=5)["x"].name == "x"
    finally:
        listener.close()
