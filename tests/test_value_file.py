"""The file a bundle leaves its large outputs in (datavine.worker.value_file), and the worker
code that writes and reads it (``_pack`` and ``execute_bundle``'s input files): values
taken from the mapped file equal what was computed, arrays come back as writable views of the
file that a task may change without changing the file, a file cut short or of another kind
is reported as lost (its producer runs again), and a manager reads a fetched file's bytes."""

from __future__ import annotations

import dataclasses
import os
import pickle
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from datavine.protocol import BundleSpec, Status
from datavine.scheduler import graph as graphs
from datavine.worker import remote, value_file
from datavine.worker.value_file import ValueFile, ValueFileError


@dataclasses.dataclass
class Counts:
    """A small result that travels with an array (as the AGC chunk result does)."""

    n: int
    edges: np.ndarray


def _values() -> dict[Any, Any]:
    return {
        ("hist", 0): np.arange(640 * 320, dtype=np.float64).reshape(640, 320),
        ("hist", 1): np.asfortranarray(np.ones((7, 5), dtype=np.float32)),
        "pair": (Counts(3, np.linspace(0, 1, 11)), np.full(1000, 2.5)),
        "ints": np.arange(17, dtype=np.int16),  # an odd size: the next buffer is realigned
        "empty": np.zeros(0),
        "scalar": np.float64(4.0),
        "plain": {"a": [1, 2, 3], "b": "text", "c": None, "d": b"bytes"},
        "fn": (lambda x: x + 1),  # cloudpickle: functions travel by value
    }


def _same(a: Any, b: Any) -> bool:
    if isinstance(a, np.ndarray):
        return (isinstance(b, np.ndarray) and a.dtype == b.dtype and a.shape == b.shape
                and bool(np.array_equal(a, b)))
    if isinstance(a, tuple):
        return isinstance(b, tuple) and len(a) == len(b) and all(map(_same, a, b))
    if isinstance(a, Counts):
        return isinstance(b, Counts) and a.n == b.n and _same(a.edges, b.edges)
    if callable(a):
        return callable(b) and a(1) == b(1)
    return bool(a == b)


def _write(path: Path, values: dict[Any, Any]) -> None:
    value_file.write_values(str(path), {k: value_file.pickled(v) for k, v in values.items()})


def test_values_read_from_the_mapped_file_equal_those_written(tmp_path: Path) -> None:
    values = _values()
    _write(tmp_path / "f", values)
    opened = ValueFile.open(str(tmp_path / "f"))
    assert set(opened.keys()) == set(values)
    for key, value in values.items():
        assert _same(value, opened.load(key)), key
    # the same bytes through the manager's reader (a fetched file)
    loaded = value_file.loads_values((tmp_path / "f").read_bytes())
    assert all(_same(values[k], loaded[k]) for k in values)


def test_analysis_objects_round_trip_and_stay_mutable(tmp_path: Path) -> None:
    """What coffea processors return: awkward arrays, and histograms a merge fills further
    (a histogram taken from the mapping is filled in place: copy-on-write)."""
    ak = pytest.importorskip("awkward")
    hist = pytest.importorskip("hist")
    jagged = ak.Array([[1.0, 2.0, 3.0], [], [4.5]])
    h = hist.Hist.new.Reg(10, 0, 1, name="x").Weight()
    h.fill(np.linspace(0.05, 0.95, 1000))
    _write(tmp_path / "f", {"jagged": jagged, "h": h})
    opened = ValueFile.open(str(tmp_path / "f"))
    assert ak.to_list(opened.load("jagged")) == ak.to_list(jagged)
    taken = opened.load("h")
    assert taken == h
    taken.fill([0.5])
    assert taken.sum().value == h.sum().value + 1
    assert ValueFile.open(str(tmp_path / "f")).load("h") == h  # the file is unchanged


def test_arrays_are_aligned_writable_views_of_the_file(tmp_path: Path) -> None:
    values = _values()
    _write(tmp_path / "f", values)
    size = (tmp_path / "f").stat().st_size
    hist = ValueFile.open(str(tmp_path / "f")).load(("hist", 0))
    assert isinstance(hist, np.ndarray)
    assert not hist.flags.owndata  # a view of the mapping, not a copy
    assert hist.ctypes.data % 64 == 0 and hist.flags.writeable
    for key in (("hist", 1), "ints"):
        array = ValueFile.open(str(tmp_path / "f")).load(key)
        assert isinstance(array, np.ndarray) and array.ctypes.data % array.itemsize == 0
    hist += 1.0  # a task that changes its input in place changes its own copy only
    again = ValueFile.open(str(tmp_path / "f")).load(("hist", 0))
    assert isinstance(again, np.ndarray) and _same(values[("hist", 0)], again)
    assert (tmp_path / "f").stat().st_size == size


def test_a_value_stays_readable_after_its_file_is_dropped(tmp_path: Path) -> None:
    """TaskVine unlinks a cache file when the manager undeclares it; a value a running task
    took from it stays valid (the mapping holds the file's pages)."""
    _write(tmp_path / "f", {"a": np.arange(1000.0)})
    a = ValueFile.open(str(tmp_path / "f")).load("a")
    os.unlink(tmp_path / "f")
    assert isinstance(a, np.ndarray) and float(a.sum()) == sum(range(1000))


def _mappings_of(path: Path) -> int:
    with open("/proc/self/maps") as maps:
        return sum(str(path) in line for line in maps)


def test_the_mapping_lives_as_long_as_the_values_taken_from_it(tmp_path: Path) -> None:
    """The library and its capped child live across many calls: a bundle's inputs must not
    leave mappings (memory, and disk space TaskVine has freed) behind once the values are
    gone."""
    _write(tmp_path / "f", {"a": np.arange(1 << 20, dtype=np.float64), "b": 1})
    opened = ValueFile.open(str(tmp_path / "f"))
    a = opened.load("a")
    del opened
    assert _mappings_of(tmp_path / "f") == 1  # a view of the file's pages
    del a
    assert _mappings_of(tmp_path / "f") == 0


def test_large_arrays_are_not_copied_into_the_pickle() -> None:
    big = np.ones(1 << 20)
    kept = value_file.pickled(big)
    assert len(kept.stream) < 1000 and kept.nbytes >= big.nbytes
    strided = np.ones((1000, 100))[:, ::2]  # not contiguous: pickled in band, still exact
    in_band = value_file.pickled(strided)
    assert not in_band.buffers and in_band.nbytes >= strided.nbytes


@pytest.mark.parametrize("damage", ["empty", "cut", "other format", "no trailer"])
def test_a_damaged_file_is_refused(tmp_path: Path, damage: str) -> None:
    _write(tmp_path / "f", {"a": np.arange(10_000.0)})
    data = (tmp_path / "f").read_bytes()
    bad = {"empty": b"", "cut": data[:len(data) // 2] + data[-16:],
           "other format": pickle.dumps({"a": b"x" * 100}), "no trailer": data[:-16]}[damage]
    (tmp_path / "f").write_bytes(bad)
    with pytest.raises(ValueFileError):
        ValueFile.open(str(tmp_path / "f")).load("a")


def test_an_empty_file_holds_nothing(tmp_path: Path) -> None:
    value_file.write_values(str(tmp_path / "f"), {})
    opened = ValueFile.open(str(tmp_path / "f"))
    assert not opened.keys()
    with pytest.raises(KeyError):
        opened.load("a")


# --- the worker's side: _pack writes the file, execute_bundle reads it --------------------------
def make(i: int) -> Any:
    return np.full(1 << 16, float(i))  # 512 KiB


def add(*parts: Any) -> Any:
    return sum(parts[1:], parts[0])


def scale_in_place(a: Any) -> Any:
    a *= 2.0  # changes its input: the file must not change
    return a


def _run(spec: BundleSpec, sandbox: Path) -> Any:
    cwd = os.getcwd()
    os.chdir(sandbox)
    try:
        return remote.execute_bundle(spec)
    finally:
        os.chdir(cwd)


def test_a_bundles_kept_outputs_reach_its_consumers_whole(tmp_path: Path) -> None:
    dsk: dict[Any, Any] = {("make", i): (make, i) for i in range(4)}
    dsk["small"] = (len, "ab")
    dsk["sum"] = (add, *[("make", i) for i in range(4)])
    dsk["twice"] = (scale_in_place, ("make", 0))
    graph = graphs.build(dsk, ["sum", "twice", "small"])
    producer = BundleSpec(
        nodes=[(k, graph.nodes[k]) for k in [*[("make", i) for i in range(4)], "small"]],
        outputs=[*[("make", i) for i in range(4)], "small"],
        store={**{("make", i): "dv-0" for i in range(4)}, "small": "dv-0"},
        inline_max=1024)
    made = _run(producer, tmp_path)
    assert made.status is Status.OK, made.message
    assert set(made.stored) == {("make", i) for i in range(4)}  # "small" came back inline
    assert all(n >= make(0).nbytes for n in made.stored.values())
    assert set(made.values) == {"small"} and pickle.loads(made.values["small"]) == 2
    inputs = {("make", i): "dv-in-1" for i in range(4)}
    os.link(tmp_path / "dv-0", tmp_path / "dv-in-1")  # as TaskVine links its cache file
    consumer = BundleSpec(nodes=[("sum", graph.nodes["sum"]), ("twice", graph.nodes["twice"])],
                          input_files=inputs, outputs=["sum", "twice"], inline_max=1024)
    done = _run(consumer, tmp_path)
    assert done.status is Status.OK, done.message
    assert _mappings_of(tmp_path / "dv-in-1") == 0  # nothing of the inputs outlives the call
    assert np.array_equal(pickle.loads(done.values["sum"]), make(0) + make(1) + make(2) + make(3))
    assert np.array_equal(pickle.loads(done.values["twice"]), 2 * make(0))
    # the file still holds what was made: a retry, or another consumer, reads the same
    assert np.array_equal(ValueFile.open(str(tmp_path / "dv-0")).load(("make", 0)), make(0))


@pytest.mark.parametrize("damage", ["missing", "cut"])
def test_an_input_file_that_cannot_be_read_is_reported_lost(tmp_path: Path, damage: str) -> None:
    graph = graphs.build({"a": (make, 1), "b": (add, "a", "a")}, ["b"])
    if damage == "cut":
        _write(tmp_path / "dv-in-1", {"a": make(1)})
        data = (tmp_path / "dv-in-1").read_bytes()
        (tmp_path / "dv-in-1").write_bytes(data[:len(data) // 2])
    spec = BundleSpec(nodes=[("b", graph.nodes["b"])], input_files={"a": "dv-in-1"},
                      outputs=["b"])
    result = _run(spec, tmp_path)
    assert result.status is Status.LOST and result.key == "a", result
    assert "dv-in-1" in result.message
