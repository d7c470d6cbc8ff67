"""coffea's real CMS NanoAOD samples: fetched once with pip, read with uproot."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import uproot

from datavine.apps.analysis import process_chunk
from datavine.io import samples

pytestmark = pytest.mark.coffea

REPO = Path(__file__).resolve().parents[1]


def test_nano_dy_has_40_events() -> None:
    path = samples.coffea_sample("nano_dy")
    assert path == samples.samples_dir() / "coffea" / "nano_dy.root"
    with uproot.open(path) as f:
        met = f["Events"]["MET_pt"].array()
        assert len(met) == 40
        assert f["Events"].num_entries == 40
        assert f.file.compression == uproot.ZLIB(1)


def test_second_lookup_fetches_nothing_and_accepts_the_file_name(
        monkeypatch: pytest.MonkeyPatch) -> None:
    first = samples.coffea_sample("nano_dy")
    before = first.stat().st_mtime_ns

    def no_fetch(*args: object, **kwargs: object) -> Path:
        raise AssertionError("a second lookup fetched the samples again")

    monkeypatch.setattr(samples, "fetch_coffea_samples", no_fetch)
    path = samples.coffea_sample("nano_dimuon.root")
    assert path == first.parent / "nano_dimuon.root" and path.stat().st_size > 100_000
    assert samples.coffea_sample("nano_dy") == first and first.stat().st_mtime_ns == before


def test_only_root_files_are_extracted() -> None:
    folder = samples.coffea_sample("nano_dy").parent
    names = {p.name for p in folder.iterdir() if not p.name.startswith(".")}
    assert {"nano_dy.root", "nano_dimuon.root", "nano_tt_v12.root"} <= names
    assert all(name.endswith(".root") for name in names)


def test_analysis_runs_on_real_ttbar_nanoaod() -> None:
    result = process_chunk(samples.coffea_sample("nano_tt_v12"))
    assert result.events == 200
    # real semileptonic-enriched ttbar: a sizeable fraction passes, not all
    assert 20 < result.events_selected < 120
    assert result.counts.sum() > 0.8 * result.events_selected
    assert 0 < result.bytes_read < samples.coffea_sample("nano_tt_v12").stat().st_size


def test_unknown_sample_names_the_file() -> None:
    samples.coffea_sample("nano_dy")
    with pytest.raises(samples.SampleError, match=r"no_such_sample\.root"):
        samples.coffea_sample("no_such_sample")


def test_fetch_script_is_idempotent() -> None:
    samples.coffea_sample("nano_dy")
    done = subprocess.run(["bash", str(REPO / "scripts" / "fetch_samples.sh")],
                          capture_output=True, text=True, timeout=120, check=True,
                          env={**os.environ, "PYTHON": sys.executable})
    assert Path(done.stdout.strip()) == samples.samples_dir() / "coffea"


def test_extraction_from_the_downloaded_sdist(tmp_path: Path) -> None:
    samples.coffea_sample("nano_dy")
    sdist = samples.samples_dir() / f"coffea-{samples.COFFEA_VERSION}.tar.gz"
    shutil.copy(sdist, tmp_path / sdist.name)  # present: no download
    folder = samples.fetch_coffea_samples(tmp_path)
    assert (folder / f".complete-{samples.COFFEA_VERSION}").exists()
    assert (folder / "nano_dy.root").read_bytes() == samples.coffea_sample("nano_dy").read_bytes()
    assert not list(folder.glob(".*.tmp-*"))
