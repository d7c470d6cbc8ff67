"""The box on this machine: namespaces made and removed, commands run on its hosts.

The shell around :mod:`.plan`. A box lives in a folder of its own (``box.json`` there
records what was made and started), so ``datavine box down`` from another process, or
after a crash, removes exactly that: the processes started on its hosts (by session id, and
whatever else runs inside its namespaces, which the box made), the namespaces, and the
``/etc/netns/<namespace>`` folders that give each namespace its hosts file.

A command runs on a host as ``ip netns exec NS unshare --uts -- sh -c 'hostname FQDN; exec
"$@"'``: the host's network, its ``/etc/hosts`` and its own hostname (``uname -n``), which
TaskVine workers report to the manager and HTCondor daemons advertise.
"""

from __future__ import annotations

import contextlib
import ipaddress
import json
import os
import shutil
import signal
import subprocess
import time
from collections.abc import Mapping, Sequence
from dataclasses import asdict
from pathlib import Path
from typing import TypedDict

from datavine.deploy.box.plan import (
    RESOLV_CONF,
    BoxPlan,
    BoxSpec,
    build_commands,
    make_plan,
    rack_uplinks,
    shape_command,
    spine_interfaces,
)
from datavine.deploy.sessions import stop_session
from datavine.errors import DatavineError

NETNS_ETC = Path("/etc/netns")
STATE = "box.json"
COMMAND_TIMEOUT_S = 20.0


class BoxError(DatavineError):
    """The box cannot be made, found or used; the message says which host or command."""


class Service(TypedDict):
    """A program started on a host of the box (:meth:`Box.start`)."""

    host: str
    name: str
    pid: int
    log: str


class BoxState(TypedDict):
    """What ``box.json`` records: the spec (``BoxSpec``'s fields), the services started,
    the routes cut (``[namespace, kind, destination]``) and the inter-rack link's rate."""

    spec: dict[str, object]
    services: list[Service]
    cuts: list[list[str]]
    link_mbit: float


class HostStatus(TypedDict):
    name: str  # the host's full name (a1.box)
    address: str
    rack: str | None
    namespace: str
    shard: bool


class BoxStatus(TypedDict):
    """:meth:`Box.status`: what ``datavine box status`` prints."""

    name: str
    dir: str
    up: bool
    hosts: list[HostStatus]
    link_mbit: float
    interrack_bytes: int | None
    cuts: list[list[str]]
    services: list[Service]


def box_missing() -> str | None:
    """Why no box can be made here, or None (root with CAP_NET_ADMIN, ``ip``, ``tc``)."""
    if os.geteuid() != 0:
        return "the box needs root (network namespaces): run as root"
    for tool in ("ip", "tc", "unshare"):
        if shutil.which(tool) is None:
            return f"the box needs '{tool}' (Debian: iproute2 / util-linux)"
    probe = f"dvprobe{os.getpid()}"
    made = subprocess.run(["ip", "netns", "add", probe], capture_output=True, text=True,
                          check=False)
    if made.returncode != 0:
        return f"cannot make a network namespace (no CAP_NET_ADMIN?): {made.stderr.strip()}"
    subprocess.run(["ip", "netns", "delete", probe], capture_output=True, check=False)
    return None


def default_box_dir(name: str = "box") -> Path:
    from datavine.deploy.pools.state import PROJECT_ROOT

    return PROJECT_ROOT / "build" / "box" / name


def _run(argv: Sequence[str], what: str, timeout_s: float = COMMAND_TIMEOUT_S,
         check: bool = True, shown: Sequence[str] | None = None,
         env: Mapping[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    """Run ``argv`` bounded (in ``env``, default this process's environment); a failure
    (with ``check``) names ``what`` and the command (``shown``: the part of it worth
    showing)."""
    command = " ".join(shown if shown is not None else argv)
    try:
        done = subprocess.run(list(argv), capture_output=True, text=True, timeout=timeout_s,
                              check=False, env=env)
    except subprocess.TimeoutExpired as exc:
        raise BoxError(f"{what}: '{command}' did not finish in {timeout_s:.0f} s") from exc
    if check and done.returncode != 0:
        raise BoxError(f"{what}: '{command}' failed ({done.returncode}): "
                       f"{(done.stderr or done.stdout).strip()[-2000:]}")
    return done


def _more_specific(dest: str) -> list[str]:
    """``dest`` as routes that win over the box's own route to it: the two halves of a
    subnet (the longest prefix wins; the same prefix again would be refused), a host as is."""
    net = ipaddress.ip_network(dest, strict=False)
    if net.prefixlen == net.max_prefixlen:
        return [str(net)]
    return [str(half) for half in net.subnets(prefixlen_diff=1)]


def existing_namespaces() -> set[str]:
    out = _run(["ip", "netns", "list"], "listing namespaces", check=False).stdout
    return {line.split()[0] for line in out.splitlines() if line.strip()}


class Box:
    """A box made on this machine (:meth:`up`) or found from its folder (:meth:`load`)."""

    def __init__(self, plan: BoxPlan, directory: Path) -> None:
        self.plan = plan
        self.dir = directory
        self._state: BoxState = {"spec": asdict(plan.spec), "services": [], "cuts": [],
                                 "link_mbit": plan.spec.link_mbit}

    # --- life ---------------------------------------------------------------------------------
    @classmethod
    def up(cls, spec: BoxSpec | None = None, directory: Path | None = None) -> Box:
        """Make the box: namespaces with their hosts files, cables, bridges, routes, the
        shaped spine. A box of the same name still up is taken down first."""
        spec = spec or BoxSpec()
        why = box_missing()
        if why:
            raise BoxError(why)
        directory = Path(directory or default_box_dir(spec.name)).resolve()
        if (directory / STATE).exists():
            cls.load(directory).down()
        plan = make_plan(spec)
        stale = existing_namespaces() & set(plan.namespaces)
        if stale:
            raise BoxError(f"namespaces {', '.join(sorted(stale))} exist but no box folder "
                           f"records them ({directory}); remove them with 'ip netns delete' "
                           "if they are yours, or choose another box name")
        box = cls(plan, directory)
        directory.mkdir(parents=True, exist_ok=True)
        box._save()
        try:
            hostname = os.uname().nodename
            addresses = {h.namespace: h.address for h in plan.hosts}
            for ns in plan.namespaces:
                _run(["ip", "netns", "add", ns], f"making namespace {ns}")
                etc = NETNS_ETC / ns
                etc.mkdir(parents=True, exist_ok=True)
                (etc / "hosts").write_text(plan.hosts_file(addresses.get(ns, "127.0.0.1"),
                                                           hostname))
                (etc / "resolv.conf").write_text(RESOLV_CONF)
            for argv in build_commands(plan):
                _run(argv, "making the box")
        except BaseException:
            box.down()
            raise
        return box

    @classmethod
    def load(cls, directory: Path | None = None, name: str = "box") -> Box:
        directory = Path(directory or default_box_dir(name)).resolve()
        try:
            state = json.loads((directory / STATE).read_text())
        except FileNotFoundError:
            raise BoxError(f"no box in {directory} (start one: datavine box up)") from None
        box = cls(make_plan(BoxSpec(**state["spec"])), directory)
        box._state = state
        return box

    def down(self) -> dict[str, int]:
        """Stop what runs on the box, remove its namespaces and their /etc/netns folders.
        Returns counts of what was removed."""
        stopped = 0
        for service in self._state.get("services", []):
            stopped += stop_session(int(service["pid"]), grace_s=5.0)
        self._state["services"] = []  # a second down() must not signal reused PIDs
        ours = set(self.plan.namespaces) & existing_namespaces()
        for ns in ours:  # anything else still running inside the box's own namespaces
            stopped += self._kill_namespace_processes(ns)
        for ns in ours:
            _run(["ip", "netns", "delete", ns], f"removing namespace {ns}", check=False)
        for ns in self.plan.namespaces:
            shutil.rmtree(NETNS_ETC / ns, ignore_errors=True)
        with contextlib.suppress(FileNotFoundError):
            (self.dir / STATE).unlink()
        return {"namespaces": len(ours), "processes": stopped}

    @staticmethod
    def _kill_namespace_processes(ns: str, grace_s: float = 3.0) -> int:
        def pids() -> list[int]:
            out = _run(["ip", "netns", "pids", ns], f"processes in {ns}", check=False).stdout
            return [int(p) for p in out.split() if p.isdigit()]

        found = pids()
        for sig in (signal.SIGTERM, signal.SIGCONT):
            for pid in found:
                with contextlib.suppress(ProcessLookupError):
                    os.kill(pid, sig)
        deadline = time.monotonic() + grace_s
        while pids() and time.monotonic() < deadline:
            time.sleep(0.05)
        for pid in pids():
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
        return len(found)

    def _save(self) -> None:
        tmp = self.dir / (STATE + ".tmp")
        tmp.write_text(json.dumps(self._state, indent=1))
        tmp.replace(self.dir / STATE)

    def is_up(self) -> bool:
        return set(self.plan.namespaces) <= existing_namespaces()

    # --- running things on hosts -------------------------------------------------------------
    def exec_argv(self, host: str, argv: Sequence[str]) -> list[str]:
        """The command line that runs ``argv`` on ``host`` (its network, hosts file and
        hostname)."""
        h = self.plan.host(host)
        return ["ip", "netns", "exec", h.namespace, "unshare", "--uts", "--", "sh", "-c",
                'hostname "$0" && exec "$@"', h.fqdn, *argv]

    def run(self, host: str, argv: Sequence[str], timeout_s: float = 60.0,
            check: bool = True,
            env: Mapping[str, str] | None = None) -> subprocess.CompletedProcess[str]:
        """Run ``argv`` on ``host`` and wait for it (bounded; in ``env``, default this
        process's environment)."""
        return _run(self.exec_argv(host, argv), f"on {host}", timeout_s, check, shown=argv,
                    env=env)

    def start(self, host: str, argv: Sequence[str], name: str, log: Path | None = None,
              env: dict[str, str] | None = None) -> subprocess.Popen[bytes]:
        """Start a long-running program on ``host`` as a session of its own, recorded so that
        :meth:`down` stops it with all it left behind."""
        log = log or self.dir / "logs" / f"{host}-{name}.log"
        log.parent.mkdir(parents=True, exist_ok=True)
        with open(log, "ab") as out:
            proc = subprocess.Popen(self.exec_argv(host, argv), stdout=out,
                                    stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                                    start_new_session=True, env=env)
        self._state["services"].append({"host": host, "name": name, "pid": proc.pid,
                                        "log": str(log)})
        self._save()
        return proc

    def stop(self, name: str) -> int:
        """Stop the services called ``name`` (all hosts); returns the processes stopped."""
        stopped = 0
        keep: list[Service] = []
        for service in self._state["services"]:
            if service["name"] == name:
                stopped += stop_session(int(service["pid"]), grace_s=5.0)
            else:
                keep.append(service)
        self._state["services"] = keep
        self._save()
        return stopped

    def services(self) -> list[Service]:
        return list(self._state["services"])

    # --- the network: counters, shaping, cuts ------------------------------------------------
    def counters(self, namespace: str, interface: str) -> tuple[int, int]:
        """(rx_bytes, tx_bytes) of one interface, from the kernel."""
        out = _run(["ip", "-n", namespace, "-s", "-j", "link", "show", "dev", interface],
                   f"counters of {interface} in {namespace}").stdout
        stats = json.loads(out)[0]["stats64"]
        return int(stats["rx"]["bytes"]), int(stats["tx"]["bytes"])

    def interrack_bytes(self) -> int:
        """Bytes that left a rack for another so far: the sum over racks of what each rack's
        router sent into the spine."""
        return sum(self.counters(ns, ifname)[1] for ns, ifname in rack_uplinks(self.plan).values())

    def interrack_by_rack(self) -> dict[str, int]:
        return {rack: self.counters(ns, ifname)[1]
                for rack, (ns, ifname) in rack_uplinks(self.plan).items()}

    @property
    def link_mbit(self) -> float:
        return float(self._state.get("link_mbit", self.plan.spec.link_mbit))

    def shape(self, mbit: float) -> None:
        """Reshape the inter-rack link (every spine interface) to ``mbit``, live."""
        for ns, ifname in spine_interfaces(self.plan):
            _run(shape_command(ns, ifname, mbit, self.plan.spec, "change"),
                 f"shaping {ifname} in {ns}")
        self._state["link_mbit"] = mbit
        self._save()

    def _route(self, verb: str, namespace: str, kind: str, dest: str) -> None:
        _run(["ip", "-n", namespace, "route", verb, kind, dest], f"route {verb} {kind} {dest}")

    def cut(self, namespace: str, dest: str, kind: str = "blackhole") -> None:
        """Make ``dest`` (a prefix) unreachable from ``namespace``: ``blackhole`` drops
        silently (a firewall's DROP: senders time out), ``prohibit`` refuses at once."""
        if kind not in ("blackhole", "prohibit", "unreachable"):
            raise BoxError(f"cut kind {kind!r}: one of blackhole, prohibit, unreachable")
        for part in _more_specific(dest):
            self._route("add", namespace, kind, part)
            self._state["cuts"].append([namespace, kind, part])
        self._save()

    def cut_racks(self, kind: str = "blackhole") -> None:
        """Racks can no longer reach each other (the manager host still reaches all)."""
        for rack in self.plan.rack_names:
            router = self.plan.rack_router(rack)
            for other in self.plan.rack_names:
                if other != rack:
                    self.cut(router.namespace, self.plan.rack_subnet(other), kind)

    def cut_rack_from_manager(self, rack: str, kind: str = "blackhole") -> None:
        """``rack`` and the manager host can no longer reach each other."""
        mgr = self.plan.manager
        self.cut(self.plan.rack_router(rack).namespace, f"{mgr.address}/32", kind)
        core = next(r for r in self.plan.routers if r.name == "core")
        self.cut(core.namespace, self.plan.rack_subnet(rack), kind)

    def cut_host(self, host: str, kind: str = "blackhole") -> None:
        """Nobody else reaches ``host`` (its own rack included): a host gone dark."""
        target = self.plan.host(host)
        for h in self.plan.hosts:
            if h.name != target.name:
                self.cut(h.namespace, f"{target.address}/32", kind)

    def restore(self) -> int:
        """Undo every cut; returns how many routes were removed."""
        undone = 0
        for ns, kind, dest in self._state["cuts"]:
            with contextlib.suppress(BoxError):
                self._route("del", ns, kind, dest)
                undone += 1
        self._state["cuts"] = []
        self._save()
        return undone

    def status(self) -> BoxStatus:
        present = existing_namespaces()
        return {
            "name": self.plan.spec.name,
            "dir": str(self.dir),
            "up": set(self.plan.namespaces) <= present,
            "hosts": [{"name": h.fqdn, "address": h.address, "rack": h.rack,
                       "namespace": h.namespace, "shard": h.shard} for h in self.plan.hosts],
            "link_mbit": self.link_mbit,
            "interrack_bytes": self.interrack_bytes() if self.is_up() else None,
            "cuts": list(self._state["cuts"]),
            "services": self.services(),
        }
