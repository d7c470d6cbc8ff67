"""XCache shard map: which cache server holds which input file, and where to go when it fails.

Inputs are spread over N XCache servers by rendezvous (highest-random-weight) hashing of each
file's *logical name*: the path part of its URL, so ``root://origin//store/a.root`` and
``root://other-redirector:1094//store/a.root`` land on the same shard. Rendezvous hashing
keeps the map balanced and moves only ~1/N of the files when a shard is added or removed,
and gives every file a full failover order (:meth:`ShardMap.ranked`) for free;
:meth:`ShardMap.in_line` is who to try next for a file, given which shards failed recently
(:class:`ShardHealth`).

The hash is blake2b, never Python's ``hash()``, so every process (manager, workers, tests)
computes the same map. This module is pure: no I/O, no clocks; callers pass ``now``. The
scheduler decides placement with it; the read layer (:mod:`datavine.io.source.xcache`) opens
files with it.
"""

from __future__ import annotations

import hashlib
import math
import re
from collections.abc import Collection, Iterable, Sequence
from dataclasses import dataclass, field
from urllib.parse import urlsplit, urlunsplit

from datavine.errors import DatavineError

ORIGIN_NAME = "origin"


class NoShardAvailableError(DatavineError):
    """Every shard is marked unhealthy and the map has no origin to fall back to."""


@dataclass(frozen=True)
class Shard:
    """One XCache server: ``url`` is its base (``root://host:port``), ``rack`` its location.

    ``name`` is the identity that enters the hash; it defaults to the URL. Give stable names
    (``xcache-3``) where servers may move between hosts without reshuffling the cache.
    """

    url: str
    rack: str | None = None
    name: str = ""
    weight: float = 1.0  # share of the files, relative to the other shards (e.g. its Gbps)

    def __post_init__(self) -> None:
        if not self.name:
            object.__setattr__(self, "name", self.url.rstrip("/"))
        if not (math.isfinite(self.weight) and self.weight > 0):
            raise ValueError(f"shard {self.name}: weight must be > 0, got {self.weight}")

    @property
    def is_origin(self) -> bool:
        return self.name == ORIGIN_NAME


def logical_name(url: str) -> str:
    """The logical file name: the URL's path with repeated slashes collapsed.

    ``root://h:1094//store/x.root?svcClass=t`` -> ``/store/x.root``; a bare path is
    returned normalised the same way.
    """
    if url.startswith("/") and "//" not in url and "?" not in url:
        return url  # one already (as the scheduler asks again and again)
    path = urlsplit(url).path if "://" in url else url.split("?", 1)[0]
    path = re.sub("/+", "/", path)
    return path if path.startswith("/") else "/" + path


def _weight(shard_name: str, lfn: str) -> int:
    digest = hashlib.blake2b(f"{shard_name}\0{lfn}".encode(), digest_size=8).digest()
    return int.from_bytes(digest, "big")


def _weighted_key(shard: Shard, lfn: str) -> tuple[float, str]:
    """Weighted rendezvous hashing: ``weight / -ln(u)``, ``u`` the hash in (0, 1), gives
    each shard a share of the files proportional to its weight (higher is preferred)."""
    v = (2**64 - _weight(shard.name, lfn)) / 2**64  # 1 - u, in (0, 1], exact integers
    return shard.weight / -math.log1p(-v), shard.name


def _plain_key(shard: Shard, lfn: str) -> tuple[int, str]:
    return _weight(shard.name, lfn), shard.name


def rewrite_url(url: str, base: str) -> str:
    """Point ``url`` at the server ``base`` (``root://host:port``), keeping path and query.

    xrootd URLs get the conventional double slash before an absolute path.
    """
    target = urlsplit(base)
    query = urlsplit(url).query if "://" in url else ""
    lfn = logical_name(url)
    path = "/" + lfn if target.scheme in ("root", "roots", "xroot") else lfn
    return urlunsplit((target.scheme, target.netloc, path, query, ""))


@dataclass
class ShardHealth:
    """Which shards failed recently; a failed shard is skipped for ``cooldown_s`` seconds.

    Repeated failures double the cool-down up to ``max_cooldown_s``; a success resets it.
    """

    cooldown_s: float = 30.0
    max_cooldown_s: float = 300.0
    _until: dict[str, float] = field(default_factory=dict, init=False, repr=False)
    _strikes: dict[str, int] = field(default_factory=dict, init=False, repr=False)
    _slow: dict[str, float] = field(default_factory=dict, init=False, repr=False)

    def mark_failed(self, shard: Shard | str, now: float) -> float:
        """Record a failure at ``now``; returns the time until which the shard is skipped."""
        name = shard if isinstance(shard, str) else shard.name
        strikes = self._strikes.get(name, 0) + 1
        self._strikes[name] = strikes
        delay = min(self.cooldown_s * 2 ** (strikes - 1), self.max_cooldown_s)
        self._until[name] = now + delay
        return self._until[name]

    def read_around(self, shard: Shard | str, until: float) -> None:
        """Skip ``shard`` until ``until`` as for a failure, without counting one: it serves,
        slowly (:mod:`datavine.scheduler.shard_pace`)."""
        name = shard if isinstance(shard, str) else shard.name
        self._until[name] = max(self._until.get(name, until), until)
        self._slow[name] = max(self._slow.get(name, until), until)

    def slow(self, now: float) -> list[str]:
        """Names of the shards read around at ``now`` because they are slow (a failed
        shard's readers find out by themselves: :meth:`failed` has both)."""
        return sorted(n for n, t in self._slow.items() if now < t)

    def mark_ok(self, shard: Shard | str) -> None:
        name = shard if isinstance(shard, str) else shard.name
        self._until.pop(name, None)
        self._strikes.pop(name, None)

    def is_healthy(self, shard: Shard | str, now: float) -> bool:
        name = shard if isinstance(shard, str) else shard.name
        return now >= self._until.get(name, float("-inf"))

    def failed(self, now: float) -> list[str]:
        """Names of the shards being skipped at ``now``."""
        return sorted(n for n, t in self._until.items() if now < t)


class ShardMap:
    """Rendezvous-hash map of logical file names onto XCache shards.

    ``origin`` is the server behind the caches (``root://host:port``); reads fall back to it
    when every shard is unhealthy.
    """

    def __init__(self, shards: Iterable[Shard], origin: str | None = None) -> None:
        self.shards: tuple[Shard, ...] = tuple(shards)
        names = [s.name for s in self.shards]
        if not self.shards:
            raise ValueError("ShardMap needs at least one shard")
        if len(set(names)) != len(names):
            raise ValueError(f"shard names must be unique: {names}")
        if ORIGIN_NAME in names:
            raise ValueError(f"{ORIGIN_NAME!r} is reserved for the origin")
        self._names = frozenset(names)
        self.origin: Shard | None = (
            Shard(url=origin, name=ORIGIN_NAME) if origin is not None else None)
        # Equal weights keep the plain hash order (the map of a map without weights).
        self._key = (_weighted_key if len({s.weight for s in self.shards}) > 1
                     else _plain_key)
        self._hashes: list[tuple[hashlib.blake2b, Shard]] | None = None  # see shard_for

    def __getstate__(self) -> dict[str, object]:
        return {**self.__dict__, "_hashes": None}  # hash states do not pickle

    @classmethod
    def from_urls(cls, urls: Sequence[str], racks: Sequence[str | None] | None = None,
                  origin: str | None = None) -> ShardMap:
        racks = list(racks) if racks is not None else [None] * len(urls)
        if len(racks) != len(urls):
            raise ValueError(f"{len(urls)} shard URLs but {len(racks)} racks")
        return cls((Shard(url=u, rack=r) for u, r in zip(urls, racks, strict=True)), origin)

    def __len__(self) -> int:
        return len(self.shards)

    def names(self) -> frozenset[str]:
        """The shards' names (those a read record's ``server`` is when a shard served it)."""
        return self._names

    def ranked(self, lfn_or_url: str) -> list[Shard]:
        """All shards, best first: the failover order for this file."""
        lfn = logical_name(lfn_or_url)
        return sorted(self.shards, key=lambda s: self._key(s, lfn), reverse=True)

    def shard_for(self, lfn_or_url: str) -> Shard:
        """The shard that owns the file when every shard is healthy."""
        lfn = logical_name(lfn_or_url)
        if self._key is _plain_key:  # _plain_key's order, hashing only the file's name
            if self._hashes is None:  # _weight's hash of each shard's name, to go on from
                self._hashes = [(hashlib.blake2b(f"{s.name}\0".encode(), digest_size=8), s)
                                for s in self.shards]
            tail = lfn.encode()
            best, best_key = self.shards[0], (b"", "")
            for start, shard in self._hashes:
                h = start.copy()
                h.update(tail)
                key = (h.digest(), shard.name)  # big-endian bytes order as _weight's ints
                if key > best_key:
                    best, best_key = shard, key
            return best
        return max(self.shards, key=lambda s: self._key(s, lfn))

    def rack_for(self, lfn_or_url: str) -> str | None:
        return self.shard_for(lfn_or_url).rack

    def in_line(self, lfn_or_url: str, health: ShardHealth, now: float,
                avoid: Collection[str] = ()) -> list[Shard]:
        """The servers to try for this file at ``now``, in order: its healthy shards in
        failover order (those named in ``avoid`` last: a backup copy of a straggler reads
        around its first copy's shard), then the origin (when there is one).

        Raises :class:`NoShardAvailableError`, naming the file, when all shards are cooling
        down and there is no origin.
        """
        lfn = logical_name(lfn_or_url)
        line = [s for s in self.ranked(lfn) if health.is_healthy(s, now)]
        if avoid:
            line.sort(key=lambda s: s.name in avoid)  # stable: failover order otherwise
        if self.origin is not None:
            line.append(self.origin)
        if not line:
            raise NoShardAvailableError(
                f"{lfn}: all {len(self.shards)} shards are cooling down after failures "
                f"({', '.join(health.failed(now))}) and no origin is configured")
        return line

    def choose(self, lfn_or_url: str, health: ShardHealth, now: float) -> Shard:
        """The first healthy shard in failover order, else the origin (see :meth:`in_line`)."""
        return self.in_line(lfn_or_url, health, now)[0]

    def rewrite(self, url: str, shard: Shard | None = None) -> str:
        """``url`` pointed at ``shard`` (default: the file's own shard)."""
        return rewrite_url(url, (shard or self.shard_for(url)).url)
