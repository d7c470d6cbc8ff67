"""The box's plan (pure): hosts, addresses, routes, hosts files and the commands, as text."""

from __future__ import annotations

import ipaddress

import pytest
from hypothesis import given
from hypothesis import strategies as st

from datavine.deploy.box.plan import (
    BoxSpec,
    BoxSpecError,
    build_commands,
    make_plan,
    rack_uplinks,
    spine_interfaces,
)


def test_two_racks_of_two_hosts() -> None:
    plan = make_plan(BoxSpec(name="t", racks=2, hosts_per_rack=2, link_mbit=200))
    assert [h.fqdn for h in plan.hosts] == ["mgr.box", "a1.box", "a2.box", "b1.box", "b2.box"]
    assert [h.rack for h in plan.hosts] == [None, "A", "A", "B", "B"]
    assert [h.fqdn for h in plan.shard_hosts()] == ["a1.box", "b1.box"]
    assert plan.host("b2.box").address == "198.18.12.12"
    assert plan.host("198.18.11.11").name == "a1"
    assert set(plan.namespaces) == {"dvt-mgr", "dvt-a1", "dvt-a2", "dvt-b1", "dvt-b2",
                                    "dvt-core", "dvt-spine", "dvt-rA", "dvt-rB"}
    with pytest.raises(KeyError, match=r"no host 'c1'.*mgr, a1"):
        plan.host("c1")


def test_racks_reach_each_other_only_through_the_shaped_spine() -> None:
    plan = make_plan(BoxSpec(name="t", racks=3, hosts_per_rack=1))
    router_a = plan.rack_router("A")
    spine_gw = {via for dest, via in router_a.routes if dest != "default"}
    assert len(spine_gw) == 1  # every other rack through the spine link
    (default,) = [via for dest, via in router_a.routes if dest == "default"]
    assert default != next(iter(spine_gw))  # the manager host through the core, unshaped
    assert all(v.shaped for v in plan.veths if "spine" in (v.a_ns + v.b_ns))
    assert not any(v.shaped for v in plan.veths if "spine" not in (v.a_ns + v.b_ns))
    assert len(spine_interfaces(plan)) == 6
    assert rack_uplinks(plan) == {r: (f"dvt-r{r}", "spine") for r in "ABC"}


def test_commands_shape_the_spine_and_route_every_host() -> None:
    spec = BoxSpec(name="t", racks=2, hosts_per_rack=1, link_mbit=150)
    cmds = [" ".join(c) for c in build_commands(make_plan(spec))]
    tbf = [c for c in cmds if " tbf " in c]
    assert len(tbf) == 4 and all("rate 150mbit" in c for c in tbf)
    assert "ip -n dvt-a1 route add default via 198.18.11.1" in cmds
    assert "ip -n dvt-rA route add 198.18.12.0/24 via 198.19.101.1" in cmds
    assert sum("net.ipv4.ip_forward=1" in c for c in cmds) == 4  # core, spine, rA, rB
    assert all(c.startswith(("ip ", "tc ")) for c in cmds)


def test_hosts_file_names_every_host_and_the_machine() -> None:
    plan = make_plan(BoxSpec(name="t", racks=1, hosts_per_rack=2))
    text = plan.hosts_file("198.18.11.12", "vm")
    assert "198.18.0.2\tmgr.box mgr" in text and "198.18.11.11\ta1.box a1" in text
    assert text.splitlines()[-1] == "198.18.11.12\tvm"


@pytest.mark.parametrize("kwargs, setting", [
    ({"name": "Box"}, "name"), ({"name": "toolongname"}, "name"), ({"racks": 0}, "racks"),
    ({"hosts_per_rack": 0}, "hosts_per_rack"), ({"link_mbit": 0}, "link_mbit")])
def test_bad_specs_name_the_setting(kwargs: dict, setting: str) -> None:
    with pytest.raises(BoxSpecError, match=f"BoxSpec.{setting}"):
        BoxSpec(**kwargs)


@given(st.integers(1, 6), st.integers(1, 12))
def test_addresses_are_unique_and_in_the_benchmarking_range(racks: int, per_rack: int) -> None:
    plan = make_plan(BoxSpec(name="p", racks=racks, hosts_per_rack=per_rack))
    bench = ipaddress.ip_network("198.18.0.0/15")
    # every interface's address (a host's is on its end of its cable)
    addresses = [a.split("/")[0] for v in plan.veths for a in (v.a_addr, v.b_addr) if a]
    addresses += [r.bridge_address.split("/")[0] for r in plan.routers if r.bridge_address]
    assert len(addresses) == len(set(addresses))
    assert all(ipaddress.ip_address(a) in bench for a in addresses)
    assert {h.address for h in plan.hosts} <= set(addresses)
    for h in plan.hosts:  # each host's gateway is on its own subnet
        net = ipaddress.ip_network(f"{h.address}/24", strict=False)
        assert ipaddress.ip_address(h.gateway) in net
    assert len(plan.hosts) == 1 + racks * per_rack
