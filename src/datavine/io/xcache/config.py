"""Configuration text for the testbed's XRootD servers: one origin and N XCache shards.

Pure string building, so the generated files are tested without starting anything. The
directives follow what was measured on XRootD 5.5.3 (shared/FINDINGS.md, XCache section):

- every server accepts only local clients by default (``xrd.allow host localhost``; a
  facility or the box passes its own host patterns). ``xrd.allow`` is the only restriction
  there is: XRootD binds its port on every interface and has no directive for one address
  (``XrdNet::Bind`` always binds the wildcard; ``xrd.network`` sets keep-alives,
  buffers, name lookups and routes, ``-I v4|v6`` the address family: none binds one);
- the origin exports its data read-only and traces opens and reads to its log, and every
  server sends summary statistics (``xrd.report ... sync``) as XML over UDP to a listener of
  the testbed: ``sync`` makes the byte counters of still-open connections current, which
  ``xrdfs query stats`` does not;
- a shard is a caching proxy (``libXrdPss`` + ``libXrdPfc``) with its own cache directory;
  ``pfc.ram`` must be at least 1g, and 128k-256k blocks cache what is read instead of whole
  megabytes around it; prefetching is off by default so that the per-file statistics count
  a cold read as misses and a warm one as hits.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path


@dataclass(frozen=True)
class ServerPaths:
    """Where one server keeps its files; ``root`` is owned by the user the server runs as."""

    root: Path
    name: str

    @property
    def config(self) -> Path:
        return self.root / "xrootd.cfg"

    @property
    def log_arg(self) -> Path:
        """What to pass to ``xrootd -l``."""
        return self.root / "xrootd.log"

    @property
    def log(self) -> Path:
        """Where the log really is: xrootd inserts the instance name (``-n``) as a folder."""
        return self.root / self.name / "xrootd.log"

    @property
    def admin(self) -> Path:
        return self.root / "admin"

    @property
    def cache(self) -> Path:
        return self.root / "cache"


def _common(port: int, paths: ServerPaths, report_port: int | None, report_every_s: int,
            http_port: int | None, allow_hosts: Sequence[str] = ("localhost",),
            report_host: str = "127.0.0.1") -> list[str]:
    if not allow_hosts:
        raise ValueError("allow_hosts: at least one host pattern (an empty list lets anyone in)")
    lines = [
        f"xrd.port {port}",
        *(f"xrd.allow host {pattern}" for pattern in allow_hosts),
        f"all.adminpath {paths.admin}",
        f"all.pidpath {paths.admin}",
    ]
    if report_port is not None:
        host = f"[{report_host}]" if ":" in report_host else report_host
        lines.append(f"xrd.report {host}:{report_port} every {report_every_s}s all sync")
    if http_port is not None:
        lines.append(f"xrd.protocol XrdHttp:{http_port} libXrdHttp.so")
    return lines


def origin_config(data_dir: Path, port: int, paths: ServerPaths, *,
                  report_port: int | None = None, report_every_s: int = 1,
                  http_port: int | None = None, allow_hosts: Sequence[str] = ("localhost",),
                  report_host: str = "127.0.0.1") -> str:
    """The origin: serves ``data_dir`` read-only and logs every open and read.

    ``allow_hosts``: the clients it accepts (XRootD host patterns, e.g. ``*.box``);
    ``report_host``: where its summary statistics go (with ``report_port``)."""
    lines = [
        "# datavine XCache testbed: origin",
        "all.export / r/o",
        f"oss.localroot {data_dir}",
        *_common(port, paths, report_port, report_every_s, http_port, allow_hosts,
                 report_host),
        "ofs.trace open close read",
    ]
    return "\n".join(lines) + "\n"


def shard_config(origin_port: int, port: int, paths: ServerPaths, *, blocksize: str = "128k",
                 ram: str = "1g", prefetch: int = 0, report_port: int | None = None,
                 report_every_s: int = 1, http_port: int | None = None,
                 allow_hosts: Sequence[str] = ("localhost",), report_host: str = "127.0.0.1",
                 origin_host: str = "127.0.0.1") -> str:
    """One XCache shard: a caching proxy of the origin (on ``origin_host``) with its own
    cache directory; ``allow_hosts`` and ``report_host`` as for :func:`origin_config`."""
    if not ram.lower().endswith("g") or float(ram[:-1]) < 1:
        raise ValueError(f"pfc.ram must be >= 1g (XRootD refuses less), got {ram!r}")
    lines = [
        f"# datavine XCache testbed: shard {paths.name}",
        "all.export /",
        *_common(port, paths, report_port, report_every_s, http_port, allow_hosts,
                 report_host),
        "ofs.osslib libXrdPss.so",
        "pss.cachelib libXrdPfc.so",
        f"pss.origin {origin_host}:{origin_port}",
        f"oss.localroot {paths.cache}",
        f"pfc.ram {ram}",
        f"pfc.blocksize {blocksize}",
        f"pfc.prefetch {prefetch}",
    ]
    return "\n".join(lines) + "\n"
