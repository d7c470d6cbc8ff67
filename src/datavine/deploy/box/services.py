"""XCache on the box: the origin on the manager host, one shard per rack on its first host.

Real ``xrootd`` processes (Debian's XRootD), each started on its host through
:meth:`~datavine.deploy.box.net.Box.start` and listening on that host's own address
(every host has its own network, so all use XRootD's port 1094), on IPv4 only (``-I v4``:
over IPv6 a client is seen as ``::ffff:198.18.x.y``, which no hosts file names, so
``xrd.allow`` by name refused every host). They accept clients from
the box's hosts only (``xrd.allow host *.box``), and each shard proxies the origin by name
(``pss.origin mgr.box:1094``). The shard map names shards by rack, so the files each shard
holds do not depend on ports or addresses.
"""

from __future__ import annotations

import os
import pwd
import shutil
import time
from dataclasses import dataclass
from pathlib import Path

from datavine.deploy.box.net import Box, BoxError
from datavine.deploy.box.plan import DOMAIN, Host
from datavine.io.shards import Shard, ShardMap
from datavine.io.xcache.config import ServerPaths, origin_config, shard_config
from datavine.io.xcache.unix import check_reachable

PORT = 1094
SERVICE = "xrootd"
_PROBE_ENV = {"XRD_CONNECTIONRETRY": "1", "XRD_CONNECTIONWINDOW": "2", "XRD_REQUESTTIMEOUT": "5"}


@dataclass(frozen=True)
class BoxServer:
    name: str  # origin, xcache-A
    host: Host
    paths: ServerPaths

    @property
    def url(self) -> str:
        return f"root://{self.host.fqdn}:{PORT}"


def servers(box: Box) -> list[BoxServer]:
    """The origin and the shards of ``box`` (where they run, where their files are)."""
    root = box.dir / "xcache"
    out = [BoxServer("origin", box.plan.manager, ServerPaths(root / "origin", "origin"))]
    for host in box.plan.shard_hosts():
        name = f"xcache-{host.rack}"
        out.append(BoxServer(name, host, ServerPaths(root / name, name)))
    return out


def shard_map(box: Box) -> ShardMap:
    """The clients' map: a shard per rack, by name, falling back to the origin."""
    shards = [Shard(url=s.url, rack=s.host.rack, name=s.name) for s in servers(box)[1:]]
    return ShardMap(shards, origin=servers(box)[0].url)


def start_xcache(box: Box, data_dir: Path, *, blocksize: str = "128k",
                 timeout_s: float = 30.0, user: str = "xrootd") -> ShardMap:
    """Start the origin serving ``data_dir`` and every rack's shard; wait until each answers
    from the manager host (bounded). Returns the shard map."""
    data_dir = data_dir.resolve()
    check_reachable(data_dir, user, need_read=True)
    check_reachable(box.dir, user, need_read=False)
    pw = pwd.getpwnam(user)
    allow = (f"*.{DOMAIN}",)
    origin, *_ = servers(box)
    shutil.rmtree(box.dir / "xcache", ignore_errors=True)  # a previous box's caches and admin
    for server in servers(box):
        p = server.paths
        for d in (p.root, p.admin, p.cache):
            d.mkdir(parents=True, exist_ok=True)
        if server.name == origin.name:
            text = origin_config(data_dir, PORT, p, allow_hosts=allow)
        else:
            text = shard_config(PORT, PORT, p, blocksize=blocksize, allow_hosts=allow,
                                origin_host=origin.host.fqdn)
        p.config.write_text(text)
        for path in [p.root, *p.root.rglob("*")]:
            os.chown(path, pw.pw_uid, pw.pw_gid)
        box.start(server.host.name, ["xrootd", "-c", str(p.config), "-l", str(p.log_arg),
                                     "-n", server.name, "-R", user, "-I", "v4"], name=SERVICE,
                  log=p.root / "stdout.txt")
    for server in servers(box):
        _wait_ready(box, server, timeout_s)
    return shard_map(box)


def _wait_ready(box: Box, server: BoxServer, timeout_s: float) -> None:
    """Until ``server`` answers an xroot query from the manager host (across the box)."""
    deadline = time.monotonic() + timeout_s
    probe = ["env", *(f"{k}={v}" for k, v in _PROBE_ENV.items()), "xrdfs",
             f"{server.host.fqdn}:{PORT}", "query", "config", "version"]
    last = ""
    while time.monotonic() < deadline:
        done = box.run(box.plan.manager.name, probe, timeout_s=15, check=False)
        if done.returncode == 0:
            return
        last = (done.stderr or done.stdout).strip()
        time.sleep(0.2)
    log = server.paths.log
    tail = log.read_text(errors="replace").splitlines()[-10:] if log.exists() else []
    raise BoxError(f"{server.name} on {server.host.fqdn} did not answer within {timeout_s:.0f} s "
                   f"({last}); its log {log}:\n" + "\n".join(tail))


def stop_xcache(box: Box) -> int:
    return box.stop(SERVICE)
