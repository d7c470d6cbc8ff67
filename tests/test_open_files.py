"""Local input files kept open across a process's bundles (io/open_files.py): a file is opened
once for the reads of many bundles, each bundle's record counts only its own bytes, a read
that fails drops the file, nothing is held outside a bundle, the bound holds, and a held
file's pages leave the process's resident memory after each read."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from pathlib import Path

import awkward as ak
import pytest

from datavine.io import column_cache, open_files, reading
from datavine.io.cached_arrays import read_arrays
from datavine.io.datagen import generate_dataset

EVENTS = 20_000
BRANCHES = ["Jet_pt", "nJet"]


@pytest.fixture(scope="module")
def files(tmp_path_factory: pytest.TempPathFactory) -> list[Path]:
    return generate_dataset(tmp_path_factory.mktemp("of"), 3, EVENTS, seed=7,
                            basket_events=5_000)


@pytest.fixture(autouse=True)
def nothing_held() -> Iterator[None]:
    open_files.files().close()
    column_cache.cache().clear()
    yield
    open_files.files().close()
    column_cache.cache().clear()
    column_cache.cache().resize(0)


@pytest.fixture
def opens(monkeypatch: pytest.MonkeyPatch) -> list[str]:
    """The paths opened through the read path, in order."""
    seen: list[str] = []
    real: Callable[..., object] = reading.open_input

    def counted(url: str, **options: object) -> object:
        seen.append(url)
        return real(url, **options)

    monkeypatch.setattr(reading, "open_input", counted)
    return seen


def cold(path: Path, start: int, stop: int) -> dict[str, ak.Array]:
    with reading.open_input(str(path)) as f:
        return f["Events"].arrays(BRANCHES, entry_start=start, entry_stop=stop, how=dict)


def test_bundles_read_a_file_opened_once_each_counting_its_own_bytes(
        files: list[Path], opens: list[str]) -> None:
    path = str(files[0])
    with reading.reading(None) as first:  # the column cache off: every read reads the file
        a = read_arrays(path, BRANCHES, 0, 5_000)
        b = read_arrays(path, BRANCHES, 5_000, 10_000)
    with reading.reading(None) as second:
        c = read_arrays(path, BRANCHES, 10_000, 15_000)
    assert opens == [path]
    [opened] = first.records()  # the reads and the open's own (header, tree)
    assert opened.bytes > a.bytes_read + b.bytes_read
    assert [(r.lfn, r.server, r.bytes) for r in second.records()] == [
        (opened.lfn, "local", c.bytes_read)]  # its read's bytes, none before it
    for got, (start, stop) in ((a, (0, 5_000)), (c, (10_000, 15_000))):
        expected = cold(files[0], start, stop)
        assert all(ak.array_equal(got.arrays[n], expected[n]) for n in BRANCHES)


def test_a_read_that_fails_drops_the_file(files: list[Path], opens: list[str]) -> None:
    path = str(files[1])
    with reading.reading(None):
        read_arrays(path, BRANCHES, 0, 1_000)
        with pytest.raises(Exception, match="no_such_branch"):
            read_arrays(path, ["no_such_branch"], 0, 1_000)
        assert len(open_files.files()) == 0
        again = read_arrays(path, BRANCHES, 0, 1_000)
    assert opens == [path, path] and len(again.arrays["Jet_pt"]) == 1_000


def test_nothing_is_held_outside_a_bundle(files: list[Path], opens: list[str]) -> None:
    for _ in range(2):
        read_arrays(str(files[0]), BRANCHES, 0, 1_000)
    assert len(open_files.files()) == 0 and len(opens) == 2


def test_at_most_the_bound_stay_open_the_least_recent_closed(
        files: list[Path], monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(open_files.files(), "max_files", 2)
    held = open_files.files()._held
    with reading.reading(None):
        for f in files[:2]:
            read_arrays(str(f), BRANCHES, 0, 1_000)
        first = held[str(files[0])].directory.file.source
        read_arrays(str(files[0]), BRANCHES, 0, 1_000)  # now the most recent
        second = held[str(files[1])].directory.file.source
        read_arrays(str(files[2]), BRANCHES, 0, 1_000)
    assert list(held) == [str(files[0]), str(files[2])]
    assert not first.closed and second.closed  # the least recent was closed


def test_a_held_files_pages_leave_the_resident_memory(tmp_path: Path) -> None:
    path = generate_dataset(tmp_path, 1, 100_000, seed=3, basket_events=10_000)[0]
    size_kb = path.stat().st_size // 1024
    before = _rss_file_kb()
    with reading.reading(None):
        read_arrays(str(path), ["Jet_pt", "Jet_eta", "Jet_phi", "Jet_mass", "nJet"], 0,
                    100_000)
    assert len(open_files.files()) == 1
    assert _rss_file_kb() - before < size_kb // 4  # the file's pages were given back


def _rss_file_kb() -> int:
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith("RssFile:"):
                return int(line.split()[1])
    return 0


def test_a_child_making_room_closes_its_files(files: list[Path]) -> None:
    """What a capped child runs before a call whose cap it idles too close to
    (``remote.make_room``) closes the files it keeps open, as well as evicting columns."""
    from datavine.worker import remote

    with reading.reading(None):
        read_arrays(str(files[0]), BRANCHES, 0, 1_000)
    source = open_files.files()._held[str(files[0])].directory.file.source
    assert remote.make_room(1 << 20) == 0  # far under the bound: no column to evict
    assert len(open_files.files()) == 0 and source.closed
