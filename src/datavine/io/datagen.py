"""Synthetic NanoAOD-like ROOT files for throughput tests.

Writes a TTree ``Events`` (``mktree`` + ``extend``: uproot 5.7 writes an RNTuple for
``f["Events"] = {...}``) with NanoAOD's branch names and jagged collections counted by
``nJet``/``nMuon``/``nElectron``. Events are a mixture of semileptonic ttbar (real top and W
decay kinematics, so the AGC trijet mass peaks near 173 GeV) and a multijet/W+jets
background with falling spectra; 2-10% of events pass the AGC selection of
:mod:`datavine.apps.analysis.agc`. Output is deterministic in the seed and the parameters.

Files are written under a temporary name and renamed, and recorded in a JSON manifest
(``datagen.json``) next to them, so a second call with the same parameters does nothing.
This module generates data only; it knows nothing of scheduling.
"""

from __future__ import annotations

import argparse
import json
import os
from collections.abc import Callable, Sequence
from pathlib import Path

import awkward as ak
import numpy as np
import uproot

MANIFEST = "datagen.json"
GENERATOR_VERSION = 1
DEFAULT_BASKET_EVENTS = 25_000
DEFAULT_LEVELS = {"zstd": 5, "lzma": 9, "zlib": 6, "lz4": 4}
_ALGORITHMS = {"zstd": uproot.ZSTD, "lzma": uproot.LZMA, "zlib": uproot.ZLIB, "lz4": uproot.LZ4}

TTBAR_FRACTION = 0.12
WJETS_FRACTION = 0.10
_M_TOP, _M_W, _M_B = 172.5, 80.4, 4.8
# Mantissa bits kept, as in CMS NanoAOD's table definitions; leptons keep full precision.
JET_PRECISION = {"pt": 10, "eta": 12, "phi": 12, "mass": 10, "btagDeepFlavB": 10}
MET_PRECISION = 10

Flat = dict[str, np.ndarray]
Columns = dict[str, np.ndarray | ak.Array]  # a batch of events, as uproot's extend takes it
ManifestEntry = dict[str, int | str]  # one file's parameters and size in the manifest


def compression_for(name: str, level: int | None = None) -> uproot.compression.Compression:
    """uproot's compression object for ``name`` (zstd, lzma, zlib, lz4) at ``level``."""
    key = name.lower()
    if key not in _ALGORITHMS:
        raise ValueError(f"unknown compression {name!r}: expected one of {sorted(_ALGORITHMS)}")
    return _ALGORITHMS[key](DEFAULT_LEVELS[key] if level is None else level)


def generate_dataset(directory: str | os.PathLike[str], n_files: int, events_per_file: int,
                     compression: str = "zstd", seed: int = 0,
                     basket_events: int = DEFAULT_BASKET_EVENTS,
                     level: int | None = None) -> list[Path]:
    """Write ``n_files`` files of ``events_per_file`` events into ``directory``.

    Files already there with the same parameters (per the manifest) are kept as they are.
    Returns the files' paths in order.
    """
    if n_files < 0 or events_per_file < 1 or basket_events < 1:
        raise ValueError("need n_files >= 0, events_per_file >= 1 and basket_events >= 1")
    out = Path(directory)
    out.mkdir(parents=True, exist_ok=True)
    algorithm = compression_for(compression, level)
    paths = []
    for index in range(n_files):
        path = out / f"nanoaod_{index:04d}.root"
        params: ManifestEntry = {
            "version": GENERATOR_VERSION, "events": events_per_file,
            "compression": repr(algorithm), "seed": seed, "file_index": index,
            "basket_events": basket_events}
        if not _up_to_date(path, params):
            write_file(path, events_per_file, algorithm, seed, index, basket_events)
            _record(path, {**params, "size": path.stat().st_size})
        paths.append(path)
    return paths


def write_file(path: Path, n_events: int, algorithm: uproot.compression.Compression,
               seed: int, file_index: int, basket_events: int) -> None:
    """Write one file atomically: a temporary name in the same folder, then a rename."""
    tmp = path.with_name(f".{path.name}.tmp-{os.getpid()}")
    try:
        with uproot.recreate(tmp, compression=algorithm) as f:
            tree = None
            for batch, start in enumerate(range(0, n_events, basket_events)):
                rng = np.random.default_rng(np.random.SeedSequence([seed, file_index, batch]))
                first = file_index * n_events + start + 1
                columns = generate_events(rng, min(basket_events, n_events - start), first)
                if tree is None:
                    tree = f.mktree("Events", {k: _branch_type(v) for k, v in columns.items()},
                                    title="Events")
                tree.extend(columns)
        os.replace(tmp, path)
    finally:
        tmp.unlink(missing_ok=True)


def generate_events(rng: np.random.Generator, n: int, first_event: int) -> Columns:
    """One batch of ``n`` events as uproot ``extend`` columns (records become ``Jet_*``)."""
    kind = rng.choice(3, size=n, p=[TTBAR_FRACTION, WJETS_FRACTION,
                                     1 - TTBAR_FRACTION - WJETS_FRACTION])
    tt = np.flatnonzero(kind == 0)
    wj = np.flatnonzero(kind == 1)
    jets = [_soft_jets(rng, np.arange(n), np.where(kind == 0, 1.5, 5.5))]
    muons = [_nonprompt_leptons(rng, n, 0.3, 3.0)]
    electrons = [_nonprompt_leptons(rng, n, 0.2, 5.0)]
    met_x, met_y = _polar(rng.rayleigh(15.0, n), rng.uniform(-np.pi, np.pi, n))
    tt_jets, tt_lep, nu = _ttbar(rng, tt)
    jets.append(tt_jets)
    wj_lep, wj_nu = _w_lepton(rng, wj)
    for lep in (tt_lep, wj_lep):
        is_mu = rng.random(len(lep["evt"])) < 0.5
        muons.append({k: v[is_mu] for k, v in lep.items()})
        electrons.append({k: v[~is_mu] for k, v in lep.items()})
    for events, (px, py) in ((tt, nu), (wj, wj_nu)):
        np.add.at(met_x, events, px)
        np.add.at(met_y, events, py)
    return {
        "run": np.ones(n, np.uint32),
        "luminosityBlock": ((first_event + np.arange(n)) // 1000 + 1).astype(np.uint32),
        "event": (first_event + np.arange(n)).astype(np.uint64),
        "Jet": _collection(rng, n, jets, {"pt": 15.0, "eta": 4.7}, _jet_fields),
        "Muon": _collection(rng, n, muons, {"pt": 3.0, "eta": 2.4}, _muon_fields),
        "Electron": _collection(rng, n, electrons, {"pt": 5.0, "eta": 2.5}, _electron_fields),
        "MET_pt": _round_mantissa(np.hypot(met_x, met_y), MET_PRECISION),
        "MET_phi": _round_mantissa(np.arctan2(met_y, met_x), MET_PRECISION),
    }


def _soft_jets(rng: np.random.Generator, events: np.ndarray, mean: np.ndarray) -> Flat:
    """QCD-like jets: Poisson multiplicity, pT ~ pT^-3.6 above 15 GeV, 3% b jets."""
    evt = np.repeat(events, rng.poisson(mean))
    m = len(evt)
    pt = np.minimum(15.0 * rng.random(m) ** (-1 / 2.6), 3000.0)
    is_b = rng.random(m) < 0.03
    return {"evt": evt, "pt": pt, "eta": rng.normal(0, 2.0, m), "phi": _phi(rng, m),
            "mass": pt * np.abs(rng.normal(0.10, 0.04, m)), "is_b": is_b}


def _ttbar(rng: np.random.Generator, events: np.ndarray) -> tuple[Flat, Flat, tuple]:
    """Semileptonic ttbar: t -> bW(qq), t -> bW(lnu); jets smeared by 10% in pT."""
    n = len(events)
    phi = _phi(rng, n)
    had = _top(rng, n, phi)
    lep = _top(rng, n, phi + np.pi + rng.normal(0, 0.6, n))
    b1, w1 = _decay(rng, had, _M_B, rng.normal(_M_W, 2.0, n))
    q1, q2 = _decay(rng, w1, 0.0, 0.0)
    b2, w2 = _decay(rng, lep, _M_B, rng.normal(_M_W, 2.0, n))
    lepton, nu = _decay(rng, w2, 0.0, 0.0)
    parts = [_to_jets(rng, p, events, is_b) for p, is_b in
             ((b1, True), (q1, False), (q2, False), (b2, True))]
    jets = {k: np.concatenate([p[k] for p in parts]) for k in parts[0]}
    pt, eta, phi_l = _pt_eta_phi(lepton)
    lep_out = {"evt": events, "pt": pt * rng.normal(1.0, 0.02, n), "eta": eta, "phi": phi_l,
               "prompt": np.ones(n, bool)}
    return jets, lep_out, (nu[1], nu[2])


def _w_lepton(rng: np.random.Generator, events: np.ndarray) -> tuple[Flat, tuple]:
    """The prompt lepton and neutrino of W+jets events (W at rest, no W pT)."""
    n = len(events)
    w = np.stack([np.full(n, _M_W), np.zeros(n), np.zeros(n), rng.normal(0, 60.0, n)])
    w[0] = np.sqrt(_M_W**2 + w[3] ** 2)
    lepton, nu = _decay(rng, w, 0.0, 0.0)
    pt, eta, phi = _pt_eta_phi(lepton)
    return ({"evt": events, "pt": pt, "eta": eta, "phi": phi, "prompt": np.ones(n, bool)},
            (nu[1], nu[2]))


def _nonprompt_leptons(rng: np.random.Generator, n: int, mean: float, pt_min: float) -> Flat:
    """Leptons from heavy-flavour decays: soft (pT^-3 spectrum), mostly failing tight ID."""
    evt = np.repeat(np.arange(n), rng.poisson(mean, n))
    m = len(evt)
    return {"evt": evt, "pt": pt_min * rng.random(m) ** (-1 / 2.0), "eta": rng.normal(0, 1.4, m),
            "phi": _phi(rng, m), "prompt": np.zeros(m, bool)}


def _top(rng: np.random.Generator, n: int, phi: np.ndarray) -> np.ndarray:
    """Top quark four-momenta (E, px, py, pz): pT ~ Gamma(2, 50 GeV), eta ~ N(0, 1.3)."""
    pt = rng.gamma(2.0, 50.0, n)
    pz = pt * np.sinh(rng.normal(0, 1.3, n))
    mass = rng.normal(_M_TOP, 1.5, n)
    px, py = _polar(pt, phi)
    return np.stack([np.sqrt(mass**2 + pt**2 + pz**2), px, py, pz])


def _decay(rng: np.random.Generator, parent: np.ndarray, m1: float | np.ndarray,
           m2: float | np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Isotropic two-body decay of ``parent`` (4 x n), boosted into the lab frame."""
    n = parent.shape[1]
    mass = np.sqrt(np.maximum(parent[0] ** 2 - (parent[1:] ** 2).sum(axis=0), 0.0))
    m1 = np.broadcast_to(m1, n)
    m2 = np.broadcast_to(m2, n)
    p = np.sqrt(np.maximum((mass**2 - (m1 + m2) ** 2) * (mass**2 - (m1 - m2) ** 2), 0.0))
    p = p / (2 * mass)
    cos = rng.uniform(-1, 1, n)
    sin = np.sqrt(1 - cos**2)
    phi = _phi(rng, n)
    direction = np.stack([sin * np.cos(phi), sin * np.sin(phi), cos])
    first = np.vstack([np.sqrt(m1**2 + p**2), p * direction])
    second = np.vstack([np.sqrt(m2**2 + p**2), -p * direction])
    beta = parent[1:] / parent[0]
    return _boost(first, beta), _boost(second, beta)


def _boost(p4: np.ndarray, beta: np.ndarray) -> np.ndarray:
    b2 = (beta**2).sum(axis=0)
    gamma = 1 / np.sqrt(1 - b2)
    bp = (beta * p4[1:]).sum(axis=0)
    g2 = np.where(b2 > 0, (gamma - 1) / np.where(b2 > 0, b2, 1), 0.0)
    space = p4[1:] + (g2 * bp + gamma * p4[0]) * beta
    return np.vstack([gamma * (p4[0] + bp), space])


def _to_jets(rng: np.random.Generator, p4: np.ndarray, events: np.ndarray, is_b: bool) -> Flat:
    pt, eta, phi = _pt_eta_phi(p4)
    n = len(events)
    pt = pt * rng.normal(1.0, 0.10, n)
    return {"evt": events, "pt": pt, "eta": eta, "phi": phi,
            "mass": np.abs(pt) * np.abs(rng.normal(0.06, 0.02, n)),
            "is_b": np.full(n, is_b)}


def _collection(rng: np.random.Generator, n: int, parts: list[Flat], cuts: dict[str, float],
                fields: Callable[[np.random.Generator, Flat], Flat]) -> ak.Array:
    """Merge per-source objects into a pT-ordered jagged collection, after acceptance cuts
    (applied to the stored, rounded values)."""
    flat = {k: np.concatenate([p[k] for p in parts]) for k in parts[0]}
    order = np.lexsort((-flat["pt"], flat["evt"]))
    flat = {k: v[order] for k, v in flat.items()}
    columns = fields(rng, flat)
    keep = (columns["pt"] > cuts["pt"]) & (np.abs(columns["eta"]) < cuts["eta"])
    counts = np.bincount(flat["evt"][keep], minlength=n)
    return ak.zip({k: ak.unflatten(v[keep], counts) for k, v in columns.items()})


def _jet_fields(rng: np.random.Generator, flat: Flat) -> dict[str, np.ndarray]:
    m = len(flat["pt"])
    # DeepJet-like score: b jets pass 0.5 in 75% of cases, light jets in ~0.5%.
    btag = np.where(flat["is_b"], rng.beta(2.0, 1.0, m), rng.beta(0.4, 6.0, m))
    out = {**_kinematics(flat), "mass": flat["mass"], "btagDeepFlavB": btag}
    return {k: _round_mantissa(v, JET_PRECISION[k]) for k, v in out.items()}


def _muon_fields(rng: np.random.Generator, flat: Flat) -> dict[str, np.ndarray]:
    m = len(flat["pt"])
    tight = np.where(flat["prompt"], rng.random(m) < 0.95, rng.random(m) < 0.5)
    return {**_kinematics(flat), "mass": np.full(m, 0.1057, np.float32),
            "charge": rng.choice(np.array([-1, 1], np.int32), m), "tightId": tight}


def _electron_fields(rng: np.random.Generator, flat: Flat) -> dict[str, np.ndarray]:
    m = len(flat["pt"])
    prompt = rng.choice(5, m, p=[0.02, 0.03, 0.05, 0.10, 0.80])
    fake = rng.choice(5, m, p=[0.40, 0.25, 0.15, 0.10, 0.10])
    return {**_kinematics(flat), "mass": np.full(m, 0.000511, np.float32),
            "charge": rng.choice(np.array([-1, 1], np.int32), m),
            "cutBased": np.where(flat["prompt"], prompt, fake).astype(np.int32)}


def _round_mantissa(values: np.ndarray, bits: int) -> np.ndarray:
    """float32 rounded to ``bits`` mantissa bits, as NanoAOD stores most jet variables
    (``precision=10``); it is what makes real NanoAOD floats compress."""
    shift = 23 - bits
    raw = np.asarray(values, np.float32).view(np.uint32)
    rounded = (raw + np.uint32(1 << (shift - 1))) & np.uint32((0xFFFFFFFF >> shift) << shift)
    return rounded.view(np.float32)


def _kinematics(flat: Flat) -> dict[str, np.ndarray]:
    return {k: flat[k].astype(np.float32) for k in ("pt", "eta", "phi")}


def _pt_eta_phi(p4: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    pt = np.hypot(p4[1], p4[2])
    return pt, np.arcsinh(p4[3] / np.maximum(pt, 1e-9)), np.arctan2(p4[2], p4[1])


def _polar(r: np.ndarray, phi: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    return r * np.cos(phi), r * np.sin(phi)


def _phi(rng: np.random.Generator, n: int) -> np.ndarray:
    return rng.uniform(-np.pi, np.pi, n)


def _branch_type(column: np.ndarray | ak.Array) -> object:
    """The branch type uproot's mktree takes for ``column``: its awkward type or dtype."""
    return column.type.content if isinstance(column, ak.Array) else column.dtype


def _up_to_date(path: Path, params: ManifestEntry) -> bool:
    entry = _read_manifest(path.parent).get(path.name)
    if entry is None or not path.exists():
        return False
    return entry == {**params, "size": path.stat().st_size}


def _read_manifest(directory: Path) -> dict[str, ManifestEntry]:
    try:
        return json.loads((directory / MANIFEST).read_text())["files"]
    except (OSError, ValueError, KeyError):
        return {}


def _record(path: Path, entry: ManifestEntry) -> None:
    files = _read_manifest(path.parent)
    files[path.name] = entry
    manifest = path.parent / MANIFEST
    tmp = manifest.with_name(f".{MANIFEST}.tmp-{os.getpid()}")
    tmp.write_text(json.dumps({"generator": "datavine.io.datagen", "files": files},
                              indent=1, sort_keys=True))
    os.replace(tmp, manifest)


def main(argv: Sequence[str] | None = None) -> int:
    """``python -m datavine.io.datagen --out DIR --files N --events M --compression zstd``."""
    parser = argparse.ArgumentParser(prog="python -m datavine.io.datagen", description=__doc__
                                     .splitlines()[0])
    parser.add_argument("--out", required=True, type=Path, help="output folder")
    parser.add_argument("--files", type=int, default=1, help="number of files")
    parser.add_argument("--events", type=int, default=100_000, help="events per file")
    parser.add_argument("--compression", default="zstd", choices=sorted(_ALGORITHMS))
    parser.add_argument("--level", type=int, default=None,
                        help=f"compression level (default {DEFAULT_LEVELS})")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--basket-events", type=int, default=DEFAULT_BASKET_EVENTS)
    args = parser.parse_args(argv)
    for path in generate_dataset(args.out, args.files, args.events, args.compression,
                                 args.seed, args.basket_events, args.level):
        print(path)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
