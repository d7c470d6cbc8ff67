"""A real XCache deployment on loopback: one origin xrootd and N XCache shards.

Every server is a real ``xrootd`` process (Debian's XRootD, ``scripts/install_xcache.sh``)
with its own config file, log, admin folder and (for shards) cache folder under ``workdir``,
on ports chosen at run time, accepting only local clients. xrootd refuses to run as root, so
a root caller starts the servers with ``-R xrootd`` on folders owned by that user.

    with XCacheTestbed("/data", n_shards=4, racks=["A", "A", "B", "B"]) as tb:
        tb.shard_map().rewrite(tb.origin_url + "//f.root")   # -> root://127.0.0.1:PORT//f.root
        tb.stop_shard(1); ...; tb.start_shard(1)
        tb.cache_stats()

Command line: ``python -m datavine.io.xcache.testbed --data DIR --shards 4 --racks A,A,B,B``
starts it, prints the URLs and stops it on Ctrl-C or SIGTERM.

What is open: XRootD (5.5, and its master of 2026) binds every listening socket to the
wildcard address (``XrdNet::Bind`` passes no host to ``XrdNetSocket::Open``) and has no
directive that binds one address, so each server's port is open on every interface and
``xrd.allow`` is what keeps other hosts out: a connection from a host that matches no
``allow_hosts`` pattern is closed at once (default ``localhost``: loopback clients only).
With ``monitor`` (the default), each server also has a send-only UDP socket for its
summary reports (``xrd.report``), which the kernel binds to the wildcard address when it
first sends; ``monitor=False`` sends none (no UDP sockets; :meth:`cache_stats` is then
unavailable). Reports go to ``report_host``, where :class:`SummaryListener` listens.
"""

from __future__ import annotations

import argparse
import importlib.util
import os
import pwd
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from types import TracebackType

from datavine.deploy.reaper import reaper
from datavine.errors import DatavineError
from datavine.io.shards import Shard, ShardMap
from datavine.io.xcache.config import ServerPaths, origin_config, shard_config
from datavine.io.xcache.stats import (
    CacheStats,
    OriginStats,
    SummaryListener,
    parse_origin_log,
    read_cache_dir,
)
from datavine.io.xcache.unix import check_reachable, free_ports, log_tail, terminate

LOOPBACK = "127.0.0.1"
START_CRASHES = 1  # a server killed by a signal while starting is started again this often
# The readiness probe must fail fast while a server is still starting (see reader.py).
_PROBE_ENV = {"XRD_CONNECTIONRETRY": "1", "XRD_CONNECTIONWINDOW": "2", "XRD_REQUESTTIMEOUT": "5"}


def xcache_missing() -> str | None:
    """Why the XCache testbed cannot run here, or None."""
    for tool in ("xrootd", "xrdfs", "xrdpfc_print"):
        if shutil.which(tool) is None:
            return f"{tool} is not installed (bash scripts/install_xcache.sh installs XRootD)"
    for module in ("XRootD", "fsspec_xrootd"):
        if importlib.util.find_spec(module) is None:
            return (f"the Python module {module} is missing (bash scripts/install_xcache.sh "
                    "installs it)")
    if os.geteuid() == 0:
        try:
            pwd.getpwnam("xrootd")
        except KeyError:
            return "the user xrootd is missing (bash scripts/install_xcache.sh creates it)"
    return None


# where a testbed without a ``workdir`` makes its folder (default: the system's temp folder).
# A shard fsyncs a file's statistics (.cinfo) when it detaches the file: on a disk busy with
# other writes that can take tens of seconds (ext4 commits the journal with them), so the
# tests put their testbeds on a tmpfs (tests/conftest.py).
WORKDIR_ENV = "DATAVINE_XCACHE_WORKDIR"


class TestbedError(DatavineError):
    """A server of the testbed did not start or stop as expected; the message names its log."""


@dataclass
class ServerProcess:
    """One running xrootd: origin (``index == -1``) or shard."""

    index: int
    name: str
    port: int
    paths: ServerPaths
    rack: str | None = None
    http_port: int | None = None
    proc: subprocess.Popen[bytes] | None = field(default=None, repr=False)
    crashes: int = 0  # times it died of a signal while starting (see XCacheTestbed._wait_ready)

    @property
    def url(self) -> str:
        return f"root://127.0.0.1:{self.port}"

    @property
    def http_url(self) -> str | None:
        return f"http://127.0.0.1:{self.http_port}" if self.http_port else None

    @property
    def cache_dir(self) -> Path:
        return self.paths.cache

    @property
    def log(self) -> Path:
        return self.paths.log

    @property
    def pid(self) -> int | None:
        return self.proc.pid if self.proc is not None and self.proc.poll() is None else None


class XCacheTestbed:
    """Origin + ``n_shards`` XCache servers on 127.0.0.1; see the module docstring."""

    def __init__(self, data_dir: str | os.PathLike[str], n_shards: int = 4,
                 racks: Sequence[str | None] | None = None,
                 workdir: str | os.PathLike[str] | None = None, blocksize: str = "128k", *,
                 http: bool = False, prefetch: int = 0,
                 ram: str = "1g", user: str = "xrootd", start_timeout_s: float = 30.0,
                 allow_hosts: Sequence[str] = ("localhost",), report_host: str = LOOPBACK,
                 monitor: bool = True) -> None:
        if n_shards < 1:
            raise ValueError("n_shards must be >= 1")
        racks = list(racks) if racks is not None else [None] * n_shards
        if len(racks) != n_shards:
            raise ValueError(f"{n_shards} shards but {len(racks)} racks: {racks}")
        self.data_dir = Path(data_dir).resolve()
        self._racks = racks
        self._workdir_arg = Path(workdir) if workdir is not None else None
        self.workdir: Path | None = None
        self.blocksize, self.http, self.prefetch, self.ram = blocksize, http, prefetch, ram
        self.start_timeout_s = start_timeout_s
        if not allow_hosts:
            raise ValueError("allow_hosts: at least one host pattern (none would let anyone in)")
        self.allow_hosts = tuple(allow_hosts)  # xrd.allow host patterns, e.g. *.box
        self.report_host = report_host  # where summary reports go (a local address)
        self.monitor = monitor
        self._user = user if os.geteuid() == 0 else None
        self._listener: SummaryListener | None = None
        self._keep_workdir = False
        self.origin: ServerProcess | None = None
        self.shards: list[ServerProcess] = []

    def start(self) -> XCacheTestbed:
        for tool in ("xrootd", "xrdfs", "xrdpfc_print"):
            if shutil.which(tool) is None:
                raise TestbedError(f"{tool} not found: run scripts/install_xcache.sh")
        if self._user is not None:
            check_reachable(self.data_dir, self._user, need_read=True)
        if self._workdir_arg is None:
            self.workdir = Path(tempfile.mkdtemp(prefix="datavine-xcache-",
                                                 dir=os.environ.get(WORKDIR_ENV) or None))
            self.workdir.chmod(0o755)
            reaper().add_path(self.workdir)
        else:
            self.workdir = self._workdir_arg.resolve()
            self.workdir.mkdir(parents=True, exist_ok=True)
        if self._user is not None:
            check_reachable(self.workdir, self._user, need_read=False)
        try:
            self._listener = SummaryListener(self.report_host) if self.monitor else None
            n = len(self._racks)
            ports = free_ports((n + 1) * (2 if self.http else 1))
            http_ports = ports[n + 1:] if self.http else [None] * (n + 1)
            self.origin = ServerProcess(-1, "origin", ports[0],
                                        ServerPaths(self.workdir / "origin", "origin"),
                                        http_port=http_ports[0])
            self.shards = [
                ServerProcess(i, f"xcache-{i}", ports[i + 1],
                              ServerPaths(self.workdir / f"xcache-{i}", f"xcache-{i}"),
                              rack=self._racks[i], http_port=http_ports[i + 1])
                for i in range(n)]
            for server in [self.origin, *self.shards]:
                self._write_config(server)
                self._launch(server)
            for server in [self.origin, *self.shards]:
                self._wait_ready(server)
        except BaseException:
            self._keep_workdir = True  # its logs say what went wrong
            self.stop()
            raise
        return self

    def stop(self) -> None:
        """Stop every server (SIGTERM, then SIGKILL after 5 s); idempotent."""
        for server in [*self.shards, *([self.origin] if self.origin else [])]:
            self._terminate(server)
        if self._listener is not None:
            self._listener.close()
            self._listener = None
        if self._workdir_arg is None and self.workdir is not None and not self._keep_workdir:
            shutil.rmtree(self.workdir, ignore_errors=True)
            reaper().remove_path(self.workdir)

    def __enter__(self) -> XCacheTestbed:
        return self.start()

    def __exit__(self, exc_type: type[BaseException] | None, exc: BaseException | None,
                 tb: TracebackType | None) -> None:
        self.stop()

    def stop_shard(self, index: int) -> None:
        self._terminate(self.shards[index])

    @staticmethod
    def _terminate(server: ServerProcess) -> None:
        if server.proc is not None:
            terminate(server.proc)
            reaper().remove_session(server.proc.pid)

    def start_shard(self, index: int) -> None:
        server = self.shards[index]
        if server.pid is None:
            self._launch(server)
            self._wait_ready(server)

    @property
    def origin_url(self) -> str:
        if self.origin is None:
            raise TestbedError("testbed not started")
        return self.origin.url

    def shard_map(self) -> ShardMap:
        """The map clients use: shards named ``xcache-i``, so it does not depend on ports."""
        return ShardMap((Shard(url=s.url, rack=s.rack, name=s.name) for s in self.shards),
                        origin=self.origin_url)

    def cache_stats(self, fresh: bool = True) -> CacheStats:
        """Per-shard, per-file cache statistics and the origin's opens and bytes served.

        With ``fresh``, waits for summary reports sent after this call (about a second).
        """
        if self.origin is None:
            raise TestbedError("testbed not started")
        if self._listener is None:
            raise TestbedError("cache statistics need the summary reports: start the "
                               "testbed with monitor=True")
        names = ["origin", *(s.name for s in self.shards if s.pid is not None)]
        summaries = self._listener.latest(names, fresh=fresh)
        opens, reads = parse_origin_log(self.origin.log.read_text(errors="replace"))
        origin = summaries["origin"]
        return CacheStats(
            shards={s.index: read_cache_dir(s.cache_dir) for s in self.shards},
            origin=OriginStats(opens=origin.opens, read_requests=origin.read_requests,
                               bytes_out=origin.bytes_out, opens_by_file=dict(opens),
                               bytes_read_by_file=dict(reads)),
            shard_bytes_out={s.index: summaries[s.name].bytes_out
                             for s in self.shards if s.name in summaries})

    def _write_config(self, server: ServerProcess) -> None:
        paths = server.paths
        for d in (paths.root, paths.admin, *([paths.cache] if server.index >= 0 else [])):
            d.mkdir(parents=True, exist_ok=True)
        report = self._listener.port if self._listener else None
        allow, report_host = self.allow_hosts, self.report_host
        if server.index < 0:
            text = origin_config(self.data_dir, server.port, paths, report_port=report,
                                 http_port=server.http_port, allow_hosts=allow,
                                 report_host=report_host)
        else:
            assert self.origin is not None
            text = shard_config(self.origin.port, server.port, paths, blocksize=self.blocksize,
                                ram=self.ram, prefetch=self.prefetch, report_port=report,
                                http_port=server.http_port, allow_hosts=allow,
                                report_host=report_host)
        paths.config.write_text(text)
        if self._user is not None:
            pw = pwd.getpwnam(self._user)
            for p in [paths.root, *paths.root.rglob("*")]:
                os.chown(p, pw.pw_uid, pw.pw_gid)

    def _launch(self, server: ServerProcess) -> None:
        cmd = ["xrootd", "-c", str(server.paths.config), "-l", str(server.paths.log_arg),
               "-n", server.name]
        if self._user is not None:
            cmd += ["-R", self._user]
        with open(server.paths.root / "stdout.txt", "ab") as out:
            server.proc = subprocess.Popen(cmd, stdout=out, stderr=subprocess.STDOUT,
                                           stdin=subprocess.DEVNULL, cwd=server.paths.root,
                                           start_new_session=True)
        reaper().add_session(server.proc.pid)  # stopped even if this process is killed

    def _wait_ready(self, server: ServerProcess) -> None:
        """Until the server answers a query over the xroot protocol, bounded."""
        deadline = time.monotonic() + self.start_timeout_s
        env = {**os.environ, **_PROBE_ENV}
        probe = ["xrdfs", f"127.0.0.1:{server.port}", "query", "config", "version"]
        while time.monotonic() < deadline:
            assert server.proc is not None
            code = server.proc.poll()
            if code is not None and code < 0 and server.crashes < START_CRASHES:
                # killed by a signal before it answered: XRootD 5.5.3 segfaulted at start once
                # in four full test runs here, before its log said anything; a refused
                # configuration exits with a code instead, and is not tried again
                server.crashes += 1
                self._launch(server)
                continue
            if code is not None:
                crashed = f" (it crashed {server.crashes + 1} times)" if server.crashes else ""
                raise TestbedError(
                    f"{server.name} exited with code {code} at start{crashed}; see "
                    f"{server.log} and {server.paths.root / 'stdout.txt'}:\n{log_tail(server)}")
            try:
                with socket.create_connection(("127.0.0.1", server.port), timeout=1):
                    pass
                done = subprocess.run(probe, env=env, capture_output=True, timeout=10,
                                      check=False)
                if done.returncode == 0:
                    return
            except (OSError, subprocess.TimeoutExpired):
                pass
            time.sleep(0.1)
        raise TestbedError(f"{server.name} did not answer on port {server.port} within "
                           f"{self.start_timeout_s} s; see {server.log}:\n{log_tail(server)}")


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m datavine.io.xcache.testbed",
                                     description=__doc__.split("\n\n")[0])
    parser.add_argument("--data", required=True, help="folder the origin serves read-only")
    parser.add_argument("--shards", type=int, default=4)
    parser.add_argument("--racks", default="", help="rack of each shard, e.g. A,A,B,B")
    parser.add_argument("--workdir", default=None, help="configs, logs and caches (default: "
                        "a temporary folder, removed at exit)")
    parser.add_argument("--blocksize", default="128k")
    parser.add_argument("--http", action="store_true", help="also serve http:// (XrdHttp)")
    args = parser.parse_args(argv)
    racks = args.racks.split(",") if args.racks else None
    stop = threading.Event()
    for sig in (signal.SIGINT, signal.SIGTERM):
        signal.signal(sig, lambda *_: stop.set())
    with XCacheTestbed(args.data, args.shards, racks, args.workdir, args.blocksize,
                       http=args.http) as tb:
        assert tb.origin is not None
        print(f"origin   {tb.origin.url}  pid {tb.origin.pid}  log {tb.origin.log}")
        for s in tb.shards:
            extra = f"  {s.http_url}" if s.http_url else ""
            print(f"{s.name} {s.url}{extra}  rack {s.rack}  pid {s.pid}  cache {s.cache_dir}")
        print("running; Ctrl-C or SIGTERM stops it", flush=True)
        while not stop.wait(1.0):
            pass
        print("stopping", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
