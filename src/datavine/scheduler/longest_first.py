"""Pure ordering: the tasks that read the most entries go out first (longest processing
time first), so a run's last bundles are its shortest ones and a pass ends with its cores
finishing close together.

dask's order (``TaskGraph.priority``) takes a file's chunks in graph order: a file's short
last chunk comes out wherever its file does, and a long chunk may be the last one sent,
while the other cores idle for its whole duration. Here the reading tasks keep the
*priority slots* dask gave them (so reductions interleave with reads as before: each read's
slot is taken by some read), but the slots are handed out by size: the task with the most
entries gets the earliest slot. Tasks of equal size keep dask's order among themselves, so
a graph of equal chunks is not reordered at all; sizes within :data:`SAME_SIZE` of each
other count as equal (coffea and the scale test split a file into chunks that differ by an
entry: 83,333 and 83,334 of 250,000; ordered by that entry, the larger chunks of every
pass ran before the rest). A task's size is the number of entries its arguments name
(:func:`datavine.scheduler.pieces.task_entries`); tasks without one keep their own slots.
"""

from __future__ import annotations

from collections.abc import Hashable, Iterable, Mapping

Key = Hashable

__all__ = ["SAME_SIZE", "longest_first", "size_classes"]

SAME_SIZE = 0.05  # sizes within this share below a class's largest are of that class


def longest_first(priority: Mapping[Key, int], sizes: Mapping[Key, int]) -> dict[Key, int]:
    """``priority`` with the slots of the tasks in ``sizes`` handed out largest first
    (ties in ``priority``'s order). Lower runs first, as in dask."""
    out = dict(priority)
    sized = sorted((k for k in sizes if k in priority), key=priority.__getitem__)
    classes = size_classes({sizes[k] for k in sized})
    if len(set(classes.values())) <= 1:
        return out
    slots = [priority[k] for k in sized]
    by_size = sorted(sized, key=lambda k: (classes[sizes[k]], priority[k]))
    out.update(zip(by_size, slots, strict=True))
    return out


def size_classes(sizes: Iterable[int]) -> dict[int, int]:
    """Each size's class, 0 the largest (pure): from the largest down, a size at least
    ``1 - SAME_SIZE`` of its class's largest is of that class; a smaller one starts the
    next class."""
    out: dict[int, int] = {}
    rank, top = -1, 0
    for size in sorted(set(sizes), reverse=True):
        if rank < 0 or size < top * (1 - SAME_SIZE):
            rank, top = rank + 1, size
        out[size] = rank
    return out
