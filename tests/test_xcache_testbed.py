"""Real-server tests: an origin and 4 XCache shards (racks A,A,B,B) on loopback.

The files are split: the first 8 are read through their own shards (cold, then warm), the
last 4 are used by the failover tests, which read through other shards or the origin.
"""

from __future__ import annotations

import os
import re
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from datavine.io.shards import ShardHealth, ShardMap
from datavine.io.source.base import OpenRecord, bytes_requested
from datavine.io.source.handles import open_file
from datavine.io.source.xcache import ShardedSource
from tests.fixtures_xcache import xcache_lfns

pytestmark = pytest.mark.xcache

CACHE_FILES = xcache_lfns()[:8]
FAILOVER_FILES = xcache_lfns()[8:]
BRANCHES = ["Jet_pt", "nJet"]


def _read(url: str, **kwargs: object) -> tuple[dict[str, np.ndarray], int]:
    with open_file(url, **kwargs) as f:
        arrays = f["Events"].arrays(BRANCHES, library="np")
        return arrays, bytes_requested(f)


def _open_on_shards(url: str, smap: ShardMap, health: ShardHealth) -> tuple[Any, OpenRecord]:
    return ShardedSource(smap, health).open(url, open_file)


def _local(data: Path, lfn: str) -> dict[str, np.ndarray]:
    return _read(str(data / lfn.lstrip("/")))[0]


def _same(a: dict[str, np.ndarray], b: dict[str, np.ndarray]) -> bool:
    return all(np.array_equal(a[k], b[k]) for k in BRANCHES)


def test_servers_run_as_real_processes(xcache_testbed) -> None:
    tb = xcache_testbed
    servers = [tb.origin, *tb.shards]
    assert all(s.pid is not None for s in servers)
    assert len({s.port for s in servers}) == len(servers)
    assert [s.rack for s in tb.shards] == ["A", "A", "B", "B"]
    for s in servers:
        assert s.log.exists(), s.log
        assert Path(f"/proc/{s.pid}").exists()
    if os.geteuid() == 0:  # xrootd dropped root: the process belongs to user xrootd
        import pwd

        uid = pwd.getpwnam("xrootd").pw_uid
        assert all(Path(f"/proc/{s.pid}").stat().st_uid == uid for s in servers)


@pytest.fixture(scope="module")
def two_passes(xcache_testbed, xcache_data):
    """Read CACHE_FILES through their shards twice: (map, stats before, stats after,
    bytes uproot requested per file in each pass)."""
    tb = xcache_testbed
    smap = tb.shard_map()
    before = tb.cache_stats()
    requested: list[dict[str, int]] = []
    for done in (1, 2):
        requested.append({})
        for lfn in CACHE_FILES:
            arrays, n = _read(smap.rewrite(tb.origin_url + "/" + lfn))
            assert _same(arrays, _local(xcache_data, lfn)), lfn
            requested[-1][lfn] = n
        # A cache writes a file's access record (.cinfo) when it detaches the closed file:
        # each pass's record is waited for, so that the next pass opens the file again and
        # is counted apart (a loaded machine can detach it late; once in a full run the
        # second pass's record never came within 60 s)
        _wait_for(lambda done=done: all(_accesses(tb.cache_stats(fresh=False), f) == done
                                        for f in CACHE_FILES))
    after = tb.cache_stats()
    return smap, before, after, requested


def _accesses(stats, lfn: str) -> int:
    return sum(files[lfn].accesses for files in stats.shards.values() if lfn in files)


def _wait_for(condition, timeout_s: float = 60.0) -> None:  # a loaded disk delays .cinfo
    deadline = time.monotonic() + timeout_s
    while not condition():
        assert time.monotonic() < deadline, "condition not met in time"
        time.sleep(0.1)


def test_each_file_is_cached_only_in_its_own_shard(two_passes) -> None:
    smap, _, after, _ = two_passes
    shard_of = {s.name: int(s.name.split("-")[1]) for s in smap.shards}
    owners = {lfn: shard_of[smap.shard_for(lfn).name] for lfn in CACHE_FILES}
    assert len(set(owners.values())) >= 3, owners  # the files really are spread
    for lfn, owner in owners.items():
        assert after.holders(lfn) == [owner], (lfn, after.holders(lfn))
        assert after.origin.opens_by_file.get(lfn) == 1, after.origin.opens_by_file
    for i, files in after.shards.items():
        assert all(owners[lfn] == i for lfn in files if lfn in owners)


def test_second_pass_is_served_from_the_caches(xcache_testbed, two_passes) -> None:
    _, before, after, requested = two_passes
    for lfn in CACHE_FILES:
        st = next(files[lfn] for files in after.shards.values() if lfn in files)
        (cold_hit, cold_miss, _), (warm_hit, warm_miss, warm_bypass) = st.history
        assert cold_miss > 0  # the cold pass fetched from the origin
        assert cold_hit + cold_miss == requested[0][lfn]
        assert (warm_hit, warm_miss, warm_bypass) == (requested[1][lfn], 0, 0)  # all hits
    # A third look, now: the origin served nothing more since the two passes.
    tb = xcache_testbed
    for lfn in CACHE_FILES:
        _read(tb.shard_map().rewrite(lfn))
    _wait_for(lambda: all(_accesses(tb.cache_stats(fresh=False), f) == 3 for f in CACHE_FILES))
    now = tb.cache_stats()
    assert now.origin.opens == after.origin.opens
    assert now.origin.read_requests == after.origin.read_requests
    assert now.origin.bytes_out == after.origin.bytes_out
    assert now.origin.opens_by_file == after.origin.opens_by_file
    assert after.origin.opens - before.origin.opens == len(CACHE_FILES)


def test_stopped_shard_fails_over_in_seconds(xcache_testbed, xcache_data) -> None:
    tb = xcache_testbed
    smap: ShardMap = tb.shard_map()
    lfn = FAILOVER_FILES[0]
    owner = smap.shard_for(lfn)
    index = int(owner.name.split("-")[1])
    health = ShardHealth(cooldown_s=30)
    url = tb.origin_url + "/" + lfn
    tb.stop_shard(index)
    try:
        t0 = time.monotonic()
        f, record = _open_on_shards(url, smap, health)
        elapsed = time.monotonic() - t0
        with f:
            arrays = f["Events"].arrays(BRANCHES, library="np")
        assert _same(arrays, _local(xcache_data, lfn))
        # a hang bound, not a speed: with XrdCl's defaults (5 tries in 120 s windows) the
        # open waits minutes; with XRD_CLIENT_ENV (1 try, a 3 s window) seconds at most
        assert elapsed < 30.0, elapsed
        assert record.failovers == 1
        assert record.errors[0][0] == owner.name
        assert record.server == smap.ranked(lfn)[1].name
        assert record.home == owner.name and record.away
        assert not health.is_healthy(owner, time.monotonic())
        # While it cools down, the failed shard is not tried again.
        f2, again = _open_on_shards(url, smap, health)
        f2.close()
        assert again.failovers == 0 and again.server == record.server
    finally:
        tb.start_shard(index)
    # Back in service for this process once XrdCl forgets the broken stream (5 s window).
    deadline = time.monotonic() + 15
    while True:
        try:
            arrays, _ = _read(smap.rewrite(url))
            break
        except OSError:
            if time.monotonic() > deadline:
                raise
            time.sleep(0.5)
    assert _same(arrays, _local(xcache_data, lfn))


def test_hung_shard_fails_over_within_seconds(xcache_testbed, xcache_data) -> None:
    """A shard that accepts connections but never answers (SIGSTOP), not only a dead one."""
    tb = xcache_testbed
    smap = tb.shard_map()
    lfn = FAILOVER_FILES[3]
    owner = smap.shard_for(lfn)
    server = next(s for s in tb.shards if s.name == owner.name)
    health = ShardHealth()
    os.kill(server.pid, signal.SIGSTOP)
    try:
        t0 = time.monotonic()
        f, record = _open_on_shards(tb.origin_url + "/" + lfn, smap, health)
        elapsed = time.monotonic() - t0
    finally:
        os.kill(server.pid, signal.SIGCONT)
    with f:
        assert _same(f["Events"].arrays(BRANCHES, library="np"), _local(xcache_data, lfn))
    assert record.failovers == 1 and record.errors[0][0] == owner.name
    assert elapsed < 20.0, elapsed  # ~4 s on a new connection, ~14 s on an open one


def test_all_shards_down_falls_back_to_the_origin(xcache_testbed, xcache_data) -> None:
    tb = xcache_testbed
    smap = tb.shard_map()
    lfn = FAILOVER_FILES[1]
    health = ShardHealth()
    now = time.monotonic()
    for shard in smap.shards:
        health.mark_failed(shard, now)
    f, record = _open_on_shards(tb.origin_url + "/" + lfn, smap, health)
    with f:
        assert _same(f["Events"].arrays(BRANCHES, library="np"), _local(xcache_data, lfn))
    assert record.via_origin and record.failovers == 0
    assert record.url.startswith(tb.origin_url)


def test_http_on_a_shard_goes_through_its_cache(xcache_testbed, xcache_data) -> None:
    tb = xcache_testbed
    smap = tb.shard_map()
    lfn = FAILOVER_FILES[2]
    owner = smap.shard_for(lfn)
    server = next(s for s in tb.shards if s.name == owner.name)
    arrays, _ = _read(server.http_url + lfn)
    assert _same(arrays, _local(xcache_data, lfn))
    # XrdHttp may open the file once per connection: one access record or more.
    _wait_for(lambda: _accesses(tb.cache_stats(fresh=False), lfn) >= 1)
    assert tb.cache_stats(fresh=False).holders(lfn) == [server.index]


def test_cli_starts_and_stops_on_sigterm(xcache_tools, xcache_data) -> None:
    cmd = [sys.executable, "-m", "datavine.io.xcache.testbed", "--data", str(xcache_data),
           "--shards", "2", "--racks", "A,B"]
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    lines = []
    try:
        assert proc.stdout is not None
        for line in proc.stdout:
            lines.append(line)
            if line.startswith("running"):
                break
        pids = [int(x.split(" pid ")[1].split()[0]) for x in lines if " pid " in x]
        assert len(pids) == 3, lines
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(timeout=20) == 0
    finally:
        if proc.poll() is None:
            proc.kill()
    assert any("xcache-1 root://127.0.0.1:" in x and "rack B" in x for x in lines), lines
    for pid in pids:
        assert not Path(f"/proc/{pid}").exists() or "zombie" in Path(
            f"/proc/{pid}/status").read_text().lower()


def _other_address() -> str | None:
    """An IPv4 address of this host that is not loopback, or None."""
    out = subprocess.run(["ip", "-o", "-4", "addr", "show"], capture_output=True, text=True,
                         timeout=10, check=False).stdout
    found = [a for a in re.findall(r"\binet (\d+\.\d+\.\d+\.\d+)/", out)
             if not a.startswith("127.")]
    return found[0] if found else None


def _query(host: str, port: int) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "XRD_CONNECTIONRETRY": "1", "XRD_CONNECTIONWINDOW": "3",
           "XRD_REQUESTTIMEOUT": "5"}
    return subprocess.run(["xrdfs", f"{host}:{port}", "query", "config", "version"], env=env,
                          capture_output=True, text=True, timeout=30, check=False)


@pytest.mark.skipif(shutil.which("ss") is None, reason="ss (iproute2) is missing")
def test_unmonitored_testbed_opens_no_udp_and_serves_loopback_only(xcache_tools,
                                                                   xcache_data) -> None:
    """``monitor=False`` (what ``datavine run`` starts): no summary reports, so no UDP socket;
    the TCP port is open on every interface (XRootD binds no single address) but a client
    on this host's other address is turned away by ``xrd.allow host localhost``."""
    from datavine.io.xcache.testbed import TestbedError, XCacheTestbed

    with XCacheTestbed(xcache_data, n_shards=1, monitor=False) as tb:
        servers = [tb.origin, *tb.shards]
        for server in servers:
            assert _query("127.0.0.1", server.port).returncode == 0
        other = _other_address()
        if other is not None:
            for server in servers:
                assert _query(other, server.port).returncode != 0
            log = tb.origin.log.read_text(errors="replace")
            # turned away by xrd.allow, not unreachable
            assert re.search(r"Unable to accept TCP connection from \[?(::ffff:)?"
                             + re.escape(other), log), log[-2000:]
        # a monitored server opens its UDP socket with its first report (every second)
        time.sleep(2)
        pids = {str(s.pid) for s in servers}
        udp = subprocess.run(["ss", "-lunpH"], capture_output=True, text=True, timeout=10,
                             check=True).stdout
        assert not [line for line in udp.splitlines()
                    if set(re.findall(r"pid=(\d+)", line)) & pids], udp
        with pytest.raises(TestbedError, match="monitor"):
            tb.cache_stats()


def _xrootd_that_crashes(tmp_path: Path, name: str, times: int) -> dict[str, str]:
    """PATH with an ``xrootd`` that dies of SIGSEGV the first ``times`` starts of the server
    named ``name``, then runs the real one."""
    real = shutil.which("xrootd")
    assert real is not None
    fake = tmp_path / "bin" / "xrootd"
    fake.parent.mkdir()
    fake.write_text(f"""#!/bin/sh
prev=""; name=""
for a in "$@"; do [ "$prev" = "-n" ] && name="$a"; prev="$a"; done
if [ "$name" = "{name}" ]; then
  echo start >> "{tmp_path}/starts"
  if [ "$(wc -l < "{tmp_path}/starts")" -le {times} ]; then kill -SEGV $$; fi
fi
exec "{real}" "$@"
""")
    fake.chmod(0o755)
    return {"PATH": f"{fake.parent}:{os.environ['PATH']}"}


@pytest.mark.parametrize("crashes", [1, 2])
def test_a_shard_that_crashes_at_start_is_started_once_more(
        xcache_tools, xcache_data, tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
        crashes: int) -> None:
    """XRootD died of a signal before answering once in four full test runs: the testbed
    starts such a server once more; a second crash fails the start, naming the server."""
    from datavine.io.xcache.testbed import TestbedError, XCacheTestbed

    for var, value in _xrootd_that_crashes(tmp_path, "xcache-0", crashes).items():
        monkeypatch.setenv(var, value)
    if crashes == 1:
        with XCacheTestbed(xcache_data, n_shards=1) as tb:
            assert tb.shards[0].crashes == 1
            arrays, _ = _read(tb.shard_map().rewrite(tb.origin_url + "/" + CACHE_FILES[0]))
            assert _same(arrays, _local(xcache_data, CACHE_FILES[0]))
    else:
        with pytest.raises(TestbedError, match=r"xcache-0 exited with code -11 at start "
                                               r"\(it crashed 2 times\)"):
            XCacheTestbed(xcache_data, n_shards=1).start()
    assert (tmp_path / "starts").read_text().count("start") == 2
