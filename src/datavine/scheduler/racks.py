"""Hosts and racks: which rack a host sits in, and when two names are the same host.

A facility says where its hosts are as Hadoop's rack awareness does: a map from each rack to
the hosts in it, as glob patterns on host names (``a*.box``) or addresses (``10.1.1.*``), or
address networks (``10.1.1.0/24``). :class:`RackMap` is that map, read from the facility
file's ``[racks]`` table (:mod:`datavine.deploy.facility`); the topology
(:mod:`datavine.scheduler.topology`) asks it for the rack of each worker that says none itself,
and the facility loader for the rack of each XCache shard given without one.

Host names are compared normalised (:func:`normal_host`): lower case, no trailing dot, no
IPv6 brackets, and a loopback name or address (``localhost``, ``127.0.0.1``, ``::1``) is this
machine, the manager's host (``here``), so that a shard at ``root://localhost:1094`` sits on
the host of the local workers. Pure: the manager passes this machine's name in
(:func:`datavine.manager.listen.local_host`).
"""

from __future__ import annotations

import ipaddress
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from fnmatch import fnmatchcase
from urllib.parse import urlsplit

LOOPBACK_NAMES = frozenset({"localhost", "localhost.localdomain", "localhost6",
                            "ip6-localhost", "ip6-loopback"})


def is_loopback(name: str) -> bool:
    """Whether ``name`` (a host name or an address, normalised or not) is this machine."""
    name = name.strip().strip("[]").rstrip(".").lower()
    if name in LOOPBACK_NAMES:
        return True
    try:
        return ipaddress.ip_address(name).is_loopback
    except ValueError:
        return False


def normal_host(name: str, here: str = "localhost") -> str:
    """``name`` as hosts are compared: lower case, no trailing dot or IPv6 brackets; a
    loopback name or address becomes ``here`` (the manager's host, as the caller knows it)."""
    text = name.strip().strip("[]").rstrip(".").lower()
    if is_loopback(text):
        return here
    return text


def url_host(url: str) -> str | None:
    """The host part of ``url`` (``root://a1.box:1094`` -> ``a1.box``), not normalised; None
    for a URL without one (a bare path, ``file:``)."""
    if "://" not in url:
        return None
    try:
        return urlsplit(url).hostname or None
    except ValueError:
        return None


def address_of(addrport: str | None) -> str | None:
    """The address part of TaskVine's ``addrport`` (``10.0.0.7:9123``, ``[::1]:9123``)."""
    if not addrport:
        return None
    host, sep, port = addrport.rpartition(":")
    if not sep or not port.isdigit():
        return addrport.strip("[]") or None
    return host.strip("[]") or None


def _address(text: str) -> ipaddress.IPv4Address | ipaddress.IPv6Address | None:
    try:
        return ipaddress.ip_address(text)
    except ValueError:
        return None


_Pattern = str | ipaddress.IPv4Network | ipaddress.IPv6Network


def _pattern(pattern: str) -> _Pattern:
    """A checked pattern: an address network (``10.1.1.0/24``) or a lower-case glob."""
    text = pattern.strip()
    if not text or any(c.isspace() for c in text):
        raise ValueError(f"a rack's host pattern must be a name, an address or a glob "
                         f"without spaces, got {pattern!r}")
    if "/" in text:
        try:
            return ipaddress.ip_network(text, strict=False)
        except ValueError as exc:
            raise ValueError(f"{pattern!r} is not an address network (10.1.1.0/24): "
                             f"{exc}") from None
    return text.rstrip(".").lower()


@dataclass(frozen=True)
class RackMap:
    """Racks and the host patterns of each, in the order given; the first rack with a
    pattern that matches one of a host's names (its host name, its address) is its rack.

    Build it with :meth:`of` (``{"A": ["a*.box", "10.1.1.*"], "B": ["10.1.2.0/24"]}``).
    """

    racks: tuple[tuple[str, tuple[str, ...]], ...] = ()
    _compiled: tuple[tuple[str, tuple[_Pattern, ...]], ...] = field(
        default=(), init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        seen: dict[str, str] = {}
        for rack, patterns in self.racks:
            if not isinstance(rack, str) or not rack.strip():
                raise ValueError(f"a rack needs a name, got {rack!r}")
            for pattern in patterns:
                key = str(_pattern(pattern))
                if key in seen and seen[key] != rack:
                    raise ValueError(f"host pattern {pattern!r} is in racks {seen[key]!r} and "
                                     f"{rack!r}: a host sits in one rack")
                seen[key] = rack
        compiled = tuple((rack, tuple(_pattern(p) for p in patterns))
                         for rack, patterns in self.racks)
        object.__setattr__(self, "_compiled", compiled)

    @classmethod
    def of(cls, mapping: Mapping[str, Iterable[str]]) -> RackMap:
        """The map of ``{rack: [pattern, ...]}``, racks in the mapping's order."""
        return cls(tuple((rack, tuple(patterns)) for rack, patterns in mapping.items()))

    @property
    def names(self) -> tuple[str, ...]:
        return tuple(rack for rack, _ in self.racks)

    def __len__(self) -> int:
        return len(self.racks)

    def rack_for(self, *names: str | None) -> str | None:
        """The rack of the host known by ``names`` (host name, address; None skipped), or
        None when no pattern matches any of them. Loopback names are not this machine's
        name here: pass the host's own name too."""
        texts = [n.strip().strip("[]").rstrip(".").lower() for n in names if n]
        addresses = [a for t in texts if (a := _address(t)) is not None]
        for rack, patterns in self._compiled:
            for pattern in patterns:
                if isinstance(pattern, str):
                    if any(fnmatchcase(t, pattern) for t in texts):
                        return rack
                elif any(a.version == pattern.version and a in pattern for a in addresses):
                    return rack
        return None
