"""The column cache (io/column_cache.py) and its read path (io/cached_arrays.py), in one
process: a hit is what a cold read gives, a rewritten file is read again, the byte bound
holds, a new epoch empties it; what a bundle's read records and the run summary say of it;
what placement's topology learns from them."""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path

import awkward as ak
import numpy as np
import pytest

from datavine.apps.analysis import agc
from datavine.apps.analysis.agc import Selection, process_chunk
from datavine.config import RunConfig
from datavine.errors import ConfigError
from datavine.io import column_cache
from datavine.io.cached_arrays import read_arrays, read_held
from datavine.io.column_cache import ColumnCache, ColumnKey
from datavine.io.datagen import generate_dataset
from datavine.io.reading import open_input, reading
from datavine.protocol import BundleSpec, Status
from datavine.scheduler.summary import RunSummary
from datavine.scheduler.topology import Topology

EVENTS = 20_000


@pytest.fixture(scope="module")
def files(tmp_path_factory: pytest.TempPathFactory) -> list[Path]:
    return generate_dataset(tmp_path_factory.mktemp("cc"), 2, EVENTS, seed=5,
                            basket_events=5_000)


@pytest.fixture(autouse=True)
def fresh_cache() -> Iterator[ColumnCache]:
    """Each test starts with this process's cache empty and off, and leaves it so."""
    cache = column_cache.cache()
    cache.clear()
    cache.take_dropped()
    cache.resize(0)
    cache.room = None
    yield cache
    cache.clear()
    cache.take_dropped()
    cache.resize(0)
    cache.room = None


def cold(path: Path, start: int, stop: int) -> dict[str, ak.Array]:
    with open_input(str(path)) as f:
        return f["Events"].arrays(list(agc.BRANCHES), entry_start=start, entry_stop=stop,
                                  how=dict)


def test_a_hit_is_what_a_cold_read_gives(files: list[Path], fresh_cache: ColumnCache) -> None:
    with reading(None, cache_mb=256) as ctx:
        first = read_arrays(files[0], agc.BRANCHES, 3_000, 11_000)
        second = read_arrays(files[0], agc.BRANCHES, 3_000, 11_000)
        records = ctx.records()
    reference = cold(files[0], 3_000, 11_000)
    for name in agc.BRANCHES:
        assert ak.array_equal(first.arrays[name], reference[name])
        assert ak.array_equal(second.arrays[name], reference[name])
        assert second.arrays[name] is first.arrays[name]  # from memory, not decoded again
    assert first.bytes_read > 0 and first.cached == 0 and first.decoded > 0
    assert second.bytes_read == 0 and second.cached == first.decoded and second.decoded == 0
    assert fresh_cache.stats.hits == len(agc.BRANCHES)
    # one open (the first read); the cache's use is on its record
    assert [(r.server, r.cached, r.decoded) for r in records if r.server != "memory"] == [
        ("local", first.decoded, first.decoded)]
    # what placement learns: the range held, its file's marker, which cache holds them
    held = [r.lfn for r in records if r.server == "memory"]
    assert held[:2] == [f"{files[0]}@3000-11000", f"{files[0]}@*"]
    assert held[2].startswith("@cache/") and len(held) == 3


def test_outside_a_bundle_nothing_is_kept(files: list[Path], fresh_cache: ColumnCache) -> None:
    fresh_cache.resize(256 * column_cache.MB)  # as a bundle left it
    read_arrays(files[0], ["nJet"], 0, 5_000)
    assert fresh_cache.bytes == 0 and not fresh_cache.entries


def test_the_analysis_on_cached_columns_equals_a_cold_run(files: list[Path]) -> None:
    other = Selection(jet_pt=30.0)
    expected = [process_chunk(files[1], 0, 10_000), process_chunk(files[1], 0, 10_000,
                                                                  selection=other)]
    with reading(None, cache_mb=256):
        warm = process_chunk(files[1], 0, 10_000)
        rerun = process_chunk(files[1], 0, 10_000, selection=other)
    assert warm == expected[0]
    assert rerun.bytes_read == 0  # every column came from memory
    assert (np.array_equal(rerun.counts, expected[1].counts)
            and rerun.events_selected == expected[1].events_selected
            and rerun.events == expected[1].events)
    assert expected[1].events_selected < expected[0].events_selected  # the cut did something


def test_an_open_file_or_tree_reads_through_the_cache(files: list[Path]) -> None:
    with reading(None, cache_mb=256), open_input(str(files[0])) as f:
        by_directory = read_arrays(f, ["Jet_pt"], 0, 5_000)
        by_tree = read_arrays(f["Events"], ["Jet_pt"], 0, 5_000)
    assert by_tree.arrays["Jet_pt"] is by_directory.arrays["Jet_pt"]
    assert by_tree.cached > 0 and by_tree.bytes_read == 0


def test_a_rewritten_file_is_read_again(tmp_path: Path) -> None:
    path = generate_dataset(tmp_path / "a", 1, 5_000, seed=1)[0]
    with reading(None, cache_mb=256):
        before = read_arrays(path, ["Jet_pt", "nJet"], 0, 5_000).arrays
        replacement = generate_dataset(tmp_path / "b", 1, 5_000, seed=2)[0]
        os.replace(replacement, path)  # the same path, other contents
        after = read_arrays(path, ["Jet_pt", "nJet"], 0, 5_000)
    assert after.cached == 0 and after.decoded > 0
    assert not ak.array_equal(after.arrays["Jet_pt"], before["Jet_pt"])
    assert ak.array_equal(after.arrays["Jet_pt"], cold_branch(path, "Jet_pt"))


def cold_branch(path: Path, name: str) -> ak.Array:
    with open_input(str(path)) as f:
        return f["Events"][name].array()


def test_a_file_rewritten_in_place_is_read_again(tmp_path: Path) -> None:
    """Same inode, same size: the modification time tells them apart."""
    path = generate_dataset(tmp_path / "a", 1, 5_000, seed=1)[0]
    with reading(None, cache_mb=256):
        first = read_arrays(path, ["nJet"], 0, 5_000)
        data = path.read_bytes()
        st = os.stat(path)
        path.write_bytes(data)  # same bytes, written again: a new mtime
        os.utime(path, ns=(st.st_atime_ns, st.st_mtime_ns + 1_000_000))
        again = read_arrays(path, ["nJet"], 0, 5_000)
        held = read_arrays(path, ["nJet"], 0, 5_000)
    assert again.cached == 0 and first.decoded == again.decoded
    assert held.cached == again.decoded  # the new version is kept in its turn


def test_eviction_keeps_the_byte_bound_in_lru_order() -> None:
    cache = ColumnCache(max_bytes=100)
    keys = [ColumnKey("f", "Events", f"b{i}", "default", 0, 10) for i in range(5)]
    for key in keys[:4]:
        assert cache.put(key, np.zeros(3), 30, "/f")
        assert cache.bytes <= cache.max_bytes
    assert keys[0] not in cache.entries  # 4 x 30 > 100: the oldest left
    assert cache.get(keys[1]) is not None  # now the most recent
    cache.put(keys[4], np.zeros(3), 30, "/f")
    assert list(cache.entries) == [keys[3], keys[1], keys[4]]
    assert cache.bytes == 90 and cache.held["/f"] == 90
    assert not cache.put(ColumnKey("g", "Events", "big", "default", 0, 1), 0, 101, "/g")
    assert cache.resize(30) == 60 and list(cache.entries) == [keys[4]]
    assert cache.stats.evictions == 4 and cache.stats.evicted_bytes == 120


def test_a_file_whose_columns_all_left_is_reported_dropped(files: list[Path]) -> None:
    with reading(None, cache_mb=256):
        read_arrays(files[0], ["nJet"], 0, 5_000)
    with reading(None, cache_mb=256):
        read_arrays(files[1], ["nJet"], 0, 5_000)
    with reading(None, cache_mb=0) as ctx:  # a bundle of a run without the cache
        records = [r.as_dict() for r in ctx.records()]
    assert column_cache.cache().bytes == 0
    assert sorted(r["lfn"] for r in records if r.get("dropped")) == [
        f"{files[0]}@*", f"{files[0]}@0-5000", f"{files[1]}@*", f"{files[1]}@0-5000"]
    assert all(r["server"] == "memory" and r["bytes"] == 0 for r in records)


def test_a_newer_epoch_empties_the_cache(files: list[Path]) -> None:
    cache = column_cache.cache()
    with reading(None, cache_mb=256, cache_epoch=cache.epoch):
        read_arrays(files[0], ["nJet"], 0, 5_000)
    assert cache.bytes > 0
    with reading(None, cache_mb=256, cache_epoch=cache.epoch + 1):
        assert cache.bytes == 0
        again = read_arrays(files[0], ["nJet"], 0, 5_000)
        assert again.cached == 0


def test_the_summary_counts_hits_and_keeps_memory_records_out_of_opens() -> None:
    summary = RunSummary()
    summary.add_reads([
        {"lfn": "/a", "server": "local", "rack": None, "bytes": 10, "failovers": 0,
         "errors": (), "cached": 0, "decoded": 40},
        {"lfn": "/b", "server": "memory", "rack": None, "bytes": 0, "failovers": 0,
         "errors": (), "cached": 120, "decoded": 0},
        {"lfn": "/c@*", "server": "memory", "rack": None, "bytes": 0, "failovers": 0,
         "errors": (), "dropped": True},
        {"lfn": "/d", "server": "local", "rack": None, "bytes": 5, "failovers": 0,
         "errors": ()},  # a protocol-2 record: no cache fields
    ], None)
    assert summary.reads.opens == 2 and summary.reads.near_bytes == 15
    assert (summary.cache.hit_bytes, summary.cache.miss_bytes, summary.cache.dropped) == (
        120, 40, 1)
    assert summary.cache.hit_fraction == 0.75
    assert summary.to_dict()["cache"]["hit_fraction"] == 0.75
    assert any("column cache" in line for line in summary.lines())


def test_the_budget_is_a_share_of_the_cap_within_the_bound() -> None:
    assert RunConfig().column_cache_budget_mb(2048) == 1024
    assert RunConfig(column_cache_mb=300).column_cache_budget_mb(2048) == 300
    assert RunConfig(column_cache=False).column_cache_budget_mb(2048) == 0
    assert RunConfig(column_cache_mb=64).column_cache_budget_mb(None) == 64
    with pytest.raises(ConfigError, match="column_cache_share"):
        RunConfig(column_cache_share=0.9)
    spec = BundleSpec(cache_mb=12.5, cache_epoch=3)
    assert BundleSpec.decode(spec.encode()) == spec


def test_placement_forgets_dropped_files_lost_workers_and_everything_on_drop() -> None:
    topology = Topology()
    a = topology.learn("w-a", None, "127.0.0.1:9001", ["/f1", "/f2"])
    b = topology.learn("w-b", None, "127.0.0.1:9002", ["/f1"])
    assert a is not None and b is not None
    topology.held(a, [{"lfn": "/f1", "server": "memory", "dropped": True},
                      {"lfn": "/f2", "server": "local", "bytes": 3}])
    assert a.files_read == {"/f2"} and b.files_read == {"/f1"}
    assert {v.id for v in topology.views() if "/f1" in v.files_read} == {"w-b"}
    topology.forget("w-b")  # lost: its cache is gone with it
    assert not any("/f1" in v.files_read for v in topology.views())
    again = topology.learn("w-b", None, "127.0.0.1:9003", [])  # back, restarted: cold
    assert again is not None and again.files_read == set()
    epoch = topology.cache_epoch
    topology.drop_caches()
    assert topology.cache_epoch == epoch + 1
    assert all(not v.files_read for v in topology.views())


def test_a_task_names_the_pieces_it_reads() -> None:
    from dask._task_spec import Task

    from datavine.scheduler.pieces import task_pieces

    class WorkItem:  # coffea's, as far as placement looks
        filename, entrystart, entrystop = "root://origin//store/b.root", 5, 10

    chunk = agc.Chunk("/data/a.root", 0, 100)
    assert task_pieces(Task("k", agc.process_item, chunk)) == ("/data/a.root@0-100",)
    assert task_pieces(Task("k", print, [WorkItem()], chunk)) == ("/store/b.root@5-10",
                                                                  "/data/a.root@0-100")
    assert task_pieces(Task("k", print, ("/data/a.root", "x", 3))) == ()


def test_each_tasks_pieces_are_found_once() -> None:
    from dask._task_spec import Task

    from datavine.scheduler.pieces import PiecesOf

    nodes = {"a": Task("a", agc.process_item, agc.Chunk("/data/a.root", 0, 100)),
             "b": Task("b", print, 1)}
    pieces_of = PiecesOf(nodes)
    first = pieces_of("a")
    assert first == ("/data/a.root@0-100",) and pieces_of("b") == ()
    nodes["a"] = Task("a", agc.process_item, agc.Chunk("/data/other.root", 0, 1))
    assert pieces_of("a") is first  # not searched again: a run's tasks do not change


def test_a_worker_holding_other_pieces_of_a_file_is_not_cached_for_this_one() -> None:
    from datavine.scheduler.placement import TaskInputs, Tier, WorkerView, score

    task = TaskInputs(("/f",), pieces=("/f@0-10",))
    holder = WorkerView("a", None, 1, frozenset({"/f", "/f@*", "/f@0-10"}))
    other = WorkerView("b", None, 1, frozenset({"/f", "/f@*", "/f@10-20"}))
    read_only = WorkerView("c", None, 1, frozenset({"/f"}))  # no column cache: the file
    assert score(task, holder).tier == Tier.CACHED
    assert score(task, other).tier == Tier.FAR
    assert score(task, read_only).tier == Tier.CACHED
    assert score(TaskInputs(("/f",)), other).tier == Tier.CACHED  # no range known
    # the workers keep column caches: one that only opened the file holds none of it
    by_pieces = TaskInputs(("/f",), pieces=("/f@0-10",), pieces_only=True)
    assert score(by_pieces, read_only).tier == Tier.FAR
    assert score(by_pieces, holder).tier == Tier.CACHED
    assert score(by_pieces, other).tier == Tier.FAR


def test_a_replaced_cache_holds_nothing_it_reported() -> None:
    topology = Topology()
    known = topology.learn("w", None, "127.0.0.1:9", ["/f", "/f@0-10", "/f@*", "@cache/1/1"])
    assert known is not None
    topology.held(known, [{"lfn": "@cache/1/1", "server": "memory"}])
    assert known.files_read == {"/f", "/f@0-10", "/f@*"}
    topology.learn("w", None, "127.0.0.1:9", ["/g@0-5", "/g@*", "@cache/2/2"])
    topology.held(known, [{"lfn": "@cache/2/2", "server": "memory"}])  # a new child: cold
    assert known.files_read == {"/f"}


def test_settle_evicts_until_the_process_is_under_its_bound() -> None:
    cache = ColumnCache(max_bytes=1 << 30)
    for i in range(3):
        array = np.ones(1 << 20)  # 8 MiB each
        cache.put(ColumnKey("f", "Events", f"b{i}", "default", 0, 1), array, array.nbytes,
                  f"/f@{i}-{i + 1}")
    assert column_cache.settle(cache, column_cache.rss_bytes() + (1 << 30)) == 0
    assert len(cache.entries) == 3
    assert column_cache.settle(cache, 1) == 3 * 8 * 2**20  # never reachable: all go
    assert cache.bytes == 0 and cache.max_bytes == 1 << 30  # the bound stays
    assert cache.take_dropped() == {"/f@0-1", "/f@1-2", "/f@2-3", "/f@*"}


def test_make_room_evicts_this_processs_columns_until_under_the_bound(
        fresh_cache: ColumnCache) -> None:
    fresh_cache.resize(1 << 30)
    for i in range(4):
        array = np.ones(4 << 20)  # 32 MiB each, touched
        fresh_cache.put(ColumnKey("f", "Events", f"b{i}", "default", 0, 1), array,
                        array.nbytes, f"/f@{i}-{i + 1}")
    before = column_cache.rss_bytes()
    assert column_cache.make_room((before + (1 << 30)) / column_cache.MB) == 0  # under it
    assert len(fresh_cache.entries) == 4
    limit = before - 80 * column_cache.MB  # the last two columns may stay
    evicted = column_cache.make_room(limit / column_cache.MB)
    assert evicted >= 3 * 32 * column_cache.MB  # the least recently used first
    assert column_cache.rss_bytes() <= limit
    assert fresh_cache.room == fresh_cache.bytes  # it keeps no more from now on


def test_a_facility_file_sets_the_cache(tmp_path: Path) -> None:
    from datavine.deploy.facility import load_facility

    path = tmp_path / "facility.toml"
    path.write_text("[run]\ncolumn_cache_mb = 256\ncolumn_cache_share = 0.25\n")
    run = load_facility(path, check_files=False).run
    assert (run.column_cache, run.column_cache_mb, run.column_cache_share) == (True, 256, 0.25)
    path.write_text("[run]\ncolumn_cache = false\n")
    assert load_facility(path, check_files=False).run.column_cache_budget_mb(1024) == 0


def test_coffea_buffers_tell_a_copy_from_its_original(files: list[Path], tmp_path: Path) -> None:
    """A copy keeps the ROOT UUID: coffea's buffer keys alone would serve the original's."""
    import shutil

    from datavine.coffea.buffers import WorkerBuffers
    from datavine.io.reading import open_source

    copy = tmp_path / "copy.root"
    shutil.copyfile(files[0], copy)
    buffers, key = WorkerBuffers(), "some-uuid/Events/0-100/partition/Jet_pt%2C%21load"
    with reading(None, cache_mb=64) as ctx:
        open_source(str(files[0])).close()
        buffers[key] = np.arange(3)
        assert np.array_equal(buffers.get(key), np.arange(3))  # the same file: a hit
        open_source(str(copy)).close()  # the next item opens the copy
        assert buffers.get(key) is None
        records = ctx.records()
    assert f"{files[0]}@0-100" in {r.lfn for r in records}
    assert WorkerBuffers().get(key) is None  # outside a bundle: nothing


def test_settle_keeps_less_rather_than_handing_memory_back(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """Over its RSS bound (and under TRIM_OVER x it), the cache keeps less from then on and
    the memory stays with the process; only past TRIM_OVER x the bound is it trimmed."""
    trims: list[int] = []
    state = {"rss": 0, "free": 0}
    monkeypatch.setattr(column_cache, "rss_bytes", lambda: state["rss"])
    monkeypatch.setattr(column_cache, "heap_free_bytes", lambda: state["free"])
    monkeypatch.setattr(column_cache, "trim", lambda: trims.append(1))
    mb, limit = column_cache.MB, 100 * column_cache.MB
    cache = ColumnCache(max_bytes=64 * mb)
    for i in range(4):
        cache.put(ColumnKey("f", "Events", f"b{i}", "default", 0, 1), i, 10 * mb, f"/f@{i}-{i + 1}")
    state.update(rss=limit + 9 * mb, free=4 * mb)  # in use: 5 MB over
    assert column_cache.settle(cache, limit) == 10 * mb and cache.room == 35 * mb
    assert cache.bytes == 30 * mb and trims == []  # the memory stays, for the next reads
    state.update(rss=limit - 20 * mb, free=0)  # under its room: the room stays
    assert column_cache.settle(cache, limit) == 0 and cache.room == 35 * mb
    cache.put(ColumnKey("f", "Events", "b9", "default", 0, 1), 9, 5 * mb, "/f@9-10")
    assert column_cache.settle(cache, limit) == 0 and cache.room == 45 * mb  # grows by half
    state.update(rss=int(1.2 * limit))  # near the child's replacement: handed back
    assert column_cache.settle(cache, limit) == 35 * mb and trims and cache.room == 0
    assert cache.bytes == 0 and cache.max_bytes == 64 * mb


def test_settle_under_its_bound_does_not_ask_the_heap(monkeypatch: pytest.MonkeyPatch) -> None:
    """Under its RSS bound, with no room held back, nothing can be over: the heap's free
    lists (mallinfo2, ~0.1 ms after every bundle) are not walked; held back, they are."""
    asked: list[int] = []
    monkeypatch.setattr(column_cache, "rss_bytes", lambda: 50 * column_cache.MB)
    monkeypatch.setattr(column_cache, "heap_free_bytes", lambda: asked.append(1) or 0)
    cache = ColumnCache(max_bytes=64 * column_cache.MB)
    assert column_cache.settle(cache, 100 * column_cache.MB) == 0 and asked == []
    cache.room = 0  # held back: it may grow into what is left
    assert column_cache.settle(cache, 100 * column_cache.MB) == 0 and asked == [1]
    assert cache.room == 25 * column_cache.MB


def test_a_bundle_bound_is_the_smaller_of_its_budget_and_the_room(
        fresh_cache: ColumnCache) -> None:
    fresh_cache.room = 5 * column_cache.MB
    assert column_cache.configure(64 * column_cache.MB).max_bytes == 5 * column_cache.MB
    fresh_cache.room = None
    assert column_cache.configure(64 * column_cache.MB).max_bytes == 64 * column_cache.MB


def test_with_the_cache_on_freed_arrays_are_reused_not_faulted_in_again(
        fresh_cache: ColumnCache) -> None:
    """A kept column is never freed, so glibc's mmap threshold stayed low and every large
    array was fresh pages (a fault per 4 KiB); keep_heap serves them from the heap."""
    import resource

    column_cache.configure(64 * column_cache.MB)

    def faults_of_a_fresh_array() -> int:
        before = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
        array = np.ones(3 * column_cache.MB // 8)  # 3 MiB: 768 pages
        array[::512] = 2.0
        after = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
        del array
        return after - before

    faults_of_a_fresh_array()
    assert min(faults_of_a_fresh_array() for _ in range(3)) < 100


def test_a_bundle_says_how_much_cache_its_process_held_when_it_started(
        files: list[Path]) -> None:
    """Part of a bundle's peak is the cache its process already held: the result says how
    much (``cache_mb``), and the memory policy leaves it out of what the task needs."""
    from datavine.scheduler import graph as graphs
    from datavine.worker.remote import execute_bundle

    def bundle(start: int) -> BundleSpec:
        chunk = agc.Chunk(str(files[0]), start, start + 5_000)
        graph = graphs.build({"x": (agc.process_item, chunk)}, ["x"])
        return BundleSpec(nodes=[("x", graph.nodes["x"])], outputs=["x"], inline_max=1 << 20,
                          cache_mb=64.0)

    first = execute_bundle(bundle(0))
    assert first.ok and first.cache_mb == 0  # an empty cache before it
    second = execute_bundle(bundle(5_000))
    held = column_cache.cache().bytes
    assert second.ok and 0 < second.cache_mb < held / column_cache.MB  # the first's columns


def test_a_bundle_whose_output_cannot_be_sent_still_reports_its_reads(
        files: list[Path]) -> None:
    """A bundle that read its file and then failed to serialise its output is an error
    whose record still names what it read and the cache it started with: placement and the
    memory policy learn from a failed bundle too."""
    import threading

    from datavine.scheduler import graph as graphs
    from datavine.worker.remote import execute_bundle

    def with_a_lock(chunk: agc.Chunk) -> tuple[object, threading.Lock]:
        return agc.process_item(chunk), threading.Lock()  # a lock does not pickle

    def bundle(start: int, fn: object) -> BundleSpec:
        chunk = agc.Chunk(str(files[0]), start, start + 5_000)
        graph = graphs.build({"x": (fn, chunk)}, ["x"])
        return BundleSpec(nodes=[("x", graph.nodes["x"])], outputs=["x"], inline_max=1 << 20,
                          cache_mb=64.0)

    assert execute_bundle(bundle(0, agc.process_item)).ok  # something held before it
    failed = execute_bundle(bundle(5_000, with_a_lock))
    assert failed.status is Status.ERROR and "cannot be serialised" in failed.message
    assert failed.cache_mb > 0
    assert any(r["lfn"].endswith(files[0].name) and r["bytes"] > 0 for r in failed.reads), \
        failed.reads


def test_read_held_serves_only_whole_hits_and_opens_nothing(
        files: list[Path], monkeypatch: pytest.MonkeyPatch) -> None:
    path = str(files[0])
    branches = list(agc.BRANCHES)
    assert read_held(path, branches, 0, 5_000) is None  # outside a bundle: no cache
    with reading(None, cache_mb=256):
        assert read_held(path, branches, 0, 5_000) is None  # nothing held yet
        first = read_arrays(path, branches[:2], 0, 5_000)
        assert read_held(path, branches, 0, 5_000) is None  # two columns of them only
        read_arrays(path, branches, 0, 5_000)

        def no_open(*args: object, **kwargs: object) -> None:
            raise AssertionError("read_held opened the file")

        monkeypatch.setattr("datavine.io.reading.open_input", no_open)
        held = read_held(path, branches, 0, 5_000)
        assert read_held(path, branches, 0, 6_000) is None  # another entry range
    assert held is not None and held.bytes_read == 0 and held.decoded == 0
    assert held.cached == sum(int(a.nbytes) for a in held.arrays.values()) > first.decoded
    expected = cold(files[0], 0, 5_000)
    assert all(ak.array_equal(held.arrays[b], expected[b]) for b in branches)
