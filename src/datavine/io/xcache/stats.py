"""Statistics of the testbed's servers, read from what XRootD itself reports.

Three real sources, each for what it does best:

- per file and shard, ``xrdpfc_print -json FILE.cinfo``: bytes served from the cache
  (``B_hit``), fetched from the origin for the request (``B_miss``) or passed through
  (``B_bypass``), summed over the file's accesses. A ``.cinfo`` is brought up to date when
  the cache detaches the file, shortly after the client closes it;
- per server, summary monitoring (``xrd.report``): XML over UDP every second, caught by
  :class:`SummaryListener`; ``link/out`` is the bytes a server sent, ``xrootd/ops`` its
  opens and read requests (read, pgread, readv);
- per file at the origin, its trace log (``ofs.trace open close read``): ``ofs_open`` lines
  count opens per file, ``ofs_read`` lines the bytes the caches fetched (vector reads of
  direct clients are not traced; the summary's ``bytes_out`` covers them).
"""

from __future__ import annotations

import json
import re
import socket
import subprocess
import threading
import time
import xml.etree.ElementTree as ET
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path


@dataclass(frozen=True)
class FileCacheStats:
    """One file in one shard's cache."""

    lfn: str
    bytes_hit: int
    bytes_miss: int
    bytes_bypass: int
    accesses: int
    file_size: int
    complete: bool
    # (B_hit, B_miss, B_bypass) of each access, oldest first (the cache keeps the last 20).
    history: tuple[tuple[int, int, int], ...] = ()


@dataclass(frozen=True)
class ServerSummary:
    """One summary-monitoring record of one server."""

    name: str
    received: float  # time.monotonic() when it arrived
    bytes_in: int = 0
    bytes_out: int = 0
    opens: int = 0
    read_requests: int = 0


@dataclass(frozen=True)
class OriginStats:
    opens: int
    read_requests: int
    bytes_out: int
    opens_by_file: dict[str, int] = field(default_factory=dict)
    bytes_read_by_file: dict[str, int] = field(default_factory=dict)


@dataclass(frozen=True)
class CacheStats:
    """``shards[i][lfn]``: cache statistics of file ``lfn`` in shard ``i``."""

    shards: dict[int, dict[str, FileCacheStats]]
    origin: OriginStats
    shard_bytes_out: dict[int, int] = field(default_factory=dict)

    def holders(self, lfn: str) -> list[int]:
        """The shards whose cache has (part of) ``lfn``."""
        return sorted(i for i, files in self.shards.items() if lfn in files)


def parse_cinfo_json(line: str, cache_dir: Path) -> FileCacheStats:
    """One line of ``xrdpfc_print -json`` output -> the file's summed statistics."""
    doc = json.loads(line)
    accesses = doc.get("accesses", [])
    path = Path(doc["file"])
    lfn = "/" + str(path.relative_to(cache_dir)).removesuffix(".cinfo")
    return FileCacheStats(
        lfn=lfn,
        bytes_hit=sum(a.get("B_hit", 0) for a in accesses),
        bytes_miss=sum(a.get("B_miss", 0) for a in accesses),
        bytes_bypass=sum(a.get("B_bypass", 0) for a in accesses),
        accesses=int(doc.get("n_acc_total", len(accesses))),
        file_size=int(doc.get("file_size", 0)),
        complete=doc.get("state_complete") == "complete",
        history=tuple((a.get("B_hit", 0), a.get("B_miss", 0), a.get("B_bypass", 0))
                      for a in accesses),
    )


def read_cache_dir(cache_dir: Path, tool: str = "xrdpfc_print") -> dict[str, FileCacheStats]:
    """Statistics of every file cached under ``cache_dir``, by logical file name."""
    cinfos = sorted(str(p) for p in cache_dir.rglob("*.cinfo"))
    if not cinfos:
        return {}
    out = subprocess.run([tool, "-json", *cinfos], capture_output=True, text=True,
                         timeout=30, check=False)
    if out.returncode != 0:
        raise RuntimeError(f"{tool} failed on {cache_dir}: {out.stderr.strip()[-500:]}")
    stats = (parse_cinfo_json(x, cache_dir) for x in out.stdout.splitlines() if x.strip())
    return {s.lfn: s for s in stats}


def _int(node: ET.Element | None, path: str) -> int:
    found = node.find(path) if node is not None else None
    return int(found.text or 0) if found is not None else 0


def parse_summary(xml: bytes | str, received: float = 0.0) -> ServerSummary:
    """One ``xrd.report`` packet -> the counters the testbed uses."""
    root = ET.fromstring(xml)
    stats = {s.get("id"): s for s in root.iter("stats") if s.get("id")}
    ops = stats.get("xrootd")
    reads = sum(_int(ops, f"ops/{k}") for k in ("rd", "pr", "rv"))
    return ServerSummary(
        name=root.get("ins", ""), received=received,
        bytes_in=_int(stats.get("link"), "in"), bytes_out=_int(stats.get("link"), "out"),
        opens=_int(ops, "ops/open"), read_requests=reads)


_OPEN = re.compile(r"ofs_open: \S+ fn=(\S+)")
_READ = re.compile(r"ofs_read: (\d+)@\d+ fn=(\S+)")


def parse_origin_log(text: str) -> tuple[Counter[str], Counter[str]]:
    """Opens per file and bytes read per file, from an origin log with ``ofs.trace``."""
    opens: Counter[str] = Counter(m.group(1) for m in _OPEN.finditer(text))
    reads: Counter[str] = Counter()
    for m in _READ.finditer(text):
        reads[m.group(2)] += int(m.group(1))
    return opens, reads


class SummaryListener:
    """Receives ``xrd.report`` packets on a UDP port of ``host`` (a local address; loopback
    by default, never every interface); keeps the latest per server."""

    def __init__(self, host: str = "127.0.0.1") -> None:
        family = socket.AF_INET6 if ":" in host else socket.AF_INET
        self._sock = socket.socket(family, socket.SOCK_DGRAM)
        self._sock.bind((host, 0))
        self.host = host
        self._sock.settimeout(0.2)
        self.port: int = self._sock.getsockname()[1]
        self._latest: dict[str, ServerSummary] = {}
        self._cond = threading.Condition()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="xrd-report", daemon=True)
        self._thread.start()

    def _run(self) -> None:
        while not self._stop.is_set():
            try:
                data = self._sock.recv(65536)
            except TimeoutError:
                continue
            except OSError:
                return
            try:
                summary = parse_summary(data, time.monotonic())
            except ET.ParseError:
                continue
            with self._cond:
                self._latest[summary.name] = summary
                self._cond.notify_all()

    def latest(self, names: list[str], fresh: bool = True,
               timeout_s: float = 5.0) -> dict[str, ServerSummary]:
        """The latest record of each named server; with ``fresh``, one sent after this call."""
        since = time.monotonic() if fresh else float("-inf")

        def ready() -> bool:
            return all(n in self._latest and self._latest[n].received > since for n in names)

        with self._cond:
            if not self._cond.wait_for(ready, timeout_s):
                missing = [n for n in names if n not in self._latest
                           or self._latest[n].received <= since]
                raise TimeoutError(f"no summary report from {missing} within {timeout_s} s")
            return {n: self._latest[n] for n in names}

    def close(self) -> None:
        self._stop.set()
        self._thread.join(timeout=2)
        self._sock.close()
