"""Files served by a loopback XCache testbed, as the commands, benchmarks and tests use it.

:func:`serve_on_testbed` starts a :class:`~datavine.io.xcache.testbed.XCacheTestbed` over a
folder of files (``datavine run`` and ``datavine scale-test`` with their shards), through a
mirror the servers' user can read when it cannot read the folder (:func:`readable_folder`;
the inputs' own modes are never changed). :func:`write_small_files` makes small ROOT files
under logical names, for the tests' testbed and the fault benchmark's shard scenario.
"""

from __future__ import annotations

import contextlib
import os
import pwd
import shutil
import stat
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import TYPE_CHECKING

from datavine.deploy.reaper import temporary_directory

if TYPE_CHECKING:
    from datavine.io.xcache.testbed import XCacheTestbed

RACKS = ("A", "B")  # the shards' racks, in turn
SMALL_FILES = 12
SMALL_EVENTS = 40_000  # per small file


@contextlib.contextmanager
def readable_folder(data_dir: Path, files: Sequence[Path],
                    user: str | None) -> Iterator[tuple[Path, list[Path]]]:
    """``data_dir``, or a mirror of ``files`` that ``user`` (the XRootD servers' user) can
    read (:func:`serve_file`) when it cannot read ``data_dir``; yields (folder, files)."""
    from datavine.io.xcache.unix import check_reachable

    if user is None:
        yield data_dir, list(files)
        return
    try:
        check_reachable(data_dir.resolve(), user, need_read=True)
    except PermissionError as exc:
        with temporary_directory("datavine-served-") as mirror:
            print(f"note: the {user} user cannot read {data_dir} ({exc}); serving a mirror "
                  f"in {mirror}")
            mirror.chmod(0o755)
            served = [serve_file(f, mirror / f.name, user) for f in files]
            yield mirror, served
        return
    yield data_dir, list(files)


def serve_file(source: Path, target: Path, user: str) -> Path:
    """``target``, a name in the mirror for ``source`` that ``user`` can read: a hard link
    when others may read ``source`` already, else a copy that only ``user`` (and root) may
    read. ``source``'s own mode is never changed: a hard link shares its inode, so a chmod
    of the link would open the original input (and keep it open after the run)."""
    if stat.S_IMODE(os.stat(source).st_mode) & stat.S_IROTH:
        try:
            os.link(source, target)
            return target
        except OSError:  # another file system: copied below
            pass
    pw = pwd.getpwnam(user)
    flags = os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC
    with open(source, "rb") as src, os.fdopen(os.open(target, flags, 0o400), "wb") as out:
        os.fchown(out.fileno(), pw.pw_uid, pw.pw_gid)  # readable by user from the start
        shutil.copyfileobj(src, out, 1 << 20)
    return target


def serve_on_testbed(stack: contextlib.ExitStack, data_dir: Path, files: Sequence[Path],
                     shards: int) -> tuple[XCacheTestbed, Path, list[Path]]:
    """A started testbed of ``shards`` shards (racks A, B, A, ...) serving ``files`` of
    ``data_dir``, closed by ``stack``: (the testbed, the folder it serves, the files in it).
    As root the servers run as ``xrootd``, and serve a mirror when it cannot read the folder."""
    from datavine.io.xcache.testbed import XCacheTestbed

    user = "xrootd" if os.geteuid() == 0 else None
    folder, served = stack.enter_context(readable_folder(data_dir, files, user))
    racks = [RACKS[i % len(RACKS)] for i in range(shards)]
    # no summary reports (monitor): nothing here reads them, and each would open a UDP socket
    testbed = stack.enter_context(XCacheTestbed(folder, n_shards=shards, racks=racks,
                                                monitor=False))
    return testbed, folder, served


def small_lfns() -> list[str]:
    """Logical names of the small files (the same every time)."""
    return [f"/store/run{i % 3}/events_{i:02d}.root" for i in range(SMALL_FILES)]


def write_small_tree(path: Path, seed: int, n_events: int) -> None:
    """One small ``Events`` tree (jets' pt and eta, their count, an event number)."""
    import numpy as np
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


def write_small_files(root: Path) -> list[str]:
    """The small files under ``root`` at their logical names (:func:`small_lfns`), each of
    :data:`SMALL_EVENTS` events, world-readable (the servers run as another user); returns
    the logical names."""
    lfns = small_lfns()
    for i, lfn in enumerate(lfns):
        write_small_tree(root / lfn.lstrip("/"), seed=i, n_events=SMALL_EVENTS)
    for p in [root, *root.rglob("*")]:
        p.chmod(0o755 if p.is_dir() else 0o644)
    return lfns
