"""Reads overlapped with compute (issue 29, item 4): the mechanism, without timing.

The store of ranges read ahead is bounded; a read that takes its ranges from it gives the
same arrays as a cold read, and counts the same bytes; a queued call whose prefetch failed,
was refused by the bound or was cancelled reads for itself; what a call left, or what was
fetched for a call cancelled while it waited, is dropped; a hint for a call already started
is ignored; the chunks a queued bundle will read are found in its task nodes.
"""

from __future__ import annotations

import functools
import os
import threading
import time
from collections import deque
from pathlib import Path

import numpy as np
import pytest
import uproot

from datavine.apps.analysis.agc import Chunk
from datavine.apps.analysis.sources import LocalFiles, XCacheShards, analysis_graph
from datavine.apps.testbed import write_small_tree
from datavine.config import RunConfig
from datavine.errors import ConfigError
from datavine.io import read_profile
from datavine.io.prefetch_store import MB, PrefetchStore
from datavine.io.source.base import bytes_prefetched, bytes_requested
from datavine.io.source.disk import DiskCachedSource
from datavine.io.source.handles import open_file
from datavine.io.source.prefetched import PrefetchedSource
from datavine.scheduler.summary import RunSummary
from datavine.worker.prefetch import Job, Prefetcher, fetch_ranges
from datavine.worker.prefetch_plan import ChunkRead, chunk_reads, tree_for

BRANCHES = ("Jet_pt", "nJet")
START, STOP = 10_000, 30_000
URL = "root://origin:1094//data/a.root"


@pytest.fixture()
def root_file(tmp_path: Path) -> Path:
    path = tmp_path / "data" / "events.root"
    write_small_tree(path, seed=3, n_events=40_000)
    return path


def prefetch(path: Path, store: PrefetchStore, owner: str, job: Job | None = None) -> int:
    """Read ahead ``BRANCHES`` of entries [START, STOP) of ``path`` into ``store``."""
    with open_file(str(path), wrap=lambda s: DiskCachedSource(s, store.writer(owner)),
                   handler=uproot.source.file.MemmapSource) as f:
        return fetch_ranges(f, "Events", BRANCHES, START, STOP, job or Job(owner))


def read(path: Path, store: PrefetchStore | None = None,
         ) -> tuple[dict[str, np.ndarray], int, int]:
    """The chunk's arrays, through ``store`` (None: cold); bytes requested, prefetched."""
    wrap = (lambda s: PrefetchedSource(s, store)) if store is not None else None
    with open_file(str(path), wrap=wrap, handler=uproot.source.file.MemmapSource) as f:
        arrays = f["Events"].arrays(list(BRANCHES), entry_start=START, entry_stop=STOP,
                                    library="np")
        return arrays, bytes_requested(f), bytes_prefetched(f)


def equal(a: dict[str, np.ndarray], b: dict[str, np.ndarray]) -> bool:
    return a.keys() == b.keys() and all(np.array_equal(a[k], b[k]) for k in a)


# --- the store --------------------------------------------------------------------------------
def test_the_store_never_holds_more_than_its_bound() -> None:
    store = PrefetchStore(max_bytes=1000)
    ident = b"x" * 16
    assert store.put("a", ident, 0, 600, b"\1" * 600)
    assert not store.put("a", ident, 600, 1200, b"\2" * 600), "over the bound"
    assert store.put("b", ident, 600, 1000, b"\3" * 400)
    assert store.held_bytes == 1000 and store.stats.refused_bytes == 600
    assert not store.put("a", ident, 2000, 2001, b"")  # not the range's length
    store.resize(0)
    assert not store.put("a", ident, 5000, 5001, b"\4")
    assert store.held_bytes == 1000  # what it holds waits for its bundle


def test_a_range_is_taken_once_and_only_by_its_owner() -> None:
    store = PrefetchStore(max_bytes=MB)
    ident = b"y" * 16
    store.put("a", ident, 0, 3, b"abc")
    assert store.take(ident, 0, 3, owner="b") is None
    assert store.take(ident, 0, 2) is None  # not the same range
    assert store.take(ident, 0, 3, owner="a") == b"abc"
    assert store.take(ident, 0, 3) is None
    assert store.held_bytes == 0 and store.stats.served_bytes == 3


def test_drop_frees_what_an_owner_left() -> None:
    store = PrefetchStore(max_bytes=MB)
    ident = b"z" * 16
    store.put("a", ident, 0, 10, b"0" * 10)
    store.put("b", ident, 10, 30, b"1" * 20)
    assert store.drop("a") == 10
    assert store.owners() == {"b"} and store.held_bytes == 20
    assert store.stats.dropped_bytes == 10


# --- reading through it -----------------------------------------------------------------------
def test_a_prefetched_read_is_identical_to_a_cold_read(root_file: Path) -> None:
    cold, cold_bytes, _ = read(root_file)
    store = PrefetchStore(max_bytes=64 * MB)
    assert prefetch(root_file, store, "call-1") > 0
    held = store.held_bytes
    assert held > 0
    store.serving = "call-1"
    warm, warm_bytes, early = read(root_file, store)
    assert equal(warm, cold)
    assert early > 0 and early <= held
    # the bytes read ahead crossed the network too: the bundle's count is a cold read's
    assert warm_bytes == cold_bytes
    assert store.stats.served_bytes == early


def test_a_read_whose_prefetch_was_refused_by_the_bound_reads_the_rest(root_file: Path,
                                                                        ) -> None:
    cold, cold_bytes, _ = read(root_file)
    store = PrefetchStore(max_bytes=4096)  # room for a few ranges at most
    prefetch(root_file, store, "call-1")
    assert store.held_bytes <= 4096 and store.stats.refused_bytes > 0
    store.serving = "call-1"
    warm, warm_bytes, _ = read(root_file, store)
    assert equal(warm, cold) and warm_bytes == cold_bytes


def test_a_read_takes_nothing_fetched_for_another_call(root_file: Path) -> None:
    cold, _, _ = read(root_file)
    store = PrefetchStore(max_bytes=64 * MB)
    prefetch(root_file, store, "call-2")
    store.serving = "call-1"
    warm, _, early = read(root_file, store)
    assert equal(warm, cold) and early == 0
    assert store.owners() == {"call-2"}


def test_a_cancelled_prefetch_asks_for_nothing(root_file: Path) -> None:
    store = PrefetchStore(max_bytes=64 * MB)
    job = Job("call-1", cancelled=True)
    assert prefetch(root_file, store, "call-1", job) == 0
    assert store.held_bytes == 0 or store.owners() == {"call-1"}  # the metadata at most


# --- the prefetcher's jobs ----------------------------------------------------------------------
class Recorder:
    """A fetch that records its jobs, puts a range for each, and may fail or block."""

    def __init__(self, fail: bool = False) -> None:
        self.fail = fail
        self.seen: list[str] = []
        self.release = threading.Event()
        self.release.set()
        self.entered = threading.Event()

    def __call__(self, job: Job, store: PrefetchStore) -> None:
        self.seen.append(job.owner)
        self.entered.set()
        self.release.wait(10)
        store.put(job.owner, b"i" * 16, 0, 4, b"data")
        if self.fail:
            raise OSError("the shard went away")


def test_a_hinted_call_is_fetched_and_its_bundle_waits_for_it(tmp_path: Path) -> None:
    fetch = Recorder()
    fetch.release.clear()
    store = PrefetchStore(max_bytes=MB)
    pf = Prefetcher(store, fetch)
    owner = str(tmp_path)
    assert pf.hint(owner)
    assert not pf.hint(owner), "hinted twice"
    job = pf.job(owner)
    assert job is not None and fetch.entered.wait(10)
    threading.Timer(0.2, fetch.release.set).start()
    pf.begin(owner, 1.0)  # waits for the fetch in flight
    assert job.done.is_set() and store.serving == owner
    assert store.take(b"i" * 16, 0, 4, owner) == b"data"
    pf.end(owner)
    assert store.held_bytes == 0 and pf.job(owner) is None and store.serving is None


def test_a_failed_prefetch_leaves_the_bundle_to_read_for_itself(tmp_path: Path) -> None:
    store = PrefetchStore(max_bytes=MB)
    pf = Prefetcher(store, Recorder(fail=True))
    owner = str(tmp_path)
    pf.hint(owner)
    job = pf.job(owner)
    assert job is not None and job.done.wait(10)
    assert "shard went away" in job.error
    pf.begin(owner, 1.0)
    pf.end(owner)
    assert store.held_bytes == 0


def test_a_hint_for_a_started_call_is_ignored(tmp_path: Path) -> None:
    fetch = Recorder()
    pf = Prefetcher(PrefetchStore(max_bytes=MB), fetch)
    owner = str(tmp_path)
    pf.begin(owner, 1.0)
    assert not pf.hint(owner)
    pf.end(owner)
    assert fetch.seen == []


def test_a_job_not_begun_is_cancelled_when_its_call_starts(tmp_path: Path) -> None:
    fetch = Recorder()
    fetch.release.clear()
    store = PrefetchStore(max_bytes=MB)
    pf = Prefetcher(store, fetch)
    first, second = str(tmp_path / "a"), str(tmp_path / "b")
    os.mkdir(first)
    os.mkdir(second)
    pf.hint(first)  # the thread takes it and blocks in the fetch
    assert fetch.entered.wait(10)
    pf.hint(second)  # waits behind it
    job = pf.job(second)
    assert job is not None
    pf.begin(second, 1.0, wait_s=0.0)  # its call starts before its fetch began
    assert job.cancelled
    fetch.release.set()
    assert job.done.wait(10)
    pf.end(second)
    assert second not in fetch.seen
    assert store.owners() <= {first}


def test_what_was_fetched_for_a_cancelled_call_is_dropped(tmp_path: Path) -> None:
    store = PrefetchStore(max_bytes=MB)
    pf = Prefetcher(store, Recorder())
    running, cancelled = tmp_path / "running", tmp_path / "cancelled"
    running.mkdir()
    cancelled.mkdir()
    pf.hint(str(cancelled))
    job = pf.job(str(cancelled))
    assert job is not None and job.done.wait(10)
    assert store.owners() == {str(cancelled)}
    cancelled.rmdir()  # the worker removed its sandbox: TaskVine cancelled it
    pf.begin(str(running), 1.0)
    pf.end(str(running))
    assert store.held_bytes == 0 and pf.job(str(cancelled)) is None


# --- what a queued bundle reads ------------------------------------------------------------------
def test_the_chunks_of_an_analysis_graph_are_found_in_its_nodes() -> None:
    from datavine.scheduler.graph import build

    chunks = [Chunk(URL, 0, 100), Chunk(URL, 100, 200)]
    final = analysis_graph(XCacheShards(shardmap=None), chunks)  # type: ignore[arg-type]
    graph = build(final.__dask_graph__(), final.__dask_keys__())
    reads = {read for key, node in graph.nodes.items() if "chunk" in str(key)
             for read in chunk_reads([(key, node)])}
    assert reads == {ChunkRead(URL, 0, 100), ChunkRead(URL, 100, 200)}


def test_local_files_tuples_and_trees() -> None:
    local = analysis_graph(LocalFiles(), [Chunk("/data/a.root", 0, 10)])
    assert chunk_reads(list(dict(local.__dask_graph__()).items())) == []
    assert chunk_reads([("k", (URL, 5, 9, "Tree"))]) == [ChunkRead(URL, 5, 9, "Tree")]
    assert chunk_reads([("k", (URL, 9, 5))]) == []
    assert tree_for(ChunkRead(URL, 0, 1, "Tree"), ["Events"]) == "Tree"
    assert tree_for(ChunkRead(URL, 0, 1), ["Events", "Other"]) == "Events"
    assert tree_for(ChunkRead(URL, 0, 1), ["Other"]) == "Other"


def test_the_read_path_notes_the_branches_it_reads(root_file: Path) -> None:
    from datavine.io.cached_arrays import read_arrays

    read_profile.forget()
    read_arrays(str(root_file), list(BRANCHES), 0, 100)
    assert read_profile.branches("Events") == BRANCHES


# --- the setting and its count --------------------------------------------------------------------
def test_the_bound_is_checked_and_its_share_of_the_cap() -> None:
    with pytest.raises(ConfigError, match="prefetch_mb"):
        RunConfig(prefetch_mb=-1)
    cfg = RunConfig(prefetch_mb=256)
    assert cfg.prefetch_budget_mb(512.0) == pytest.approx(51.2)
    assert cfg.prefetch_budget_mb(None) == 0.0  # uncapped bundles run in the library
    assert RunConfig(prefetch_mb=8).prefetch_budget_mb(4096.0) == 8.0
    assert RunConfig().prefetch_budget_mb(4096.0) == 0.0


def test_the_summary_counts_what_was_read_ahead() -> None:
    summary = RunSummary()
    summary.add_reads([{"lfn": "a", "server": "xcache-0", "rack": "A", "bytes": 1000,
                        "failovers": 0, "errors": (), "prefetched": 800},
                       {"lfn": "b", "server": "xcache-0", "rack": "A", "bytes": 500,
                        "failovers": 0, "errors": ()}], "A")
    assert summary.reads.near_bytes == 1500
    assert summary.reads.prefetched_bytes == 800 and summary.reads.prefetched_opens == 1
    assert summary.to_dict()["reads"]["prefetched_bytes"] == 800
    assert any("read ahead" in line for line in summary.lines())


# --- hints to the capped child --------------------------------------------------------------------
def leave_mark(folder: str, message: bytes) -> None:
    """A hint handler (in the child): a file named by the message."""
    Path(folder, message.decode()).touch()


def wait_for_file(path: Path, timeout_s: float = 10.0) -> bool:
    deadline = time.monotonic() + timeout_s
    while not path.exists() and time.monotonic() < deadline:
        time.sleep(0.02)
    return path.exists()


def test_hints_reach_the_child_and_wait_for_it_when_there_is_none(tmp_path: Path) -> None:
    from datavine.worker.capped_child import CappedChild

    marks = tmp_path / "marks"
    marks.mkdir()
    sandbox = str(tmp_path / "starting")
    with CappedChild(hint_handler=functools.partial(leave_mark, str(marks))) as child:
        assert not child.hint(b"early")  # no child yet: kept for the next one
        assert not child.hint(sandbox.encode())  # the call that starts the child
        assert child.run(os.getpid, cap_mb=None, sandbox=sandbox).ok
        assert wait_for_file(marks / "early")
        assert child.hint(b"later")
        assert wait_for_file(marks / "later")
    assert not Path(sandbox).exists(), "the call that started the child was hinted to it"
    assert sorted(p.name for p in marks.iterdir()) == ["early", "later"]


def test_hints_are_ignored_while_no_bundle_read_ahead_in_this_process(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """With prefetch off (the default) a queued call's hint costs the running bundle
    nothing: no prefetcher, no thread reading its spec."""
    from datavine.worker import prefetch as module

    monkeypatch.setattr(module, "_prefetcher", None)
    module.on_hint(str(tmp_path / "queued").encode())
    assert module._prefetcher is None
    with module.bundle(str(tmp_path), 0.0):  # a bundle with read-ahead off
        pass
    module.on_hint(str(tmp_path / "queued").encode())
    assert module._prefetcher is None


def test_calls_queued_before_the_first_bundle_are_read_ahead_once_it_starts(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The library's first calls arrive together: the one behind the first bundle is read
    ahead while that bundle runs, not left to read for itself."""
    from datavine.worker import prefetch as module

    monkeypatch.setattr(module, "_prefetcher", None)
    monkeypatch.setattr(module, "_early", deque(maxlen=module.EARLY_KEPT))
    first, queued, gone = (tmp_path / n for n in ("first", "queued", "gone"))
    first.mkdir()
    queued.mkdir()
    for sandbox in (first, queued, gone):  # ``gone``: cancelled before the bundle started
        module.on_hint(str(sandbox).encode())
    with module.bundle(str(tmp_path / "off"), 0.0):  # read-ahead off: the hints wait
        assert module._prefetcher is None
    with module.bundle(str(first), 64.0):
        pf = module._prefetcher
        assert pf is not None
        assert pf.job(str(queued)) is not None
        assert pf.job(str(first)) is None  # the bundle running is not read ahead
        assert pf.job(str(gone)) is None
    assert not module._early
    pf.close()


def test_calls_queued_before_the_library_has_its_child_are_hinted_to_it(
        monkeypatch: pytest.MonkeyPatch) -> None:
    from datavine.worker import remote

    monkeypatch.setattr(remote, "_CHILD", None)
    remote.call_queued(1, "run_bundle", "/sandbox/first")
    remote.call_queued(2, "other_function", "/sandbox/other")
    remote.call_queued(3, "run_bundle", "/sandbox/second")
    child = remote._capped_child()
    try:
        # the child that the first call starts gets both (it skips its own call's)
        assert child._pending == [b"/sandbox/first", b"/sandbox/second"]
    finally:
        child.close()
