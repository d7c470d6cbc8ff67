"""Fixtures for the XCache tests: small ROOT files and a real loopback testbed.

``xcache_testbed`` is one origin and 4 XCache shards on 2 racks (A, A, B, B), started once
per session over ``xcache_data``: 12 small TTree files in sub-folders, made with uproot's
``mktree``/``extend`` by :func:`datavine.apps.testbed.write_small_files` (the fault
benchmark makes the same; the full generator is ``datavine.io.datagen``). Both live in
folders under /tmp made for the purpose, because the servers run as the unprivileged
``xrootd`` user, who cannot enter pytest's root-only ``/tmp/pytest-of-root``. Tests that
stop a shard must start it again.
"""

from __future__ import annotations

import shutil
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest

from datavine.apps.testbed import SMALL_EVENTS, SMALL_FILES, small_lfns, write_small_files
from datavine.io.xcache.testbed import xcache_missing

N_FILES = SMALL_FILES
N_EVENTS = SMALL_EVENTS
RACKS = ["A", "A", "B", "B"]
xcache_lfns = small_lfns  # logical names of the generated files (the same in every session)


@pytest.fixture(scope="session")
def xcache_data() -> Iterator[Path]:
    """A world-readable folder with ``N_FILES`` small ROOT files (see :func:`xcache_lfns`)."""
    root = Path(tempfile.mkdtemp(prefix="datavine-xcache-data-"))
    try:
        write_small_files(root)
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
