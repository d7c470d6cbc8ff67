"""The AGC-style analysis on generated files: selection, chunking, merging, bytes read."""

from __future__ import annotations

import itertools
import pickle
from dataclasses import replace
from pathlib import Path

import awkward as ak
import numpy as np
import pytest
import uproot

from datavine.apps.analysis import (
    Chunk,
    ChunkResult,
    agc,
    make_chunks,
    process_chunk,
    run_plain_loop,
)
from datavine.io.datagen import generate_dataset

EVENTS = 20_000


@pytest.fixture(scope="module")
def files(tmp_path_factory: pytest.TempPathFactory) -> list[Path]:
    out = tmp_path_factory.mktemp("agc")
    return generate_dataset(out, 2, EVENTS, seed=11, basket_events=5_000)


@pytest.fixture(scope="module")
def whole(files: list[Path]) -> ChunkResult:
    return process_chunk(files[0])


def reference_masses(path: Path) -> np.ndarray:
    """The observable written plainly with awkward (ak.combinations), as the AGC does."""
    with uproot.open(path) as f:
        ev = f["Events"].arrays(list(agc.BRANCHES))
    jets = ak.zip({k: ev[f"Jet_{k}"] for k in ("pt", "eta", "phi", "mass", "btagDeepFlavB")})
    jets = jets[(jets.pt > 25) & (abs(jets.eta) < 2.5)]
    muons = ev.Muon_pt[(ev.Muon_pt > 30) & (abs(ev.Muon_eta) < 2.1) & ev.Muon_tightId]
    electrons = ev.Electron_pt[(ev.Electron_pt > 30) & (abs(ev.Electron_eta) < 2.1)
                               & (ev.Electron_cutBased >= 4)]
    selected = ((ak.num(jets) >= 4) & (ak.sum(jets.btagDeepFlavB > 0.5, axis=1) >= 1)
                & (ak.num(muons) + ak.num(electrons) == 1))
    jets = jets[selected]
    px, py, pz = jets.pt * np.cos(jets.phi), jets.pt * np.sin(jets.phi), jets.pt * np.sinh(
        jets.eta)
    p4 = ak.zip({"px": px, "py": py, "pz": pz, "e": np.sqrt(px**2 + py**2 + pz**2
                                                             + jets.mass**2),
                 "b": jets.btagDeepFlavB})
    tri = ak.combinations(p4, 3, fields=["a", "b", "c"])
    tx, ty = tri.a.px + tri.b.px + tri.c.px, tri.a.py + tri.b.py + tri.c.py
    tz, te = tri.a.pz + tri.b.pz + tri.c.pz, tri.a.e + tri.b.e + tri.c.e
    has_b = (tri.a.b > 0.5) | (tri.b.b > 0.5) | (tri.c.b > 0.5)
    tx, ty, tz, te = (x[has_b] for x in (tx, ty, tz, te))
    best = ak.argmax(tx**2 + ty**2, axis=1, keepdims=True)
    mass2 = te[best] ** 2 - tx[best] ** 2 - ty[best] ** 2 - tz[best] ** 2
    return np.sqrt(np.maximum(ak.to_numpy(ak.flatten(mass2)), 0))


def test_selection_keeps_a_few_percent_and_peaks_near_the_top_mass(whole: ChunkResult,
                                                                   files: list[Path]) -> None:
    assert whole.events == EVENTS
    assert 0.02 * EVENTS < whole.events_selected < 0.10 * EVENTS
    assert 0.9 * whole.events_selected <= whole.counts.sum() <= whole.events_selected
    peak = whole.edges[np.argmax(whole.counts)] + 10
    assert 150 < peak < 200
    assert whole.source == str(files[0])
    assert whole.chunks == 1


def test_matches_an_awkward_reference(whole: ChunkResult, files: list[Path]) -> None:
    masses = reference_masses(files[0])
    assert len(masses) == whole.events_selected
    expected, _ = np.histogram(masses, bins=agc.EDGES)
    np.testing.assert_array_equal(whole.counts, expected)


def test_chunks_merge_to_the_whole_file(whole: ChunkResult, files: list[Path]) -> None:
    chunks = make_chunks(files[:1], 3_000)
    assert len(chunks) == 7
    merged = run_plain_loop(chunks)
    np.testing.assert_array_equal(merged.counts, whole.counts)
    assert (merged.events, merged.events_selected) == (whole.events, whole.events_selected)
    assert merged.source == whole.source and merged.chunks == 7
    # unaligned chunks re-read shared baskets: at least the whole file's bytes
    assert merged.bytes_read >= whole.bytes_read


def test_a_result_read_from_memory_is_the_same_selection(whole: ChunkResult,
                                                         files: list[Path]) -> None:
    """A chunk whose columns came from a worker's column cache reads no bytes: the same
    analysis result, though not ``==`` (which compares the bytes read too)."""
    from_memory = replace(whole, bytes_read=0)
    assert from_memory.same_selection(whole) and from_memory != whole
    one_less = replace(whole, counts=whole.counts - (np.arange(len(whole.counts)) == 0))
    assert not one_less.same_selection(whole)
    assert not replace(whole, events_selected=whole.events_selected + 1).same_selection(whole)
    assert not process_chunk(files[1]).same_selection(whole)


def test_plain_loop_over_two_files(files: list[Path], whole: ChunkResult) -> None:
    total = run_plain_loop(make_chunks(files, 5_000))
    second = process_chunk(files[1])
    both = whole + second
    np.testing.assert_array_equal(total.counts, both.counts)
    assert (total.events_selected, total.chunks) == (both.events_selected, 8)
    assert total.events == 2 * EVENTS
    assert total.source == ""  # results of different files
    # basket-aligned chunks read exactly the bytes of the whole files
    assert total.bytes_read == whole.bytes_read + second.bytes_read


def test_bytes_read_are_the_branches_compressed_bytes(whole: ChunkResult,
                                                      files: list[Path]) -> None:
    with uproot.open(files[0]) as f:
        tree = f["Events"]
        needed = sum(tree[name].compressed_bytes for name in agc.BRANCHES)
        everything = sum(branch.compressed_bytes for branch in tree.branches)
    assert whole.bytes_read == needed
    assert whole.bytes_read < everything  # only the branches the selection needs


def test_open_file_directory_and_tree_sources(files: list[Path]) -> None:
    by_path = process_chunk(files[0], 2_000, 9_000)
    with uproot.open(files[0]) as directory:
        for source in (directory, directory.file, directory["Events"]):
            result = process_chunk(source, 2_000, 9_000)
            assert result == by_path
    assert by_path.events == 7_000


def test_a_chunk_is_read_through_the_read_layer_and_accounted(files: list[Path]) -> None:
    from datavine.apps.analysis.sources import LocalFiles
    from datavine.io import reading

    chunk = Chunk(str(files[0]), 2_000, 9_000)
    with reading.reading(None) as ctx:
        out = LocalFiles().process(chunk)
    assert out.result == process_chunk(files[0], 2_000, 9_000)
    assert out.servers == {"local": 1} and out.failovers == 0
    [record] = ctx.records()
    assert (record.lfn, record.server, record.rack) == (str(files[0]), "local", None)
    # the whole open (header and metadata too), not only the branches' baskets
    assert record.bytes > out.result.bytes_read > 0
    assert record.read_s == 0.0  # only a server's reads are clocked (the shards' pace)


def test_make_chunks_covers_each_file_once(files: list[Path]) -> None:
    chunks = make_chunks(files, 6_000)
    assert all(isinstance(c, Chunk) for c in chunks)
    for path in files:
        mine = [c for c in chunks if c.path == str(path)]
        assert mine[0].entry_start == 0 and mine[-1].entry_stop == EVENTS
        assert all(a.entry_stop == b.entry_start for a, b in itertools.pairwise(mine))
        assert max(c.entry_stop - c.entry_start for c in mine) <= 6_000
    assert len(make_chunks(files, 10**9)) == 2
    with pytest.raises(ValueError):
        make_chunks(files, 0)


def test_chunk_result_merges_and_pickles(whole: ChunkResult) -> None:
    empty = ChunkResult.empty()
    assert empty.events == 0 and empty.chunks == 0 and empty.counts.sum() == 0
    assert empty + whole == whole and whole + empty == whole
    assert sum([whole, whole]) == whole + whole
    doubled = whole + whole
    np.testing.assert_array_equal(doubled.counts, 2 * whole.counts)
    assert doubled.source == whole.source
    assert pickle.loads(pickle.dumps(whole)) == whole
    with pytest.raises(ValueError, match="binning"):
        whole + ChunkResult.empty(np.linspace(0, 100, 11))
    # another binning and counts' type come back as they were; the analysis's own
    # binning is left out of the pickle; the counts that come back may be added to in place
    other = ChunkResult(np.arange(10, dtype=np.int32), np.linspace(0, 100, 11), 5, 3, 7,
                        "f.root", 2)
    back = pickle.loads(pickle.dumps(other, protocol=5))
    assert back == other and back.counts.dtype == np.int32
    assert len(pickle.dumps(whole, protocol=5)) < whole.edges.nbytes + whole.counts.nbytes
    back = pickle.loads(pickle.dumps(whole, protocol=5))
    back.counts += 1
    np.testing.assert_array_equal(back.counts, whole.counts + 1)
    # large counts of another binning stay an array: its memory goes out of band
    large = ChunkResult(np.arange(100_000, dtype=np.int64), np.linspace(0, 1, 100_001))
    buffers: list[pickle.PickleBuffer] = []
    blob = pickle.dumps(large, protocol=5, buffer_callback=buffers.append)
    assert len(blob) < large.counts.nbytes and buffers
    assert pickle.loads(blob, buffers=buffers) == large


def brute_force_trijet_mass(pt: np.ndarray, eta: np.ndarray, phi: np.ndarray,
                            mass: np.ndarray, btag: np.ndarray) -> float:
    """One event, every triple in turn."""
    best = (-1.0, 0.0)
    for triple in itertools.combinations(range(len(pt)), 3):
        t = list(triple)
        if not (btag[t] > 0.5).any():
            continue
        px, py = (pt[t] * np.cos(phi[t])).sum(), (pt[t] * np.sin(phi[t])).sum()
        pz = (pt[t] * np.sinh(eta[t])).sum()
        e = np.sqrt((pt[t] * np.cosh(eta[t])) ** 2 + mass[t] ** 2).sum()
        best = max(best, (px**2 + py**2, np.sqrt(max(e**2 - px**2 - py**2 - pz**2, 0.0))))
    return best[1]


def test_trijet_mass_equals_a_brute_force_loop() -> None:
    rng = np.random.default_rng(5)
    counts = rng.integers(4, 10, size=60)
    n = counts.sum()
    jets = {"pt": rng.uniform(25, 300, n), "eta": rng.uniform(-2.5, 2.5, n),
            "phi": rng.uniform(-np.pi, np.pi, n), "mass": rng.uniform(0, 30, n),
            "btag": rng.uniform(0, 1, n)}
    starts = np.concatenate(([0], np.cumsum(counts)))
    odd = starts[1:-1:2]  # every other event gets a b-tagged leading jet
    jets["btag"][odd] = np.maximum(jets["btag"][odd], 0.6)
    has_b = np.add.reduceat(jets["btag"] > 0.5, starts[:-1]) > 0
    keep = np.repeat(has_b, counts)
    counts = counts[has_b]
    jets = {k: v[keep] for k, v in jets.items()}
    got = agc.trijet_mass(counts, jets["pt"], jets["eta"], jets["phi"], jets["mass"],
                          jets["btag"])
    starts = np.concatenate(([0], np.cumsum(counts)))
    expected = [brute_force_trijet_mass(*(v[a:b] for v in jets.values()))
                for a, b in itertools.pairwise(starts)]
    assert len(got) == len(expected) > 30
    np.testing.assert_allclose(got, expected, rtol=1e-9)
