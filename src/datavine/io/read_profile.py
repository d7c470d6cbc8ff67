"""Which branches this process's bundles read of each tree: what a prefetch reads ahead.

A bundle's spec says which file and entry range it reads (its chunk), not which branches:
those are in the task's code. The read path notes them as it reads
(:func:`datavine.io.cached_arrays.read_arrays` calls :func:`note`), and the prefetch of the
next bundle (:mod:`datavine.worker.prefetch`) reads the same branches of its tree: an
analysis reads the same columns of every chunk. Per process, the last read of each tree
wins; bounded (a few trees, a few thousand branch names). Standard library only: imported on
workers.
"""

from __future__ import annotations

import threading
from collections import OrderedDict
from collections.abc import Sequence

MAX_TREES = 16
MAX_BRANCHES = 4096

_lock = threading.Lock()
_profile: OrderedDict[str, tuple[str, ...]] = OrderedDict()


def note(tree: str, branches: Sequence[str]) -> None:
    """A bundle of this process read ``branches`` of the tree ``tree``."""
    names = tuple(dict.fromkeys(branches))[:MAX_BRANCHES]
    if not names:
        return
    with _lock:
        _profile[tree] = names
        _profile.move_to_end(tree)
        while len(_profile) > MAX_TREES:
            _profile.popitem(last=False)


def branches(tree: str) -> tuple[str, ...]:
    """The branches the last read of ``tree`` here took (empty: none seen yet)."""
    with _lock:
        return _profile.get(tree, ())


def trees() -> tuple[str, ...]:
    """The trees read here, the most recent last."""
    with _lock:
        return tuple(_profile)


def forget() -> None:
    """Forget every tree (tests)."""
    with _lock:
        _profile.clear()
