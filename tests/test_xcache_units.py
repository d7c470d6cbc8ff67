"""XCache pieces that need no server: config text, statistics parsing, the read layer's
choice of way, failover and accounting (with fake openers)."""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path
from types import SimpleNamespace

import pytest

from datavine.io import reading
from datavine.io.shards import NoShardAvailableError, Shard, ShardHealth, ShardMap
from datavine.io.source.base import InputUnavailableError, OpenRecord, bytes_requested
from datavine.io.source.local import LocalSource
from datavine.io.source.xcache import ShardedSource
from datavine.io.source.xrootd import DirectSource, configure_xrootd_client
from datavine.io.xcache.config import ServerPaths, origin_config, shard_config
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


def _at(now: float):
    return lambda: now


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

    handle, rec = ShardedSource(smap, health, clock=_at(100.0)).open(
        "root://origin:1//store/x.root", fake_open)
    assert tried == order[:3]
    assert handle == f"root://{order[2]}:1//store/x.root"
    assert (rec.server, rec.failovers, rec.lfn, rec.home) == (order[2], 2, lfn, order[0])
    assert rec.away
    assert [e[0] for e in rec.errors] == order[:2]
    assert rec.rack == next(s.rack for s in smap.shards if s.name == order[2])
    assert not health.is_healthy(order[0], 101.0) and health.is_healthy(order[2], 101.0)

    down.add(order[2])
    tried.clear()
    handle, rec = ShardedSource(smap, health, clock=_at(101.0)).open(lfn, fake_open)
    assert tried == [order[2], "origin"] and rec.via_origin and rec.failovers == 1

    # once the cool-downs are over, the home shard serves again and is marked healthy
    down.clear()
    tried.clear()
    _, rec = ShardedSource(smap, health, clock=_at(1000.0)).open(lfn, fake_open)
    assert tried == [order[0]] and rec.server == order[0] and not rec.away
    assert health.failed(1000.0) == []


def test_failover_gives_up_with_every_attempt_named() -> None:
    def broken(url: str) -> None:
        raise TimeoutError("socket timeout")

    with pytest.raises(InputUnavailableError, match=r"cannot open /f\.root: .*origin: "
                                                    r"TimeoutError") as err:
        ShardedSource(_map(), ShardHealth(), clock=_at(0.0)).open("/f.root", broken)
    assert [name for name, _ in err.value.attempts][-1] == "origin"
    assert len(err.value.attempts) == 4


def test_no_shard_and_no_origin_names_the_file_and_the_shards() -> None:
    smap = ShardMap(Shard(f"root://s{i}:1", name=f"s{i}") for i in range(2))
    health = ShardHealth()
    for shard in smap.shards:
        health.mark_failed(shard, 0.0)
    with pytest.raises(NoShardAvailableError, match=r"/store/f.root: .*\(s0, s1\)"):
        ShardedSource(smap, health, clock=_at(1.0)).open("root://o//store/f.root", str)


def test_non_io_errors_are_not_failovers() -> None:
    def buggy(url: str) -> None:
        raise KeyError("Events")

    health = ShardHealth()
    with pytest.raises(KeyError):
        ShardedSource(_map(), health, clock=_at(0.0)).open("/f.root", buggy)
    assert health.failed(now=0.0) == []


def test_one_server_ways_open_as_given_and_raise_the_openers_error() -> None:
    handle, rec = LocalSource().open("/data//a.root", lambda url, **kw: (url, kw), mode="r")
    assert handle == ("/data//a.root", {"mode": "r"})
    assert (rec.server, rec.lfn, rec.rack, rec.failovers, rec.away) == (
        "local", "/data/a.root", None, 0, False)
    _, rec = DirectSource().open("root://h:1//store/a.root", str)
    assert (rec.server, rec.url) == ("direct", "root://h:1//store/a.root")

    def missing(url: str) -> None:
        raise FileNotFoundError(url)

    with pytest.raises(FileNotFoundError, match=r"/nowhere\.root"):
        LocalSource().open("/nowhere.root", missing)


def test_the_way_follows_the_url_and_the_shard_map() -> None:
    smap = _map()
    assert isinstance(reading.source_for("/data/a.root", smap), LocalSource)
    assert isinstance(reading.source_for("root://h//a.root", None), DirectSource)
    way = reading.source_for("root://h//a.root", smap)
    assert isinstance(way, ShardedSource) and way.shardmap is smap
    assert way.health is reading.shard_health()  # one per process, across bundles


def _sized(url: str, **options: object) -> SimpleNamespace:
    """A fake handle whose source was asked for as many bytes as its URL has characters."""
    return SimpleNamespace(url=url, source=SimpleNamespace(num_requested_bytes=len(url)))


def test_reads_in_a_bundle_are_recorded_with_their_bytes(monkeypatch) -> None:
    smap = _map()
    lfn = "/store/x.root"
    home = smap.shard_for(lfn)
    monkeypatch.setattr(reading, "_health", ShardHealth())
    assert reading.current() is None
    with reading.reading(smap) as ctx:
        assert reading.current() is ctx
        reading.open_served("/data/a.root", opener=_sized)
        handle, served = reading.open_served("root://origin:1/" + lfn, opener=_sized)
        reading.open_served("root://other:1//b.root", shardmap=None, opener=_sized)
    assert reading.current() is None
    assert handle.url == smap.rewrite(lfn, home) and served.server == home.name
    assert [(r.lfn, r.server, r.rack, r.bytes) for r in ctx.records()] == [
        ("/data/a.root", "local", None, len("/data/a.root")),
        (lfn, home.name, home.rack, len(handle.url)),
        ("/b.root", smap.shard_for("/b.root").name, smap.shard_for("/b.root").rack,
         len(smap.rewrite("/b.root"))),
    ]
    assert ctx.shards_since(0) == [home.name, smap.shard_for("/b.root").name]
    assert ctx.shards_since(2) == [smap.shard_for("/b.root").name]
    # outside a bundle: nothing recorded, a URL opened as given
    handle, served = reading.open_served("root://other:1//b.root", opener=_sized)
    assert (handle.url, served.server) == ("root://other:1//b.root", "direct")


def test_a_failed_read_cools_its_shards_down_and_counts_as_a_failover(monkeypatch) -> None:
    smap = _map()
    monkeypatch.setattr(reading, "_health", ShardHealth(cooldown_s=30))
    with reading.reading(smap) as ctx:
        reading.open_served("/data/a.root", opener=_sized)
        first = len(ctx.opened)
        _, served = reading.open_served("root://origin:1//store/x.root", opener=_sized)
        ctx.fail_shards_since(first, "OSError: [FATAL] Socket timeout", now=5.0)
    records = ctx.records()
    assert records[0].errors == ()  # the local file is not a shard
    assert records[1].errors == ((served.server, "OSError: [FATAL] Socket timeout"),)
    assert not reading.shard_health().is_healthy(served.server, 6.0)
    assert reading.shard_health().is_healthy(served.server, 36.0)


def test_bytes_requested_from_a_source_file_or_directory() -> None:
    source = SimpleNamespace(num_requested_bytes=1234)
    assert bytes_requested(source) == 1234
    assert bytes_requested(SimpleNamespace(source=source)) == 1234
    assert bytes_requested(SimpleNamespace(file=SimpleNamespace(source=source))) == 1234
    assert bytes_requested(object()) == 0


def test_open_record_away_needs_a_home() -> None:
    rec = OpenRecord("/a", "root://s1//a", "s1", None, 0, (), 0.0)
    assert not rec.away and not rec.via_origin
    assert OpenRecord("/a", "root://o//a", "origin", None, 0, (), 0.0, home="s0").away


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
