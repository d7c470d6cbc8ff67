"""Hosts and racks (pure): the host-to-rack map of a facility file, and host names compared
normalised (loopback is this machine)."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from datavine.scheduler.racks import (
    RackMap,
    address_of,
    is_loopback,
    normal_host,
    url_host,
)

BOX = RackMap.of({"A": ["a*.box", "10.1.1.*"], "B": ["b*.box", "198.18.12.0/24"]})


def test_globs_on_names_and_addresses_and_networks() -> None:
    assert BOX.rack_for("a1.box") == "A"
    assert BOX.rack_for("B2.Box.") == "B"  # case and a trailing dot do not matter
    assert BOX.rack_for("10.1.1.7") == "A"
    assert BOX.rack_for("198.18.12.11") == "B"  # in the network
    assert BOX.rack_for("198.18.13.11") is None
    assert BOX.rack_for("mgr.box") is None
    assert BOX.rack_for(None, "mgr.box", "10.1.1.9") == "A"  # any of a host's names
    assert BOX.rack_for() is None
    assert BOX.names == ("A", "B") and len(BOX) == 2


def test_first_rack_that_matches_wins() -> None:
    racks = RackMap.of({"A": ["a1.box"], "B": ["*.box"]})
    assert racks.rack_for("a1.box") == "A" and racks.rack_for("a2.box") == "B"


@pytest.mark.parametrize("mapping, problem", [
    ({"A": ["a b"]}, "without spaces"),
    ({"A": [""]}, "without spaces"),
    ({"A": ["10.1.1.0/33"]}, "not an address network"),
    ({"A": ["a1.box"], "B": ["A1.box"]}, "in racks 'A' and 'B'"),
    ({"": ["a1.box"]}, "needs a name"),
])
def test_bad_maps_are_refused(mapping: dict[str, list[str]], problem: str) -> None:
    with pytest.raises(ValueError, match=problem):
        RackMap.of(mapping)


def test_host_names_are_compared_normalised() -> None:
    assert normal_host("A1.Box.", here="m") == "a1.box"
    assert normal_host("[fe80::1]", here="m") == "fe80::1"
    for loop in ("localhost", "LOCALHOST.", "127.0.0.1", "127.8.9.1", "::1", "[::1]"):
        assert is_loopback(loop)
        assert normal_host(loop, here="mgr.box") == "mgr.box"
    assert not is_loopback("a1.box") and not is_loopback("10.0.0.1")
    assert normal_host("localhost") == "localhost"  # pure: loopback is what the caller says
    from datavine.manager.listen import local_host

    assert local_host() == normal_host(local_host()) != "localhost"


def test_url_hosts_and_addresses() -> None:
    assert url_host("root://a1.box:1094") == "a1.box"
    assert url_host("root://[::1]:1094//store/x.root") == "::1"
    assert url_host("/store/x.root") is None
    assert address_of("10.0.0.7:9123") == "10.0.0.7"
    assert address_of("[::1]:9123") == "::1"
    assert address_of("10.0.0.7") == "10.0.0.7"
    assert address_of(None) is None and address_of("") is None


labels = st.text(alphabet="abcdefghijklmnopqrstuvwxyz0123456789-", min_size=1, max_size=8)
hosts = st.lists(labels, min_size=1, max_size=3).map(".".join)
racks = st.dictionaries(st.sampled_from("ABCDEF"), st.lists(hosts, max_size=4, unique=True),
                        min_size=1, max_size=4)


def _unique(mapping: dict[str, list[str]]) -> bool:
    names = [h for hs in mapping.values() for h in hs]
    return len(names) == len(set(names))


@settings(max_examples=200, deadline=None)
@given(mapping=racks.filter(_unique), host=hosts)
def test_a_listed_host_maps_to_its_rack_and_others_to_none_or_a_rack(
        mapping: dict[str, list[str]], host: str) -> None:
    rack_map = RackMap.of(mapping)
    for rack, names in mapping.items():
        for name in names:
            assert rack_map.rack_for(name) == rack
            assert rack_map.rack_for(name.upper() + ".") == rack  # normalised
    found = rack_map.rack_for(host)
    assert found == next((r for r, names in mapping.items() if host in names), None)


@settings(max_examples=200, deadline=None)
@given(mapping=racks.filter(_unique), host=hosts)
def test_a_catch_all_rack_after_the_others_takes_only_the_unlisted(
        mapping: dict[str, list[str]], host: str) -> None:
    rack_map = RackMap.of({**mapping, "Z": ["*"]})
    listed = next((r for r, names in mapping.items() if host in names), None)
    assert rack_map.rack_for(host) == (listed or "Z")
