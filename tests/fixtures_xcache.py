"""Fixtures for the XCache tests: small ROOT files and a real loopback testbed.

``xcache_testbed`` is one origin and 4 XCache shards on 2 racks (A, A, B, B), started once
per session over ``xcache_data``: 12 small TTree files in sub-folders, made here with
uproot's ``mktree``/``extend`` (a minimal private helper; the full generator is
``datavine.io.datagen``). Both live in folders under /tmp made for the purpose, because the
servers run as the unprivileged ``xrootd`` user, who cannot enter pytest's root-only
``/tmp/pytest-of-root``. Tests that stop a shard must start it again.
"""

from __future__ import annotations

import shutil
import tempfile
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest

from datavine.io.xcache.testbed import xcache_missing

N_FILES = 12
N_EVENTS = 40_000
RACKS = ["A", "A", "B", "B"]


def _write_tree(path: Path, seed: int, n_events: int) -> None:
    import uproot

    rng = np.random.default_rng(seed)
    path.parent.mkdir(parents=True, exist_ok=True)
    with uproot.recreate(path) as f:
        tree = f.mktree("Events", {"Jet_pt": np.float32, "Jet_eta": np.float32,
                                   "nJet": np.int32, "event": np.int64})
        for start in range(0, n_events, 10_000):
            n = min(10_000, n_events - start)
            tree.extend({
                "Jet_pt": rng.exponential(40.0, n).astype(np.float32),
                "Jet_eta": rng.normal(0.0, 2.0, n).astype(np.float32),
                "nJet": rng.integers(0, 10, n).astype(np.int32),
                "event": np.arange(start, start + n, dtype=np.int64) + seed * 10**9,
            })


def xcache_lfns() -> list[str]:
    """Logical names of the generated files (the same in every session)."""
    return [f"/store/run{i % 3}/events_{i:02d}.root" for i in range(N_FILES)]


@pytest.fixture(scope="session")
def xcache_data() -> Iterator[Path]:
    """A world-readable folder with ``N_FILES`` small ROOT files (see :func:`xcache_lfns`)."""
    root = Path(tempfile.mkdtemp(prefix="datavine-xcache-data-"))
    try:
        for i, lfn in enumerate(xcache_lfns()):
            _write_tree(root / lfn.lstrip("/"), seed=i, n_events=N_EVENTS)
        for p in [root, *root.rglob("*")]:
            p.chmod(0o755 if p.is_dir() else 0o644)
        yield root
    finally:
        shutil.rmtree(root, ignore_errors=True)


@pytest.fixture(scope="session")
def xcache_tools() -> None:
    """Skips the test, with the reason, where the XRootD server or client is missing."""
    reason = xcache_missing()
    if reason:
        pytest.skip(reason)


@pytest.fixture(scope="session")
def xcache_testbed(xcache_tools: None, xcache_data: Path) -> Iterator[object]:
    """A started :class:`~datavine.io.xcache.testbed.XCacheTestbed`: 4 shards on racks A,A,B,B."""
    from datavine.io.xcache.testbed import XCacheTestbed

    with XCacheTestbed(xcache_data, n_shards=len(RACKS), racks=RACKS, blocksize="128k",
                       http=True) as tb:
        yield tb
