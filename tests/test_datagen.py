"""datagen: real NanoAOD-like files written with uproot, read back with uproot."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import awkward as ak
import numpy as np
import pytest
import uproot

from datavine.io import datagen

EVENTS = 20_000
BRANCHES = {
    "run", "luminosityBlock", "event",
    "nJet", "Jet_pt", "Jet_eta", "Jet_phi", "Jet_mass", "Jet_btagDeepFlavB",
    "nMuon", "Muon_pt", "Muon_eta", "Muon_phi", "Muon_mass", "Muon_charge", "Muon_tightId",
    "nElectron", "Electron_pt", "Electron_eta", "Electron_phi", "Electron_mass",
    "Electron_charge", "Electron_cutBased",
    "MET_pt", "MET_phi",
}
HEADERS = {"zstd": b"ZS", "lzma": b"XZ", "zlib": b"ZL", "lz4": b"L4"}


@pytest.fixture(scope="module")
def dataset(tmp_path_factory: pytest.TempPathFactory) -> list[Path]:
    out = tmp_path_factory.mktemp("datagen")
    return datagen.generate_dataset(out, 2, EVENTS, seed=7, basket_events=5_000)


def basket_header(path: Path, branch: str) -> bytes:
    """The compression algorithm's 2-byte tag at the start of the branch's first basket."""
    with uproot.open(path) as f:
        seek = int(f["Events"][branch].member("fBasketSeek")[0])
    with open(path, "rb") as raw:
        raw.seek(seek)
        key = raw.read(16)  # TKey: fNbytes(4) fVersion(2) fObjlen(4) fDatime(4) fKeylen(2)
        key_length = int.from_bytes(key[14:16], "big")
        raw.seek(seek + key_length)
        return raw.read(2)


def test_files_have_nanoaod_branches_and_entries(dataset: list[Path]) -> None:
    assert [p.name for p in dataset] == ["nanoaod_0000.root", "nanoaod_0001.root"]
    for path in dataset:
        with uproot.open(path) as f:
            tree = f["Events"]
            assert isinstance(tree, uproot.TTree)
            assert set(tree.keys()) == BRANCHES
            assert tree.num_entries == EVENTS
            assert tree["Jet_pt"].num_baskets == EVENTS // 5_000
            arrays = tree.arrays(["nJet", "Jet_pt", "nMuon", "Muon_pt", "event"])
            assert ak.all(arrays.nJet == ak.num(arrays.Jet_pt))
            assert ak.all(arrays.nMuon == ak.num(arrays.Muon_pt))
    with uproot.open(dataset[1]) as f:
        # event numbers continue across files
        assert f["Events"]["event"].array(entry_stop=1)[0] == EVENTS + 1


def test_distributions_are_plausible(dataset: list[Path]) -> None:
    with uproot.open(dataset[0]) as f:
        a = f["Events"].arrays(["Jet_pt", "Jet_eta", "Jet_btagDeepFlavB", "Muon_pt",
                                "Muon_tightId", "MET_pt"])
    n_jet = ak.num(a.Jet_pt)
    assert 4.5 < ak.mean(n_jet) < 6.5
    assert ak.min(a.Jet_pt) > 15.0
    # pT-ordered within each event, falling spectrum: most jets soft, a tail above 100 GeV
    assert ak.all(a.Jet_pt[:, :-1] >= a.Jet_pt[:, 1:])
    pt = ak.to_numpy(ak.flatten(a.Jet_pt))
    assert 0.5 < np.mean(pt < 30) < 0.9
    assert 0.005 < np.mean(pt > 100) < 0.1
    assert ak.max(abs(a.Jet_eta)) < 4.7
    btag = ak.to_numpy(ak.flatten(a.Jet_btagDeepFlavB))
    assert ((btag >= 0) & (btag <= 1)).all()
    assert 0.01 < np.mean(btag > 0.5) < 0.15
    assert ak.all(a.MET_pt >= 0)


@pytest.mark.parametrize("name", sorted(HEADERS))
def test_compression_is_the_one_asked_for(tmp_path: Path, name: str) -> None:
    [path] = datagen.generate_dataset(tmp_path, 1, 2_000, compression=name)
    expected = datagen.compression_for(name)
    with uproot.open(path) as f:
        assert f.file.compression == expected
        assert f.file.compression.level == datagen.DEFAULT_LEVELS[name]
        jet_pt = f["Events"]["Jet_pt"]
        assert jet_pt.compressed_bytes < 0.9 * jet_pt.uncompressed_bytes
    assert basket_header(path, "Jet_pt") == HEADERS[name]


def test_level_is_selectable(tmp_path: Path) -> None:
    [path] = datagen.generate_dataset(tmp_path, 1, 1_000, compression="zlib", level=1)
    with uproot.open(path) as f:
        assert f.file.compression == uproot.ZLIB(1)


def test_unknown_compression_is_refused(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="brotli"):
        datagen.generate_dataset(tmp_path, 1, 10, compression="brotli")


def test_same_seed_same_data_other_seed_other_data(tmp_path: Path) -> None:
    first = datagen.generate_dataset(tmp_path / "a", 1, 3_000, seed=3)[0]
    again = datagen.generate_dataset(tmp_path / "b", 1, 3_000, seed=3)[0]
    other = datagen.generate_dataset(tmp_path / "c", 1, 3_000, seed=4)[0]
    read = [uproot.open(p)["Events"].arrays(["Jet_pt", "Muon_pt", "MET_pt"])
            for p in (first, again, other)]
    assert ak.array_equal(read[0], read[1])
    assert not ak.array_equal(read[0], read[2])


def test_generation_is_idempotent(tmp_path: Path) -> None:
    paths = datagen.generate_dataset(tmp_path, 2, 1_000)
    stamps = [p.stat().st_mtime_ns for p in paths]
    manifest = json.loads((tmp_path / datagen.MANIFEST).read_text())
    assert set(manifest["files"]) == {p.name for p in paths}

    assert datagen.generate_dataset(tmp_path, 2, 1_000) == paths
    assert [p.stat().st_mtime_ns for p in paths] == stamps

    # a removed file comes back; the other stays untouched
    paths[1].unlink()
    datagen.generate_dataset(tmp_path, 2, 1_000)
    assert paths[1].exists() and paths[0].stat().st_mtime_ns == stamps[0]

    # other parameters: rewritten
    datagen.generate_dataset(tmp_path, 2, 1_000, compression="lz4")
    with uproot.open(paths[0]) as f:
        assert f.file.compression == uproot.LZ4(4)
    assert sorted(p.name for p in tmp_path.iterdir()) == [
        datagen.MANIFEST, "nanoaod_0000.root", "nanoaod_0001.root"]


def test_main_writes_the_files(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert datagen.main(["--out", str(tmp_path), "--files", "2", "--events", "500",
                         "--compression", "lz4"]) == 0
    printed = capsys.readouterr().out.split()
    assert printed == [str(tmp_path / "nanoaod_0000.root"), str(tmp_path / "nanoaod_0001.root")]
    with uproot.open(printed[1]) as f:
        assert f["Events"].num_entries == 500


def test_runs_as_a_module(tmp_path: Path) -> None:
    done = subprocess.run([sys.executable, "-m", "datavine.io.datagen", "--out", str(tmp_path),
                           "--files", "1", "--events", "100"],
                          capture_output=True, text=True, check=True, timeout=60)
    assert Path(done.stdout.strip()).name == "nanoaod_0000.root"
