"""What the TaskVine in use can do for datavine: a capability record, probed once per manager.

datavine runs best on its own TaskVine build (cctools 7.15.9 with the patch series in
``scripts/patches/cctools``, bindings generated with ``swig -threads``), and it runs on
TaskVine as released (conda-forge's ndcctools, a site's build) with less. Each thing the
build adds is a :class:`Capability` (:data:`CAPABILITIES`): what it is, the patch that
brings it, what is lost without it and how to get it back. :class:`Capabilities` is the
record of one TaskVine: which are there (``True``), missing (``False``) or not known yet
(``None``: worker features are seen in the first worker's status), and which of the
bindings' private internals datavine relies on do not hold
(:mod:`datavine.manager.taskvine_internals`). The TaskVine port probes it when its manager
starts (:meth:`datavine.manager.taskvine_port.TaskVinePort.capabilities`); local workers,
pools, ``datavine doctor`` and the run summary's notes consult it, one line per missing
capability (:meth:`Capabilities.lines`).

The probes here read files and the kernel's socket table, never TaskVine itself:
:func:`file_markers` (strings a patch adds to a program or library), :func:`listening_on`.
"""

from __future__ import annotations

import functools
import os
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from pathlib import Path

REBUILD = "build TaskVine with scripts/build_taskvine.sh"


@dataclass(frozen=True)
class Capability:
    """One thing datavine's TaskVine build adds: ``key`` (stable, for code and JSON),
    ``what`` it is, the ``patch`` that brings it, what is ``lost`` without it, and how to
    get it back (``remedy``)."""

    key: str
    what: str
    patch: str
    lost: str
    remedy: str = REBUILD


CAPABILITIES: tuple[Capability, ...] = (
    Capability("worker-features", "worker features in the worker status", "patch 0001",
               "workers' names and racks are unknown until their first result: libraries are "
               "not warmed up by name, the first bundles are placed without racks (a "
               "facility's [racks] still maps hosts) and a lost local worker is noticed by "
               "TaskVine's timeout only"),
    Capability("listen-address", "the listen address",
               "patch 0002, VINE_LISTEN_ADDRESS",
               "the manager listens on every interface, whatever listen_host says"),
    Capability("worker-transfer-address", "vine_worker --transfer-address", "patch 0002",
               "workers' transfer servers (peer transfers) listen on every interface: local "
               "workers and pools run without the option"),
    Capability("worker-checks-manager", "vine_worker --ssl-ca and --ssl-fingerprint",
               "patch 0014",
               "workers cannot check the manager's certificate: local workers connect with TLS "
               "unverified, and a pool that asks for the check (ssl_ca, ssl_fingerprint) does "
               "not start"),
    Capability("gil-released", "the GIL released in Manager.wait", "bindings by swig -threads",
               "every TaskVine call holds the GIL: while the manager waits for a worker, the "
               "live view's feed, the progress bar and result hooks stall"),
    Capability("password-hmac", "the HMAC-SHA256 password exchange", "patch 0012",
               "the password exchange is dttools' sha1 one: a client without the password "
               "reflects the manager's challenge and is let in as a worker, and datavine's "
               "own queries of the manager (a pool's status and its wait for workers) "
               "refuse to speak it"),
    Capability("handshakes-off-loop", "handshakes off the wait loop",
               "patch 0013",
               "each new connection is authenticated inside the wait loop: a silent client "
               "holds every dispatch and result for up to 5 s (with TLS, indefinitely)"),
    Capability("library-queue", "the library call queue", "patch 0015",
               "one call per library at a time (the next is sent once the last result is in, "
               "~6 ms idle per call on each worker), and a cancelled call kills its library"),
    Capability("call-hook", "queued calls announced to the library", "patch 0018",
               "reads are not overlapped with compute: RunConfig.prefetch_mb reads nothing "
               "ahead (a bundle reads its chunk when it starts)"),
    Capability("manager-savings", "the manager's CPU savings", "patches 0003-0010, 0016",
               "the manager's CPU per bundle and when idle grows with the workers (~20% more "
               "idle CPU at 256 workers from the libraries' log round trips alone)"),
)
BY_KEY: dict[str, Capability] = {c.key: c for c in CAPABILITIES}
INTERNALS = Capability("internals", "the bindings' internals datavine uses",
                       "cctools 7.15.9's Python bindings",
                       "datavine cannot drive these bindings",
                       "use cctools 7.15.9 (scripts/build_taskvine.sh) or a datavine that "
                       "knows this TaskVine")


@dataclass
class Capabilities:
    """One TaskVine's record (see the module docstring): ``found`` maps each key of
    :data:`CAPABILITIES` to True, False or None (not known yet); ``broken`` names each
    assumption on the bindings' internals that does not hold, with what was found;
    ``source``: where this TaskVine is (its prefix and, when datavine built it, version
    and patches)."""

    found: dict[str, bool | None]
    broken: dict[str, str] = field(default_factory=dict)
    source: str = ""

    def has(self, key: str) -> bool:
        """Whether capability ``key`` is known to be there."""
        return self.found.get(key) is True

    def missing(self) -> list[Capability]:
        """The capabilities known to be missing, in :data:`CAPABILITIES`' order."""
        return [c for c in CAPABILITIES if self.found.get(c.key) is False]

    def unknown(self) -> list[Capability]:
        return [c for c in CAPABILITIES if self.found.get(c.key) is None]

    def lines(self) -> list[str]:
        """One line per missing capability and per broken internal (pure): what is lost and
        how to get it back."""
        out = [f"TaskVine lacks {c.what} ({c.patch}): {c.lost}; to get it: {c.remedy}"
               for c in self.missing()]
        out += [f"TaskVine's bindings changed: {name} ({problem}): {INTERNALS.lost}; "
                f"to get it: {INTERNALS.remedy}" for name, problem in self.broken.items()]
        return out

    def saw_workers(self, entries: Iterable[object]) -> None:
        """Learn from TaskVine's worker list whether it reports features (patch 0001): a
        worker that reported its resources (which follow its features) and has no
        ``features`` key says it does not."""
        if self.found.get("worker-features") is not None:
            return
        for entry in entries:
            if not isinstance(entry, Mapping) or not entry.get("cores_total"):
                continue
            self.found["worker-features"] = isinstance(entry.get("features"), list)
            return

    def to_dict(self) -> dict[str, object]:
        return {"source": self.source, "found": dict(self.found), "broken": dict(self.broken),
                "missing": self.lines()}


# --- probes: files and the kernel's socket table --------------------------------------------
@functools.lru_cache(maxsize=16)
def _markers_in(path: str, size: int, mtime_ns: int,
                markers: tuple[bytes, ...]) -> frozenset[bytes]:
    data = Path(path).read_bytes()
    return frozenset(m for m in markers if m in data)


def file_markers(path: Path | str | None, markers: Iterable[bytes]) -> frozenset[bytes]:
    """The ``markers`` (byte strings) found in the file ``path``, read once per version of
    the file (empty when it cannot be read)."""
    if path is None:
        return frozenset()
    try:
        st = os.stat(path)
        return _markers_in(str(path), st.st_size, st.st_mtime_ns, tuple(markers))
    except OSError:
        return frozenset()


def _addresses(table: str, port: int, v6: bool) -> set[str]:
    """Local addresses of the LISTEN sockets on ``port`` in a /proc/net/tcp table (pure)."""
    import ipaddress

    found = set()
    for line in table.splitlines()[1:]:
        fields = line.split()
        if len(fields) < 4 or fields[3] != "0A":  # 0A: LISTEN
            continue
        hex_addr, _, hex_port = fields[1].partition(":")
        if int(hex_port, 16) != port:
            continue
        raw = bytes.fromhex(hex_addr)
        # the kernel prints each 32-bit word in host (little-endian) order
        raw = b"".join(raw[i:i + 4][::-1] for i in range(0, len(raw), 4))
        addr = ipaddress.IPv6Address(raw) if v6 else ipaddress.IPv4Address(raw)
        mapped = addr.ipv4_mapped if isinstance(addr, ipaddress.IPv6Address) else None
        found.add(str(mapped or addr))
    return found


def listening_on(port: int) -> set[str] | None:
    """The local addresses a listener on TCP ``port`` is bound to (``0.0.0.0`` / ``::``:
    every interface), from this network namespace's socket table; None where there is no
    such table (not Linux)."""
    found: set[str] = set()
    seen = False
    for name, v6 in (("tcp", False), ("tcp6", True)):
        try:
            table = Path(f"/proc/self/net/{name}").read_text()
        except OSError:
            continue
        seen = True
        found |= _addresses(table, port, v6)
    return found if seen else None


def listen_honoured(asked: str | None, bound: set[str] | None) -> bool | None:
    """Whether a manager asked to listen on ``asked`` (None: every interface, which tells
    nothing) is bound there only (pure); None when that cannot be told."""
    if asked is None or not bound:
        return None
    return bound == {asked}
