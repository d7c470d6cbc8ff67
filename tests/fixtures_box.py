"""Boxes for tests: facilities built from network namespaces (datavine.deploy.box).

``make_box`` brings one up in a test's folder under a name of its own and takes it down at
the end, asserting that nothing of it is left (namespaces, their /etc/netns folders,
processes). Tests that need a box skip, saying why, where namespaces cannot be made.
"""

from __future__ import annotations

import os
import shutil
import tempfile
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from datavine.deploy.box.net import NETNS_ETC, Box, box_missing, existing_namespaces
from datavine.deploy.box.plan import BoxSpec

_counter = iter(range(1, 10_000))
BOX_FILES, BOX_EVENTS = 4, 50_000  # the box tests' data: a few seconds of analysis


@pytest.fixture(scope="session")
def box_data() -> Iterator[Path]:
    """``BOX_FILES`` generated NanoAOD-like ZSTD files of ``BOX_EVENTS`` events, in a folder
    the xrootd user can read (the box's origin serves it)."""
    from datavine.io.datagen import generate_dataset

    root = Path(tempfile.mkdtemp(prefix="datavine-box-data-"))
    root.chmod(0o755)
    try:
        for p in generate_dataset(root, BOX_FILES, BOX_EVENTS, "zstd"):
            p.chmod(0o644)
        yield root
    finally:
        shutil.rmtree(root, ignore_errors=True)


def require_box() -> None:
    why = box_missing()
    if why:
        pytest.skip(why)


def assert_gone(box: Box) -> None:
    left = set(box.plan.namespaces) & existing_namespaces()
    assert not left, f"namespaces left behind: {sorted(left)}"
    etc = [ns for ns in box.plan.namespaces if (NETNS_ETC / ns).exists()]
    assert not etc, f"/etc/netns folders left behind: {etc}"


@pytest.fixture
def make_box() -> Iterator[Callable[..., Box]]:
    """``make_box(racks=2, hosts_per_rack=1, **services)`` -> a box that is up, in a folder
    under /tmp that the xrootd user can enter (pytest's own is mode 0700)."""
    require_box()
    made: list[Box] = []
    folders: list[Path] = []

    def make(racks: int = 2, hosts_per_rack: int = 1, link_mbit: float = 200.0,
             data: Path | None = None, condor: bool = False) -> Box:
        from datavine.deploy.box.facility import bring_up

        name = f"t{os.getpid() % 1000}x{next(_counter)}"
        folder = Path(tempfile.mkdtemp(prefix=f"datavine-box-{name}-"))
        folder.chmod(0o755)
        folders.append(folder)
        box = bring_up(BoxSpec(name=name, racks=racks, hosts_per_rack=hosts_per_rack,
                               link_mbit=link_mbit), folder, data=data, condor=condor)
        made.append(box)
        return box

    yield make
    from datavine.deploy.box.facility import take_down

    try:
        for box in made:
            take_down(box)
            assert_gone(box)
    finally:
        for folder in folders:
            shutil.rmtree(folder, ignore_errors=True)
