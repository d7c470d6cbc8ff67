"""XCache pieces that need no server: config text, statistics parsing, failover logic."""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path
from types import SimpleNamespace

import pytest

from datavine.io.shards import Shard, ShardHealth, ShardMap
from datavine.io.xcache.config import ServerPaths, origin_config, shard_config
from datavine.io.xcache.reader import (
    InputUnavailableError,
    bytes_read,
    configure_xrootd_client,
    open_with_failover,
)
from datavine.io.xcache.stats import parse_cinfo_json, parse_origin_log, parse_summary
from datavine.io.xcache.unix import check_reachable, free_ports

SUMMARY = (
    '<statistics tod="1" ver="v5.5.3" src="vm:2000" tos="1" pgm="xrootd" ins="origin" pid="9">'
    '<stats id="link"><num>1</num><in>885</in><out>3337763</out></stats>'
    '<stats id="xrootd"><num>1</num><ops><open>2</open><rf>0</rf><rd>26</rd><pr>3</pr>'
    '<rv>2</rv><rs>4</rs></ops></stats></statistics>')


def test_shard_config_is_a_caching_proxy_of_the_origin(tmp_path: Path) -> None:
    paths = ServerPaths(tmp_path / "xcache-0", "xcache-0")
    text = shard_config(1111, 2222, paths, blocksize="256k", report_port=3333, http_port=4444)
    for line in ("xrd.port 2222", "xrd.allow host localhost", "ofs.osslib libXrdPss.so",
                 "pss.cachelib libXrdPfc.so", "pss.origin 127.0.0.1:1111", "pfc.ram 1g",
                 "pfc.blocksize 256k", "pfc.prefetch 0", f"oss.localroot {paths.cache}",
                 "xrd.report 127.0.0.1:3333 every 1s all sync",
                 "xrd.protocol XrdHttp:4444 libXrdHttp.so"):
        assert line in text.splitlines(), line
    assert paths.log == tmp_path / "xcache-0" / "xcache-0" / "xrootd.log"
    with pytest.raises(ValueError, match="1g"):
        shard_config(1, 2, paths, ram="512m")


def test_origin_config_exports_read_only_and_traces_opens(tmp_path: Path) -> None:
    text = origin_config(tmp_path / "data", 1111, ServerPaths(tmp_path / "o", "origin"))
    lines = text.splitlines()
    assert "all.export / r/o" in lines and f"oss.localroot {tmp_path / 'data'}" in lines
    assert "ofs.trace open close read" in lines
    assert not any(x.startswith(("xrd.report", "xrd.protocol")) for x in lines)


def test_parse_summary() -> None:
    s = parse_summary(SUMMARY, received=5.0)
    assert (s.name, s.bytes_in, s.bytes_out, s.opens, s.read_requests) == (
        "origin", 885, 3337763, 2, 31)


def test_parse_origin_log() -> None:
    log = "\n".join([
        "261122 20:25:06 1 u19.1:7@[::1] ofs_open: 0-600 fn=/store/a.root",
        "261122 20:25:06 1 u19.1:7@[::1] ofs_read: 131072@0 fn=/store/a.root",
        "261122 20:25:06 1 u19.1:7@[::1] ofs_read: 94208@131072 fn=/store/a.root",
        "261122 20:25:06 1 u19.1:7@[::1] ofs_close: use=1 fn=/store/a.root",
        "261122 20:25:07 1 root.2:20@[::1] ofs_open: 0-600 fn=/b.root",
        "261122 20:25:07 1 root.2:20@[::1] ofs_open: 0-600 fn=/store/a.root"])
    opens, reads = parse_origin_log(log)
    assert opens == {"/store/a.root": 2, "/b.root": 1}
    assert reads == {"/store/a.root": 131072 + 94208}


def test_parse_cinfo_json_sums_accesses(tmp_path: Path) -> None:
    doc = {"accesses": [{"B_bypass": 0, "B_hit": 10, "B_miss": 90},
                        {"B_bypass": 5, "B_hit": 100, "B_miss": 0}],
           "file": str(tmp_path / "store" / "a.root.cinfo"), "file_size": 1000,
           "n_acc_total": 2, "state_complete": "incomplete"}
    st = parse_cinfo_json(json.dumps(doc), tmp_path)
    assert (st.lfn, st.bytes_hit, st.bytes_miss, st.bytes_bypass, st.accesses, st.complete) == (
        "/store/a.root", 110, 90, 5, 2, False)


def _map() -> ShardMap:
    return ShardMap((Shard(f"root://s{i}:1", rack="AB"[i % 2], name=f"s{i}") for i in range(3)),
                    origin="root://origin:1")


def test_failover_tries_shards_in_rank_order_then_origin() -> None:
    smap, health = _map(), ShardHealth(cooldown_s=30)
    lfn = "/store/x.root"
    order = [s.name for s in smap.ranked(lfn)]
    down = set(order[:2])
    tried: list[str] = []

    def fake_open(url: str) -> str:
        host = url.split("//")[1].split(":")[0]
        tried.append(host)
        if host in down:
            raise OSError(f"[FATAL] Connection error {host}")
        return url

    handle, rec = open_with_failover("root://origin:1//store/x.root", smap, health,
                                     open_fn=fake_open, now=100.0)
    assert tried == order[:3]
    assert handle == f"root://{order[2]}:1//store/x.root"
    assert (rec.server, rec.failovers, rec.lfn) == (order[2], 2, lfn)
    assert [e[0] for e in rec.errors] == order[:2]
    assert rec.rack == next(s.rack for s in smap.shards if s.name == order[2])
    assert not health.is_healthy(order[0], 101.0) and health.is_healthy(order[2], 101.0)

    down.add(order[2])
    tried.clear()
    handle, rec = open_with_failover(lfn, smap, health, open_fn=fake_open, now=101.0)
    assert tried == [order[2], "origin"] and rec.via_origin and rec.failovers == 1


def test_failover_gives_up_with_every_attempt_named() -> None:
    def broken(url: str) -> None:
        raise TimeoutError("socket timeout")

    with pytest.raises(InputUnavailableError, match="origin: TimeoutError") as err:
        open_with_failover("/f.root", _map(), ShardHealth(), open_fn=broken, now=0.0)
    assert [name for name, _ in err.value.attempts][-1] == "origin"
    assert len(err.value.attempts) == 4


def test_non_io_errors_are_not_failovers() -> None:
    def buggy(url: str) -> None:
        raise KeyError("Events")

    health = ShardHealth()
    with pytest.raises(KeyError):
        open_with_failover("/f.root", _map(), health, open_fn=buggy, now=0.0)
    assert health.failed(now=0.0) == []


def test_bytes_read_from_file_or_directory() -> None:
    source = SimpleNamespace(num_requested_bytes=1234)
    assert bytes_read(SimpleNamespace(source=source)) == 1234
    assert bytes_read(SimpleNamespace(file=SimpleNamespace(source=source))) == 1234


def test_client_environment_is_set_without_overriding_the_user(monkeypatch) -> None:
    # Keep a live XRootD client of this test session out of it: it would keep the values.
    monkeypatch.delitem(sys.modules, "XRootD.client", raising=False)
    monkeypatch.setenv("XRD_CONNECTIONWINDOW", "7")
    monkeypatch.delenv("XRD_CONNECTIONRETRY", raising=False)
    got = configure_xrootd_client({"XRD_CONNECTIONWINDOW": "3", "XRD_CONNECTIONRETRY": "1"})
    assert got == {"XRD_CONNECTIONWINDOW": "7", "XRD_CONNECTIONRETRY": "1"}
    assert os.environ["XRD_CONNECTIONRETRY"] == "1"


def test_free_ports_are_distinct() -> None:
    ports = free_ports(6)
    assert len(set(ports)) == 6 and all(p > 0 for p in ports)


@pytest.mark.skipif(os.geteuid() != 0, reason="needs root to make a folder others can't enter")
def test_unreachable_folder_is_named(tmp_path: Path) -> None:
    import pwd

    user = next((u for u in ("nobody", "xrootd") if _has_user(u)), None)
    if user is None or pwd.getpwnam(user).pw_uid == 0:
        pytest.skip("no unprivileged user")
    locked = tmp_path / "locked"
    (locked / "data").mkdir(parents=True)
    locked.chmod(0o700)
    with pytest.raises(PermissionError, match=r"cannot enter .*locked"):
        check_reachable(locked / "data", user, need_read=True)


def _has_user(name: str) -> bool:
    import pwd

    try:
        pwd.getpwnam(name)
    except KeyError:
        return False
    return True
