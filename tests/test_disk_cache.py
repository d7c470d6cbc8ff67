"""The worker's disk cache of input bytes (issue 30, item 3): the store and the uproot source.

Real ROOT files written with uproot, read through :class:`DiskCachedSource` in front of
uproot's own source for a local file (the same code sits in front of ``XRootDSource`` on a
worker; ``test_disk_cache_xcache.py`` runs it there): a hit is the cold read's arrays, a
changed file is not served from disk, the bound holds, and a cache file that is short or
corrupt is a miss.
"""

from __future__ import annotations

import os
from pathlib import Path

import numpy as np
import pytest
import uproot

from datavine.apps.testbed import write_small_tree
from datavine.config import RunConfig
from datavine.errors import ConfigError
from datavine.io import disk_cache
from datavine.io.disk_cache import DiskCache
from datavine.io.source.base import bytes_from_disk, bytes_requested
from datavine.io.source.disk import DiskCachedSource, header_identity
from datavine.io.source.handles import open_file
from datavine.scheduler.summary import RunSummary

BRANCHES = ["Jet_pt", "nJet", "event"]
HEADER = 403  # uproot's first read of a file (begin_chunk_size): always from the server


def read(path: Path, cache: DiskCache, entry_stop: int | None = None,
         ) -> tuple[dict[str, np.ndarray], int, int]:
    """The arrays of ``path`` read through ``cache``; bytes from the server, from the disk."""
    with open_file(str(path), wrap=lambda s: DiskCachedSource(s, cache),
                   handler=uproot.source.file.MemmapSource) as f:
        arrays = f["Events"].arrays(BRANCHES, entry_stop=entry_stop, library="np")
        return arrays, bytes_requested(f), bytes_from_disk(f)


def cold(path: Path) -> dict[str, np.ndarray]:
    with uproot.open(path) as f:
        return f["Events"].arrays(BRANCHES, library="np")


def equal(a: dict[str, np.ndarray], b: dict[str, np.ndarray]) -> bool:
    return a.keys() == b.keys() and all(np.array_equal(a[k], b[k]) for k in a)


@pytest.fixture()
def root_file(tmp_path: Path) -> Path:
    path = tmp_path / "data" / "events.root"
    write_small_tree(path, seed=1, n_events=40_000)
    return path


def test_a_hit_is_identical_to_a_cold_read(root_file: Path, tmp_path: Path) -> None:
    cache = DiskCache(tmp_path / "cache", 64 * disk_cache.MB)
    first, network, disk = read(root_file, cache)
    assert equal(first, cold(root_file)) and disk == 0 and network > HEADER
    assert cache.stats.stored > 4 and cache.held_bytes() > network - HEADER
    second, network2, disk2 = read(root_file, cache)
    assert equal(second, first)
    assert network2 == HEADER  # the header alone: which file this is
    assert disk2 == network - HEADER and cache.stats.hits == cache.stats.stored


def test_a_changed_file_is_not_served_from_disk(root_file: Path, tmp_path: Path) -> None:
    cache = DiskCache(tmp_path / "cache", 64 * disk_cache.MB)
    read(root_file, cache)
    write_small_tree(root_file, seed=2, n_events=40_000)  # rewritten at the same path
    after, network, disk = read(root_file, cache)
    assert disk == 0 and network > HEADER
    assert equal(after, cold(root_file)) and not equal(after, _other(tmp_path, seed=1))


def _other(tmp_path: Path, seed: int) -> dict[str, np.ndarray]:
    path = tmp_path / f"other-{seed}.root"
    write_small_tree(path, seed=seed, n_events=40_000)
    return cold(path)


def test_the_identity_comes_from_the_header(root_file: Path, tmp_path: Path) -> None:
    copy = tmp_path / "copy.root"
    copy.write_bytes(root_file.read_bytes())
    head = root_file.read_bytes()[:HEADER]
    assert header_identity(head) == header_identity(copy.read_bytes()[:HEADER]) is not None
    write_small_tree(copy, seed=1, n_events=40_000)  # the same events, written again
    assert header_identity(copy.read_bytes()[:HEADER]) != header_identity(head)  # new UUID
    assert header_identity(b"not a ROOT file" * 40) is None
    assert header_identity(head[:20]) is None


def test_the_bound_is_kept_by_evicting_the_least_recently_used(root_file: Path,
                                                               tmp_path: Path) -> None:
    full = DiskCache(tmp_path / "full", 64 * disk_cache.MB)
    read(root_file, full)
    bound = full.held_bytes() // 3
    cache = DiskCache(tmp_path / "small", bound)
    first, network, _ = read(root_file, cache)
    assert cache.held_bytes() <= bound and cache.stats.evicted_bytes > 0
    again, _, disk = read(root_file, cache)
    assert equal(again, first) and 0 < disk < network
    assert cache.held_bytes() <= bound


def test_lru_order(tmp_path: Path) -> None:
    ident = bytes(16)
    cache = DiskCache(tmp_path / "c", 3 * (100 + 44))
    for i, start in enumerate((0, 100, 200)):
        assert cache.put(ident, start, start + 100, bytes([i]) * 100)
        os.utime(cache.path(ident, start, start + 100), (1000 + i, 1000 + i))
    assert cache.get(ident, 0, 100) == bytes(100)  # touched: now the most recent
    cache.put(ident, 300, 400, b"x" * 100)  # over the bound: evict to 90% of it
    assert cache.get(ident, 100, 200) is None and cache.get(ident, 200, 300) is None
    assert cache.get(ident, 0, 100) is not None and cache.get(ident, 300, 400) is not None
    assert not cache.put(ident, 0, 1000, b"y" * 1000)  # larger than the bound: not kept
    assert not cache.put(ident, 0, 10, b"short")  # not the range's length


@pytest.mark.parametrize("damage", ["truncate", "flip", "empty", "other-range"])
def test_a_bad_cache_file_is_a_miss(root_file: Path, tmp_path: Path, damage: str) -> None:
    cache = DiskCache(tmp_path / "cache", 64 * disk_cache.MB)
    first, network, _ = read(root_file, cache)
    files = sorted((p for p in (tmp_path / "cache").rglob("*-*") if p.is_file()),
                   key=lambda p: -p.stat().st_size)
    victim = files[0]  # the largest range: a basket
    data = victim.read_bytes()
    if damage == "truncate":
        victim.write_bytes(data[:len(data) // 2])
    elif damage == "flip":
        victim.write_bytes(data[:-1] + bytes([data[-1] ^ 0xFF]))
    elif damage == "empty":
        victim.write_bytes(b"")
    else:  # another range's file under this name
        victim.write_bytes(files[1].read_bytes())
    again, network2, disk2 = read(root_file, cache)
    assert equal(again, first)
    assert cache.stats.bad == 1
    size = int(victim.name.split("-")[1]) - int(victim.name.split("-")[0])
    assert network2 == HEADER + size and disk2 == network - HEADER - size
    assert victim.stat().st_size == len(data)  # fetched again and kept whole


def test_a_source_used_without_its_header_goes_to_the_server(root_file: Path,
                                                             tmp_path: Path) -> None:
    cache = DiskCache(tmp_path / "cache", 64 * disk_cache.MB)
    inner = uproot.source.file.MemmapSource(str(root_file), **uproot.reading.open.defaults)
    source = DiskCachedSource(inner, cache)
    with source:
        chunk = source.chunk(1000, 2000)  # the file is not known: not kept
        assert bytes(chunk.raw_data) == root_file.read_bytes()[1000:2000]
        assert cache.held_bytes() == 0 and source.num_requested_bytes == 1000


def test_configure_finds_the_workers_folder_and_drops_for_a_new_epoch(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(disk_cache, "_cache", None)
    assert disk_cache.worker_directory({}) is None
    workspace = tmp_path / "worker-1"
    monkeypatch.setenv("WORKER_TMPDIR", str(workspace / "temp"))
    assert disk_cache.configure(0.0) is None  # off
    cache = disk_cache.configure(8.0)
    assert cache is not None and cache.root == workspace / "cache" / disk_cache.FOLDER
    # TaskVine keeps an item of its cache folder across managers only at level "forever"
    meta = (workspace / "cache" / f"{disk_cache.FOLDER}.meta").read_text().splitlines()
    assert "cache_level 3" in meta and "type 1" in meta
    assert cache.max_bytes == 8 * disk_cache.MB
    ident = bytes(16)
    cache.put(ident, 0, 10, b"0123456789")
    assert disk_cache.configure(8.0, epoch=0) is cache and cache.get(ident, 0, 10) is not None
    disk_cache.configure(8.0, epoch=1)  # cluster.drop_caches()
    assert cache.get(ident, 0, 10) is None
    cache.put(ident, 0, 10, b"0123456789")
    disk_cache.configure(8.0, epoch=1)  # the same epoch again: kept
    assert cache.get(ident, 0, 10) is not None
    (cache.root / disk_cache.MARKER).write_text("another-library 1\n")  # a new manager's
    disk_cache.configure(8.0, epoch=0)  # ... that has not dropped: kept
    assert cache.get(ident, 0, 10) is not None
    (cache.root / disk_cache.MARKER).write_text("another-library 1\n")
    disk_cache.configure(8.0, epoch=1)  # ... that has: emptied
    assert cache.get(ident, 0, 10) is None


def test_run_config_checks_the_bound() -> None:
    assert RunConfig().input_cache_mb == 0.0  # off unless the site says how much
    assert RunConfig(input_cache_mb=512).replace(input_cache_mb=0).input_cache_mb == 0
    with pytest.raises(ConfigError, match="input_cache_mb must be >= 0"):
        RunConfig(input_cache_mb=-1)


def test_the_summary_counts_memory_disk_rack_and_far() -> None:
    summary = RunSummary()
    mb = 2**20
    summary.add_reads([
        {"lfn": "/a.root", "server": "xc-a", "rack": "A", "bytes": 403, "failovers": 0,
         "errors": (), "disk": 5 * mb},
        {"lfn": "/b.root", "server": "xc-b", "rack": "B", "bytes": 2 * mb, "failovers": 0,
         "errors": ()},
        {"lfn": "/c.root", "server": "memory", "rack": None, "bytes": 0, "failovers": 0,
         "errors": (), "cached": 7 * mb},
        {"lfn": "/d.root", "server": "xc-a", "rack": "A", "bytes": 3 * mb, "failovers": 0,
         "errors": ()},
    ], "A")
    assert summary.served() == {"memory": 7 * mb, "disk": 5 * mb, "rack": 3 * mb + 403,
                                "local": 0, "far": 2 * mb}
    assert summary.to_dict()["reads"]["disk_bytes"] == 5 * mb
    assert summary.to_dict()["served"]["disk"] == 5 * mb
    (line,) = [x for x in summary.lines() if x.startswith("  bytes:")]
    assert line == ("  bytes: 7.0 MB from workers' memory (decoded), 5.0 MB from their disk, "
                    "3.0 MB from the rack's shards, 2.0 MB far")


def test_the_worker_tells_once_which_files_its_disk_holds(
        root_file: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    cache = DiskCache(tmp_path / "cache", 64 * disk_cache.MB)
    with open_file(str(root_file), handler=uproot.source.file.MemmapSource,
                   wrap=lambda s: DiskCachedSource(s, cache, "/store/events.root")) as f:
        f["Events"].arrays(BRANCHES, library="np")
    assert disk_cache.held_names(cache.root) == ["/store/events.root"]
    monkeypatch.setattr(disk_cache, "_reported", None)
    assert disk_cache.take_held_names(cache.root) == ["/store/events.root"]
    assert disk_cache.take_held_names(cache.root) == []  # once per process
    cache.max_bytes = 1  # everything evicted: the name goes with the last range
    cache.enforce()
    assert disk_cache.held_names(cache.root) == [] and not any(cache.root.iterdir())


def test_a_facility_file_sets_the_bound(tmp_path: Path) -> None:
    from datavine.deploy.facility import FacilityError, load_facility

    path = tmp_path / "facility.toml"
    path.write_text('[manager]\nhost = "mgr.example.org"\n\n[run]\ninput_cache_mb = 4096\n')
    assert load_facility(path).run.input_cache_mb == 4096.0
    path.write_text('[manager]\nhost = "mgr.example.org"\n\n[run]\ninput_cache_mb = -5\n')
    with pytest.raises(FacilityError, match="input_cache_mb"):
        load_facility(path)
