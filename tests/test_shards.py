"""The shard map: balance, minimal movement, determinism, failover order, URL rewriting."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections import Counter

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from datavine.io.shards import (
    NoShardAvailableError,
    Shard,
    ShardHealth,
    ShardMap,
    logical_name,
    rewrite_url,
)

shard_names = st.lists(st.from_regex(r"[a-z][a-z0-9-]{0,12}", fullmatch=True), min_size=2,
                       max_size=10, unique=True)
prefixes = st.from_regex(r"/store/[a-zA-Z0-9_/]{0,20}", fullmatch=True)
path_parts = st.from_regex(r"[A-Za-z0-9_.-]{1,16}", fullmatch=True)


def _map(names: list[str], origin: str | None = None) -> ShardMap:
    return ShardMap((Shard(url=f"root://{n}:1094", rack=f"r{i % 2}", name=n)
                     for i, n in enumerate(names)), origin=origin)


def _names(prefix: str, n: int) -> list[str]:
    return [f"{prefix}/file_{i}.root" for i in range(n)]


@settings(max_examples=25, deadline=None)
@given(names=st.lists(st.from_regex(r"[a-z][a-z0-9-]{0,12}", fullmatch=True), min_size=2,
                      max_size=8, unique=True), prefix=prefixes)
def test_balanced_across_shards(names: list[str], prefix: str) -> None:
    n_files = 800 * len(names)
    smap = _map(names)
    counts = Counter(smap.shard_for(f).name for f in _names(prefix, n_files))
    mean = n_files / len(names)
    # ~800 files per shard: a binomial sd of ~28; 20 % is more than 5 sd.
    assert set(counts) == set(names)
    assert all(abs(c - mean) <= 0.2 * mean for c in counts.values()), counts


@settings(max_examples=25, deadline=None)
@given(names=shard_names, new=st.from_regex(r"new-[a-z0-9]{1,6}", fullmatch=True),
       prefix=prefixes)
def test_adding_a_shard_moves_only_its_share_onto_it(names: list[str], new: str,
                                                     prefix: str) -> None:
    files = _names(prefix, 3000)
    before, after = _map(names), _map([*names, new])
    moved = [f for f in files if before.shard_for(f).name != after.shard_for(f).name]
    assert all(after.shard_for(f).name == new for f in moved)
    expected = len(files) / (len(names) + 1)
    assert abs(len(moved) - expected) <= 0.25 * expected + 30, (len(moved), expected)


@settings(max_examples=25, deadline=None)
@given(names=shard_names.filter(lambda n: len(n) >= 3), data=st.data(), prefix=prefixes)
def test_removing_a_shard_moves_only_its_files(names: list[str], data: st.DataObject,
                                               prefix: str) -> None:
    gone = data.draw(st.sampled_from(names))
    files = _names(prefix, 3000)
    before = _map(names)
    after = _map([n for n in names if n != gone])
    for f in files:
        if before.shard_for(f).name != gone:
            assert after.shard_for(f).name == before.shard_for(f).name
        else:  # it goes to its second choice: the failover order was right
            assert after.shard_for(f).name == before.ranked(f)[1].name


@settings(max_examples=50, deadline=None)
@given(names=shard_names, prefix=prefixes, part=path_parts)
def test_ranked_is_a_permutation_led_by_the_owner(names: list[str], prefix: str,
                                                  part: str) -> None:
    smap = _map(names)
    lfn = f"{prefix}/{part}"
    ranked = smap.ranked(lfn)
    assert sorted(s.name for s in ranked) == sorted(names)
    assert ranked[0] == smap.shard_for(lfn)


@settings(max_examples=50, deadline=None)
@given(names=shard_names, prefix=prefixes, part=path_parts,
       host=st.sampled_from(["root://origin:1094", "root://redirector.example:2094",
                             "xroot://other", "http://web:8443", "https://web"]))
def test_same_file_through_any_server_maps_the_same(names: list[str], prefix: str, part: str,
                                                    host: str) -> None:
    smap = _map(names)
    lfn = f"{prefix}/{part}"
    url = f"{host}/{lfn}" if host.startswith(("root", "xroot")) else f"{host}{lfn}"
    assert logical_name(url) == logical_name(lfn)
    assert smap.shard_for(url) == smap.shard_for(lfn)
    rewritten = smap.rewrite(url)
    assert rewritten.startswith(smap.shard_for(lfn).url + "//")
    assert logical_name(rewritten) == logical_name(lfn)


def test_logical_names_and_rewrites() -> None:
    assert logical_name("root://h:1094//store/a.root?svcClass=t") == "/store/a.root"
    assert logical_name("root://h:1094/store//a.root") == "/store/a.root"
    assert logical_name("store/a.root") == "/store/a.root"
    assert rewrite_url("root://o:1//store/a.root?x=1", "root://c:2") == "root://c:2//store/a.root?x=1"
    assert rewrite_url("root://o:1//store/a.root", "http://c:8080") == "http://c:8080/store/a.root"


def test_determinism_across_processes() -> None:
    """The map must not depend on PYTHONHASHSEED: manager and workers compute the same."""
    names = [f"xcache-{i}" for i in range(8)]
    files = _names("/store/data", 200)
    code = ("import json, sys; from datavine.io.shards import Shard, ShardMap; "
            "m = ShardMap(Shard(url='root://'+n, name=n) for n in json.loads(sys.argv[1])); "
            "print(json.dumps([m.shard_for(f).name for f in json.loads(sys.argv[2])]))")
    results = []
    for seed in ("1", "2"):
        env = {**os.environ, "PYTHONHASHSEED": seed}
        out = subprocess.run([sys.executable, "-c", code, json.dumps(names), json.dumps(files)],
                             env=env, capture_output=True, text=True, check=True)
        results.append(json.loads(out.stdout))
    here = [_map(names).shard_for(f).name for f in files]
    assert results[0] == results[1] == here


def test_choose_skips_unhealthy_and_falls_back_to_origin() -> None:
    smap = _map([f"s{i}" for i in range(4)], origin="root://origin:1094")
    health = ShardHealth(cooldown_s=10, max_cooldown_s=40)
    lfn = "/store/x.root"
    ranked = smap.ranked(lfn)
    assert smap.choose(lfn, health, now=0) == ranked[0]
    health.mark_failed(ranked[0], now=0)
    assert smap.choose(lfn, health, now=1) == ranked[1]
    for s in ranked[1:]:
        health.mark_failed(s, now=1)
    chosen = smap.choose(lfn, health, now=2)
    assert chosen.is_origin and chosen.url == "root://origin:1094"
    assert smap.choose(lfn, health, now=10.5) == ranked[0]  # its cool-down is over
    assert health.failed(now=10.5) == sorted(s.name for s in ranked[1:])


def test_in_line_is_the_healthy_shards_in_failover_order_then_the_origin() -> None:
    smap = _map([f"s{i}" for i in range(4)], origin="root://origin:1094")
    health = ShardHealth(cooldown_s=10)
    url = "root://redirector:1094//store/x.root"
    ranked = smap.ranked(url)
    assert [s.name for s in smap.in_line(url, health, now=0)] == [
        *(s.name for s in ranked), "origin"]
    health.mark_failed(ranked[1], now=0)
    assert smap.in_line(url, health, now=1) == [ranked[0], *ranked[2:], smap.origin]
    assert smap.in_line(url, health, now=11) == [*ranked, smap.origin]


def test_a_backup_copy_tries_the_shards_it_avoids_last_but_before_the_origin() -> None:
    smap = _map([f"s{i}" for i in range(4)], origin="root://origin:1094")
    url = "root://redirector:1094//store/x.root"
    ranked = smap.ranked(url)
    line = smap.in_line(url, ShardHealth(), now=0, avoid={ranked[0].name})
    assert line == [*ranked[1:], ranked[0], smap.origin]


def test_cooldown_grows_with_repeated_failures_and_resets_on_success() -> None:
    health = ShardHealth(cooldown_s=10, max_cooldown_s=25)
    assert health.mark_failed("a", now=0) == 10
    assert health.mark_failed("a", now=10) == 30
    assert health.mark_failed("a", now=30) == 55  # capped at 25 s
    assert not health.is_healthy("a", now=54)
    health.mark_ok("a")
    assert health.is_healthy("a", now=54)
    assert health.mark_failed("a", now=60) == 70


def test_no_origin_and_all_down_raises() -> None:
    smap = _map(["a", "b"])
    health = ShardHealth()
    for s in smap.shards:
        health.mark_failed(s, now=0)
    with pytest.raises(NoShardAvailableError, match=r"/f\.root: all 2 shards .*\(a, b\).*no "
                                                    r"origin"):
        smap.choose("/f.root", health, now=1)


def test_invalid_maps_are_refused() -> None:
    with pytest.raises(ValueError, match="at least one"):
        ShardMap([])
    with pytest.raises(ValueError, match="unique"):
        ShardMap([Shard("root://a"), Shard("root://a")])
    with pytest.raises(ValueError, match="reserved"):
        ShardMap([Shard("root://a", name="origin")])
    with pytest.raises(ValueError, match="racks"):
        ShardMap.from_urls(["root://a", "root://b"], racks=["A"])
    smap = ShardMap.from_urls(["root://a", "root://b"], racks=["A", "B"], origin="root://o")
    assert smap.rack_for("/f.root") in {"A", "B"} and len(smap) == 2


def test_weights_split_the_files_in_proportion_and_equal_weights_keep_the_plain_map() -> None:
    lfns = [f"/store/w/{i}.root" for i in range(4000)]
    plain = ShardMap([Shard("root://a:1", name="a"), Shard("root://b:1", name="b")])
    same = ShardMap([Shard("root://a:1", name="a", weight=3.0),
                     Shard("root://b:1", name="b", weight=3.0)])
    assert [plain.shard_for(f).name for f in lfns] == [same.shard_for(f).name for f in lfns]
    weighted = ShardMap([Shard("root://a:1", name="a", weight=1.0),
                         Shard("root://b:1", name="b", weight=3.0)])
    share_b = sum(weighted.shard_for(f).name == "b" for f in lfns) / len(lfns)
    assert 0.72 < share_b < 0.78
    assert all(weighted.ranked(f)[0] == weighted.shard_for(f) for f in lfns[:200])
    with pytest.raises(ValueError, match="weight"):
        Shard("root://c:1", weight=0.0)
