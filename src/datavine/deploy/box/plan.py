"""The box as data: hosts, addresses, links and routes, and the commands that make it.

Pure: no process is started and nothing is read from the machine, so the plan and its
commands are tested as text. Addresses come from 198.18.0.0/15, the range set aside for
benchmarking network devices (RFC 2544), and exist only inside the box's namespaces.

Topology (``R`` racks of ``H`` hosts)::

    mgr.box (198.18.0.2) ── core ──┬── router A ── bridge ── a1.box, a2.box, ...
                                   └── router B ── bridge ── b1.box, b2.box, ...
                 router A ── spine ── router B        (shaped: the inter-rack link)

Every rack router reaches the manager host through the core (unshaped: the manager's and
the origin's traffic is not inter-rack traffic) and the other racks only through the spine,
whose links are shaped to ``link_mbit`` in both directions. The bytes a rack router sends
into the spine are bytes that crossed racks.
"""

from __future__ import annotations

import re
import string
from dataclasses import dataclass, field

DOMAIN = "box"
MANAGER_HOST = "mgr"
_NAME = re.compile(r"^[a-z][a-z0-9]{0,7}$")


class BoxSpecError(ValueError):
    """A box description that cannot be built; the message names the setting."""


@dataclass(frozen=True)
class BoxSpec:
    """What box to build. ``name`` prefixes every namespace (``dv<name>-<host>``), so two
    boxes, or a box and anything else, never share one."""

    name: str = "box"
    racks: int = 2
    hosts_per_rack: int = 2
    link_mbit: float = 200.0
    burst_kb: int = 256
    latency_ms: int = 200  # tbf's queue bound; packets waiting longer are dropped

    def __post_init__(self) -> None:
        if not _NAME.match(self.name):
            raise BoxSpecError(f"BoxSpec.name={self.name!r}: 1-8 lowercase letters or digits, "
                               "starting with a letter")
        if not 1 <= self.racks <= 26:
            raise BoxSpecError(f"BoxSpec.racks={self.racks}: between 1 and 26")
        if not 1 <= self.hosts_per_rack <= 200:
            raise BoxSpecError(f"BoxSpec.hosts_per_rack={self.hosts_per_rack}: between 1 and 200")
        if self.link_mbit <= 0:
            raise BoxSpecError(f"BoxSpec.link_mbit={self.link_mbit}: must be positive")


@dataclass(frozen=True)
class Host:
    """A host of the box: its namespace, its name and address, its rack (None: manager)."""

    name: str  # short name: mgr, a1, b2
    namespace: str
    address: str
    rack: str | None
    gateway: str
    shard: bool = False  # runs its rack's XCache shard

    @property
    def fqdn(self) -> str:
        return f"{self.name}.{DOMAIN}"


@dataclass(frozen=True)
class Router:
    """A router namespace: the core, the spine, or one rack's (with its bridge)."""

    name: str  # core, spine, rA
    namespace: str
    rack: str | None = None
    bridge_address: str | None = None  # rack routers: gateway of the rack's hosts
    routes: tuple[tuple[str, str], ...] = ()  # (destination, via)


@dataclass(frozen=True)
class Veth:
    """A cable: interface ``a_if`` in namespace ``a_ns`` to ``b_if`` in ``b_ns``."""

    a_ns: str
    a_if: str
    a_addr: str | None  # with prefix length, or None (a bridge port)
    b_ns: str
    b_if: str
    b_addr: str | None
    bridge: str | None = None  # b_if is enslaved to this bridge in b_ns
    shaped: bool = False  # tbf on both ends (the spine)


@dataclass(frozen=True)
class BoxPlan:
    """Everything :mod:`.net` makes for a :class:`BoxSpec`."""

    spec: BoxSpec
    hosts: tuple[Host, ...]
    routers: tuple[Router, ...]
    veths: tuple[Veth, ...]
    rack_names: tuple[str, ...] = field(default=())

    @property
    def namespaces(self) -> tuple[str, ...]:
        return tuple(h.namespace for h in self.hosts) + tuple(r.namespace for r in self.routers)

    @property
    def manager(self) -> Host:
        return self.hosts[0]

    def host(self, name: str) -> Host:
        """A host by short name, fully qualified name or address."""
        for h in self.hosts:
            if name in (h.name, h.fqdn, h.address):
                return h
        raise KeyError(f"no host {name!r} in box {self.spec.name!r}; hosts: "
                       f"{', '.join(h.name for h in self.hosts)}")

    def rack_hosts(self, rack: str) -> tuple[Host, ...]:
        return tuple(h for h in self.hosts if h.rack == rack)

    def rack_router(self, rack: str) -> Router:
        for r in self.routers:
            if r.rack == rack:
                return r
        raise KeyError(f"no rack {rack!r} in box {self.spec.name!r}; racks: "
                       f"{', '.join(self.rack_names)}")

    def shard_hosts(self) -> tuple[Host, ...]:
        return tuple(h for h in self.hosts if h.shard)

    def rack_subnet(self, rack: str) -> str:
        return f"198.18.{10 + self.rack_names.index(rack) + 1}.0/24"

    def hosts_file(self, own_address: str, machine_hostname: str) -> str:
        """``/etc/hosts`` of a namespace: every host by name, and the machine's own hostname
        (what a process started without the box's hostname sees) on the namespace's own
        address, so that nothing waits on a lookup of it."""
        lines = ["127.0.0.1\tlocalhost", "::1\tlocalhost ip6-localhost ip6-loopback"]
        lines += [f"{h.address}\t{h.fqdn} {h.name}" for h in self.hosts]
        if machine_hostname and all(machine_hostname not in (h.fqdn, h.name)
                                    for h in self.hosts):
            lines.append(f"{own_address}\t{machine_hostname}")
        return "\n".join(lines) + "\n"


RESOLV_CONF = ("# datavine box: no name server; every name is in /etc/hosts, and a lookup\n"
               "# of any other name fails at once instead of waiting\n"
               "nameserver 127.0.0.1\noptions timeout:1 attempts:1\n")


def rack_names(n: int) -> tuple[str, ...]:
    return tuple(string.ascii_uppercase[:n])


def make_plan(spec: BoxSpec) -> BoxPlan:
    """The hosts, routers and cables of ``spec`` (see the module docstring)."""
    ns = f"dv{spec.name}-"
    racks = rack_names(spec.racks)
    hosts = [Host(MANAGER_HOST, ns + MANAGER_HOST, "198.18.0.2", None, "198.18.0.1")]
    veths = [Veth(ns + MANAGER_HOST, "eth0", "198.18.0.2/24", ns + "core", "mgr",
                  "198.18.0.1/24")]
    core_routes: list[tuple[str, str]] = []
    spine_routes: list[tuple[str, str]] = []
    rack_routers: list[Router] = []
    for k, rack in enumerate(racks, start=1):
        subnet = f"198.18.{10 + k}.0/24"
        gateway = f"198.18.{10 + k}.1"
        router_ns = f"{ns}r{rack}"
        core_link, spine_link = f"198.19.{k}", f"198.19.{100 + k}"
        veths.append(Veth(ns + "core", f"r{rack}", f"{core_link}.1/30", router_ns, "core",
                          f"{core_link}.2/30"))
        veths.append(Veth(ns + "spine", f"r{rack}", f"{spine_link}.1/30", router_ns, "spine",
                          f"{spine_link}.2/30", shaped=True))
        core_routes.append((subnet, f"{core_link}.2"))
        spine_routes.append((subnet, f"{spine_link}.2"))
        routes = [("default", f"{core_link}.1")]
        routes += [(f"198.18.{10 + j}.0/24", f"{spine_link}.1")
                   for j in range(1, spec.racks + 1) if j != k]
        rack_routers.append(Router(f"r{rack}", router_ns, rack, f"{gateway}/24", tuple(routes)))
        for j in range(1, spec.hosts_per_rack + 1):
            name = f"{rack.lower()}{j}"
            address = f"198.18.{10 + k}.{10 + j}"
            hosts.append(Host(name, ns + name, address, rack, gateway, shard=j == 1))
            veths.append(Veth(ns + name, "eth0", f"{address}/24", router_ns, f"h{j}", None,
                              bridge="br0"))
    routers = (Router("core", ns + "core", routes=tuple(core_routes)),
               Router("spine", ns + "spine", routes=tuple(spine_routes)), *rack_routers)
    return BoxPlan(spec, tuple(hosts), routers, tuple(veths), racks)


def _ip(namespace: str, *args: str) -> list[str]:
    return ["ip", "-n", namespace, *args]


def build_commands(plan: BoxPlan) -> list[list[str]]:
    """The ``ip``/``tc``/``sysctl`` commands that make the box, in order (namespaces are
    made first by the caller, with their hosts files)."""
    spec = plan.spec
    cmds: list[list[str]] = []
    for ns in plan.namespaces:
        cmds.append(_ip(ns, "link", "set", "lo", "up"))
    for r in plan.routers:
        cmds.append(["ip", "netns", "exec", r.namespace, "sysctl", "-q", "-w",
                     "net.ipv4.ip_forward=1"])
        if r.bridge_address is not None:
            cmds.append(_ip(r.namespace, "link", "add", "br0", "type", "bridge"))
            cmds.append(_ip(r.namespace, "addr", "add", r.bridge_address, "dev", "br0"))
            cmds.append(_ip(r.namespace, "link", "set", "br0", "up"))
    for v in plan.veths:
        cmds.append(["ip", "link", "add", v.a_if, "netns", v.a_ns, "type", "veth", "peer",
                     "name", v.b_if, "netns", v.b_ns])
        for ns_, if_, addr in ((v.a_ns, v.a_if, v.a_addr), (v.b_ns, v.b_if, v.b_addr)):
            if addr is not None:
                cmds.append(_ip(ns_, "addr", "add", addr, "dev", if_))
        if v.bridge is not None:
            cmds.append(_ip(v.b_ns, "link", "set", v.b_if, "master", v.bridge))
        cmds.append(_ip(v.a_ns, "link", "set", v.a_if, "up"))
        cmds.append(_ip(v.b_ns, "link", "set", v.b_if, "up"))
        if v.shaped:
            for ns_, if_ in ((v.a_ns, v.a_if), (v.b_ns, v.b_if)):
                cmds.append(shape_command(ns_, if_, spec.link_mbit, spec, "add"))
    for h in plan.hosts:
        cmds.append(_ip(h.namespace, "route", "add", "default", "via", h.gateway))
    for r in plan.routers:
        for dest, via in r.routes:
            cmds.append(_ip(r.namespace, "route", "add", dest, "via", via))
    return cmds


def shape_command(namespace: str, interface: str, mbit: float, spec: BoxSpec,
                  verb: str = "change") -> list[str]:
    """``tc`` shaping one interface's egress to ``mbit`` (a token bucket)."""
    return ["tc", "-n", namespace, "qdisc", verb, "dev", interface, "root", "tbf", "rate",
            f"{mbit:g}mbit", "burst", f"{spec.burst_kb}kb", "latency", f"{spec.latency_ms}ms"]


def spine_interfaces(plan: BoxPlan) -> list[tuple[str, str]]:
    """(namespace, interface) of every shaped interface: both ends of each spine link."""
    out = []
    for v in plan.veths:
        if v.shaped:
            out += [(v.a_ns, v.a_if), (v.b_ns, v.b_if)]
    return out


def rack_uplinks(plan: BoxPlan) -> dict[str, tuple[str, str]]:
    """Per rack, (namespace, interface) of its router's end of the spine: what it sends
    there left the rack for another."""
    return {r.rack: (r.namespace, "spine") for r in plan.routers if r.rack is not None}
