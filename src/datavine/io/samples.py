"""Real CMS NanoAOD files for tests: the samples that coffea's source distribution ships.

coffea's sdist carries ``tests/samples/*.root`` (``nano_dy.root``, ``nano_tt_v12.root``,
``nano_dimuon.root``, ...). :func:`fetch_coffea_samples` downloads that sdist with pip
into ``build/samples/`` and extracts only the ROOT files into ``build/samples/coffea/``;
:func:`coffea_sample` returns one file's path, fetching on first use. Both are idempotent
and safe to run from several processes at once (a file lock). ``DATAVINE_SAMPLES_DIR``
moves ``build/samples``. ``scripts/fetch_samples.sh`` runs the same fetch by hand.
"""

from __future__ import annotations

import argparse
import fcntl
import fnmatch
import os
import subprocess
import sys
import tarfile
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path

from datavine.errors import DatavineError

COFFEA_VERSION = "2026.9.0"
SAMPLES_ENV = "DATAVINE_SAMPLES_DIR"
_MEMBER_PATTERN = "*/tests/samples/*.root"
_PIP_TIMEOUT_S = 600


class SampleError(DatavineError):
    """A sample file could not be fetched or is not among coffea's samples."""


def samples_dir() -> Path:
    """``$DATAVINE_SAMPLES_DIR``, else ``build/samples`` of the source checkout (or of the
    current folder when datavine is not run from a checkout)."""
    if os.environ.get(SAMPLES_ENV):
        return Path(os.environ[SAMPLES_ENV])
    checkout = Path(__file__).resolve().parents[3]
    base = checkout if (checkout / "pyproject.toml").exists() else Path.cwd()
    return base / "build" / "samples"


def coffea_sample(name: str, version: str = COFFEA_VERSION) -> Path:
    """The path of coffea's sample ``name`` (``"nano_dy"`` or ``"nano_dy.root"``),
    fetching coffea's samples first when they are not there yet."""
    filename = name if name.endswith(".root") else f"{name}.root"
    target = samples_dir() / "coffea" / filename
    if target.exists():
        return target
    try:
        folder = fetch_coffea_samples(version=version)
    except SampleError as err:
        raise SampleError(f"coffea sample {filename!r} is not available: {err}") from err
    if not (folder / filename).exists():
        known = sorted(p.name for p in folder.glob("*.root"))
        raise SampleError(f"coffea {version} ships no sample {filename!r}; it has: "
                          f"{', '.join(known)}")
    return folder / filename


def fetch_coffea_samples(root: Path | None = None, version: str = COFFEA_VERSION) -> Path:
    """Download coffea's sdist (once) and extract its ROOT samples; returns their folder."""
    root = samples_dir() if root is None else root
    folder = root / "coffea"
    marker = folder / f".complete-{version}"
    if marker.exists():
        return folder
    root.mkdir(parents=True, exist_ok=True)
    with _locked(root / ".fetch.lock"):
        if marker.exists():
            return folder
        sdist = _download_sdist(root, version)
        _extract_samples(sdist, folder)
        marker.touch()
    return folder


def _download_sdist(root: Path, version: str) -> Path:
    sdist = root / f"coffea-{version}.tar.gz"
    if sdist.exists():
        return sdist
    command = [sys.executable, "-m", "pip", "download", "--no-binary", ":all:", "--no-deps",
               "--disable-pip-version-check", f"coffea=={version}", "-d", str(root)]
    try:
        done = subprocess.run(command, capture_output=True, text=True, timeout=_PIP_TIMEOUT_S,
                              check=False)
    except (OSError, subprocess.TimeoutExpired) as err:
        raise SampleError(f"'{' '.join(command)}' did not run: {err}") from err
    if done.returncode != 0 or not sdist.exists():
        lines = (done.stdout + done.stderr).strip().splitlines()[-8:]
        tail = "\n".join(line[:300] for line in lines)
        raise SampleError(f"'{' '.join(command)}' failed (exit {done.returncode}) and left "
                          f"no {sdist.name}:\n{tail}")
    return sdist


def _extract_samples(sdist: Path, folder: Path) -> None:
    """Extract ``*/tests/samples/*.root`` flat into ``folder``, each via a temporary name."""
    folder.mkdir(parents=True, exist_ok=True)
    try:
        with tarfile.open(sdist) as tar:
            for member in tar:
                if not (member.isfile() and fnmatch.fnmatch(member.name, _MEMBER_PATTERN)):
                    continue
                name = Path(member.name).name
                tmp = folder / f".{name}.tmp-{os.getpid()}"
                reader = tar.extractfile(member)
                if reader is None:
                    continue
                with reader, open(tmp, "wb") as out:
                    while block := reader.read(1 << 20):
                        out.write(block)
                os.replace(tmp, folder / name)
    except (OSError, tarfile.TarError) as err:
        raise SampleError(f"cannot extract the samples from {sdist}: {err}") from err


@contextmanager
def _locked(path: Path) -> Iterator[None]:
    with open(path, "a") as handle:
        fcntl.flock(handle, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(handle, fcntl.LOCK_UN)


def main(argv: Sequence[str] | None = None) -> int:
    """Fetch the samples and print their folder (``scripts/fetch_samples.sh``)."""
    parser = argparse.ArgumentParser(prog="python -m datavine.io.samples",
                                     description="Fetch coffea's NanoAOD test samples.")
    parser.add_argument("--version", default=COFFEA_VERSION, help="coffea release")
    parser.add_argument("--dest", type=Path, default=None,
                        help=f"folder for the sdist and coffea/ (default {samples_dir()})")
    args = parser.parse_args(argv)
    try:
        folder = fetch_coffea_samples(args.dest, args.version)
    except SampleError as err:
        print(f"fetch_samples: {err}", file=sys.stderr)
        return 1
    print(folder)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
