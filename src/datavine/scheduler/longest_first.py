"""Pure ordering: the tasks that read the most entries go out first (longest processing
time first), so a run's last bundles are its shortest ones and a pass ends with its cores
finishing close together.

dask's order (``TaskGraph.priority``) takes a file's chunks in graph order: a file's short
last chunk comes out wherever its file does, and a long chunk may be the last one sent,
while the other cores idle for its whole duration. Here the reading tasks keep the
*priority slots* dask gave them (so reductions interleave with reads as before: each read's
slot is taken by some read), but the slots are handed out by size: the task with the most
entries gets the earliest slot. Tasks of equal size keep dask's order among themselves, so
a graph of equal chunks is not reordered at all. A task's size is the number of entries
its arguments name (:func:`datavine.scheduler.pieces.task_entries`); tasks without one keep
their own slots.
"""

from __future__ import annotations

from collections.abc import Hashable, Mapping

Key = Hashable

__all__ = ["longest_first"]


def longest_first(priority: Mapping[Key, int], sizes: Mapping[Key, int]) -> dict[Key, int]:
    """``priority`` with the slots of the tasks in ``sizes`` handed out largest first
    (ties in ``priority``'s order). Lower runs first, as in dask."""
    out = dict(priority)
    sized = sorted((k for k in sizes if k in priority), key=priority.__getitem__)
    if len({sizes[k] for k in sized}) <= 1:
        return out
    slots = [priority[k] for k in sized]
    by_size = sorted(sized, key=lambda k: (-sizes[k], priority[k]))
    out.update(zip(by_size, slots, strict=True))
    return out
