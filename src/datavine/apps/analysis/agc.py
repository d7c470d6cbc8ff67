"""The AGC-style ttbar analysis over one chunk of a NanoAOD ``Events`` tree.

Selection (after the Analysis Grand Challenge's ttbar analysis): at least four jets with
pT > 25 GeV and |eta| < 2.5, at least one of them b-tagged (``btagDeepFlavB > 0.5``), and
exactly one tight lepton (muon with ``tightId`` or electron with ``cutBased >= 4``) with
pT > 30 GeV and |eta| < 2.1. Observable: the invariant mass of the three-jet combination of
the selected jets with the highest pT, among combinations holding at least one b-tagged jet
(as the AGC does), in 25 bins from 50 to 550 GeV.

Only the eleven branches the selection needs are read, through the process's column cache
(:func:`datavine.io.cached_arrays.read_arrays`: inside a datavine run, a worker keeps the
columns it decoded, and a rerun over the same files reads them from memory). The cuts are a
:class:`Selection` (the AGC's by default): a rerun with other cuts reads the same branches.
Everything is vectorised with awkward; the combinatorics run on selected events only.
:class:`ChunkResult` is what a task returns: small, picklable and merged with ``+``.
"""

from __future__ import annotations

import functools
import itertools
import os
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import NamedTuple, TypeAlias

import awkward as ak
import numpy as np
import uproot

from datavine.io.cached_arrays import read_arrays
from datavine.io.reading import open_input

EDGES = np.linspace(50.0, 550.0, 26)
JET_PT, JET_ETA, BTAG = 25.0, 2.5, 0.5
LEPTON_PT, LEPTON_ETA, ELECTRON_TIGHT = 30.0, 2.1, 4

BRANCHES = (
    "Jet_pt", "Jet_eta", "Jet_phi", "Jet_mass", "Jet_btagDeepFlavB",
    "Muon_pt", "Muon_eta", "Muon_tightId",
    "Electron_pt", "Electron_eta", "Electron_cutBased",
)

# a path, a URL, or an open uproot file, directory or tree
Source: TypeAlias = ("str | os.PathLike[str] | uproot.ReadOnlyFile | uproot.ReadOnlyDirectory"
                     " | uproot.TTree")


class Selection(NamedTuple):
    """The cuts (GeV for transverse momenta): the AGC's by default."""

    jet_pt: float = JET_PT
    jet_eta: float = JET_ETA
    btag: float = BTAG
    lepton_pt: float = LEPTON_PT
    lepton_eta: float = LEPTON_ETA
    electron_tight: int = ELECTRON_TIGHT


AGC = Selection()


class Chunk(NamedTuple):
    """One unit of work: entries ``[entry_start, entry_stop)`` of the tree in ``path``."""

    path: str
    entry_start: int
    entry_stop: int


@dataclass(eq=False)
class ChunkResult:
    """Histogram and counters of one chunk, or of several merged with ``+``.

    ``bytes_read`` counts the compressed bytes requested from the source. ``source`` is the
    file's name, or ``""`` once results of different files are merged; ``chunks`` counts the
    chunk results merged into this one (0 for :meth:`empty`).
    """

    counts: np.ndarray
    edges: np.ndarray = field(default_factory=lambda: EDGES.copy())
    events: int = 0
    events_selected: int = 0
    bytes_read: int = 0
    source: str = ""
    chunks: int = 1

    @classmethod
    def empty(cls, edges: np.ndarray | None = None) -> ChunkResult:
        """The neutral element of ``+``."""
        edges = EDGES.copy() if edges is None else np.asarray(edges, dtype=np.float64)
        return cls(np.zeros(len(edges) - 1, np.int64), edges, chunks=0)

    def __add__(self, other: ChunkResult) -> ChunkResult:
        if not isinstance(other, ChunkResult):
            return NotImplemented
        if not np.array_equal(self.edges, other.edges):
            raise ValueError("cannot merge ChunkResults with different histogram binnings")
        if not self.chunks or not other.chunks:
            source = self.source or other.source
        else:
            source = self.source if self.source == other.source else ""
        return ChunkResult(self.counts + other.counts, self.edges,
                           self.events + other.events,
                           self.events_selected + other.events_selected,
                           self.bytes_read + other.bytes_read, source,
                           self.chunks + other.chunks)

    def __radd__(self, other: object) -> ChunkResult:
        # sum(results) starts from 0.
        return self if isinstance(other, int) and other == 0 else NotImplemented

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, ChunkResult):
            return NotImplemented
        return (np.array_equal(self.counts, other.counts)
                and np.array_equal(self.edges, other.edges)
                and (self.events, self.events_selected, self.bytes_read, self.source,
                     self.chunks)
                == (other.events, other.events_selected, other.bytes_read, other.source,
                    other.chunks))

    __hash__ = None  # type: ignore[assignment]

    def __reduce__(self) -> tuple[object, tuple[object, ...]]:
        """Pickled as its fields' values, the counts as their bytes and the binning left
        out when it is the analysis's own (:data:`EDGES`): a merge's call takes its parts
        inline, dozens of them, and two arrays rebuilt for each made up most of the time to
        load them (a chunk's tally: 928 bytes and 8 us to load, now 480 bytes and 3 us)."""
        edges = None if np.array_equal(self.edges, EDGES) else self.edges
        # counts of another binning that are large stay an array (pickled out of band)
        counts = self.counts.tobytes() if self.counts.nbytes <= _COUNTS_AS_BYTES else self.counts
        return _chunk_result, (counts, self.counts.dtype.str, edges, self.events,
                               self.events_selected, self.bytes_read, self.source, self.chunks)

    def same_selection(self, other: ChunkResult) -> bool:
        """Whether ``other`` is the same analysis result: histogram, binning, events and
        events selected (``==`` also compares the bytes read, which a read from the
        workers' column caches, or through another source, changes)."""
        return bool(np.array_equal(self.counts, other.counts)
                    and np.array_equal(self.edges, other.edges)
                    and (self.events, self.events_selected)
                    == (other.events, other.events_selected))


_COUNTS_AS_BYTES = 4096  # counts up to this many bytes pickle as bytes (the AGC's: 200)


def _chunk_result(counts: bytes | np.ndarray, dtype: str, edges: np.ndarray | None,
                  events: int, events_selected: int, bytes_read: int, source: str,
                  chunks: int) -> ChunkResult:
    """A :class:`ChunkResult` from what its ``__reduce__`` gave (counts from bytes copied,
    writable: ``+`` makes new ones, but a caller may add in place)."""
    if isinstance(counts, bytes):
        counts = np.frombuffer(counts, dtype).copy()
    return ChunkResult(counts,
                       EDGES.copy() if edges is None else edges, events, events_selected,
                       bytes_read, source, chunks)


def process_chunk(source: Source, entry_start: int | None = None,
                  entry_stop: int | None = None, tree: str = "Events",
                  selection: Selection = AGC) -> ChunkResult:
    """Run the selection over entries ``[entry_start, entry_stop)`` of ``source``'s tree.

    ``source`` is a local path, a URL uproot opens (``root://``, ``http://``), or an
    already-open uproot file, directory or TTree (left open; ``tree`` is then ignored for a
    TTree). A path or URL is opened with :func:`datavine.open_input` (a memory map for a local
    file; inside a datavine run, the run's shards and its accounting of the bytes read) when
    a column is not in the process's column cache. ``bytes_read`` counts the compressed bytes
    asked of the file (none for columns served from the cache).
    """
    read = read_arrays(source, BRANCHES, entry_start, entry_stop, tree)
    counts, selected = select_and_fill(read.arrays, selection)
    return ChunkResult(counts, EDGES.copy(), len(read.arrays["Jet_pt"]), selected,
                       read.bytes_read, read.path)


def process_item(chunk: tuple[str, int, int], selection: Selection = AGC) -> ChunkResult:
    """:func:`process_chunk` over a ``(path, entry_start, entry_stop)`` work item (a
    :class:`Chunk`, or any such sequence)."""
    path, start, stop = chunk
    return process_chunk(path, start, stop, selection=selection)


def select_and_fill(a: dict[str, ak.Array],
                    selection: Selection = AGC) -> tuple[np.ndarray, int]:
    """The histogram counts and the number of selected events for one chunk's arrays.

    The per-object cuts run on the flat numpy buffers and per-event counts come from
    cumulative sums over the offsets: awkward's per-call overhead would otherwise cost as
    much as reading the chunk.
    """
    cut = selection
    jet = {k: _flat(a[f"Jet_{k}"]) for k in ("pt", "eta", "phi", "mass", "btagDeepFlavB")}
    offsets = _offsets(a["Jet_pt"])
    good_jet = (jet["pt"] > cut.jet_pt) & (np.abs(jet["eta"]) < cut.jet_eta)
    n_good = _count(good_jet, offsets)
    n_b = _count(good_jet & (jet["btagDeepFlavB"] > cut.btag), offsets)
    muon = ((_flat(a["Muon_pt"]) > cut.lepton_pt)
            & (np.abs(_flat(a["Muon_eta"])) < cut.lepton_eta)
            & _flat(a["Muon_tightId"]).astype(bool))
    electron = ((_flat(a["Electron_pt"]) > cut.lepton_pt)
                & (np.abs(_flat(a["Electron_eta"])) < cut.lepton_eta)
                & (_flat(a["Electron_cutBased"]) >= cut.electron_tight))
    n_lepton = _count(muon, _offsets(a["Muon_pt"])) + _count(electron,
                                                             _offsets(a["Electron_pt"]))
    passed = (n_good >= 4) & (n_b >= 1) & (n_lepton == 1)
    selected = int(np.count_nonzero(passed))
    if selected == 0:
        return np.zeros(len(EDGES) - 1, np.int64), 0
    keep = good_jet & np.repeat(passed, np.diff(offsets))
    pt, eta, phi, m, btag = (jet[k][keep] for k in ("pt", "eta", "phi", "mass", "btagDeepFlavB"))
    mass = trijet_mass(n_good[passed], pt, eta, phi, m, btag, btag_cut=cut.btag)
    hist, _ = np.histogram(mass, bins=EDGES)
    return hist.astype(np.int64), selected


def trijet_mass(counts: np.ndarray, pt: np.ndarray, eta: np.ndarray, phi: np.ndarray,
                mass: np.ndarray, btag: np.ndarray, btag_cut: float = BTAG) -> np.ndarray:
    """Per event, the mass of the highest-pT trijet holding at least one b-tagged jet.

    The jets are flat arrays, ``counts[i]`` of them for event ``i`` (at least 3 each).
    Events are grouped by jet multiplicity so that each group's combinations form one
    ``(events, combinations, 3)`` index array: no per-event Python, no jagged broadcasting.
    """
    p4 = _four_momenta(pt, eta, phi, mass)
    is_b = btag > btag_cut
    starts = np.concatenate(([0], np.cumsum(counts)[:-1]))
    out = np.empty(len(counts))
    for k in np.unique(counts):
        events = np.flatnonzero(counts == k)
        rows = np.arange(len(events))
        idx = starts[events, None, None] + _triples(int(k))[None, :, :]
        e, px, py, pz = p4[:, idx].sum(axis=3)  # each (events, combinations)
        pt2 = px**2 + py**2
        best = np.argmax(np.where(is_b[idx].any(axis=2), pt2, -1.0), axis=1)
        m2 = e[rows, best] ** 2 - pt2[rows, best] - pz[rows, best] ** 2
        out[events] = np.sqrt(np.maximum(m2, 0.0))
    return out


def _four_momenta(pt: np.ndarray, eta: np.ndarray, phi: np.ndarray,
                  mass: np.ndarray) -> np.ndarray:
    """(E, px, py, pz) as a (4, n) float64 array."""
    pt = pt.astype(np.float64)
    px, py, pz = pt * np.cos(phi), pt * np.sin(phi), pt * np.sinh(eta)
    return np.stack([np.sqrt(px**2 + py**2 + pz**2 + mass.astype(np.float64) ** 2),
                     px, py, pz])


@functools.cache
def _triples(k: int) -> np.ndarray:
    """All 3-subsets of ``range(k)`` in lexicographic order, as a (C(k,3), 3) array."""
    return np.array(list(itertools.combinations(range(k), 3)), dtype=np.int64).reshape(-1, 3)


def _offsets(array: ak.Array) -> np.ndarray:
    """The list offsets of a jagged branch, rebased to start at 0."""
    layout = array.layout
    offsets = np.asarray(layout.offsets if hasattr(layout, "offsets") else
                         ak.to_layout(ak.to_packed(array)).offsets)
    return offsets - offsets[0]


def _flat(array: ak.Array) -> np.ndarray:
    """The flat content of a jagged branch (only the part its offsets cover)."""
    layout = array.layout
    if hasattr(layout, "offsets") and hasattr(layout.content, "data"):
        offsets = np.asarray(layout.offsets)
        return np.asarray(layout.content.data)[offsets[0]:offsets[-1]]
    return ak.to_numpy(ak.flatten(array))


def _count(mask: np.ndarray, offsets: np.ndarray) -> np.ndarray:
    """Per-event number of true flags, for flags laid out by ``offsets``."""
    total = np.concatenate(([0], np.cumsum(mask, dtype=np.int64)))
    return total[offsets[1:]] - total[offsets[:-1]]


def make_chunks(files: Iterable[str | os.PathLike[str]], chunk_events: int,
                tree: str = "Events") -> list[Chunk]:
    """Split each file's tree into chunks of about ``chunk_events`` entries (equal sizes
    within a file, as coffea does), using the files' entry counts."""
    if chunk_events < 1:
        raise ValueError(f"chunk_events must be >= 1, not {chunk_events}")
    chunks: list[Chunk] = []
    for path in files:
        with open_input(str(path)) as directory:
            n = directory[tree].num_entries
        pieces = max(1, -(-n // chunk_events))
        bounds = [n * i // pieces for i in range(pieces + 1)]
        chunks.extend(Chunk(str(path), lo, hi) for lo, hi in itertools.pairwise(bounds) if hi > lo)
    return chunks


def run_plain_loop(chunks: Iterable[tuple[str, int, int]]) -> ChunkResult:
    """The single-process reference: every chunk in turn, merged in order."""
    total = ChunkResult.empty()
    for chunk in chunks:
        total = total + process_item(chunk)
    return total
