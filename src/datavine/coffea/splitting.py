"""Splitting work items that need more memory than the ceiling: halves by entry range.

When a work item's task overruns its memory cap at the policy's ceiling, the runtime gives
up with :class:`datavine.errors.MemoryCapError` naming the task keys. coffea's own
``TaskVineExecutor`` then halves the item (``split_on_exhaustion``); so does
:class:`~datavine.coffea.DatavineExecutor`: each such item is replaced by its two halves
(``[start, mid)`` and ``[mid, stop)``, in place, so that results merge in the same order),
down to ``min_entries`` per half; the recursion comes from running the halves again. Pure:
no I/O; the executor runs the new items.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Hashable, Mapping, Sequence
from dataclasses import dataclass
from typing import TypeVar

from datavine.errors import MemoryCapError

Item = TypeVar("Item")  # a coffea WorkItem (a dataclass with an entry range)


@dataclass(frozen=True)
class Split:
    """Items replaced by their halves after a memory overrun at the ceiling."""

    items: tuple[str, ...]  # each split item, as dataset:file[start:stop]
    category: str
    peak_mb: float
    cap_mb: float

    def describe(self) -> str:
        return (f"split {len(self.items)} work item(s) in halves after {self.category} used "
                f"{self.peak_mb:.0f} MB over its {self.cap_mb:.0f} MB cap at the ceiling: "
                + ", ".join(self.items[:4]) + (" ..." if len(self.items) > 4 else ""))


def label(item: object) -> str:
    return (f"{getattr(item, 'dataset', '?')}:{getattr(item, 'filename', '?')}"
            f"[{getattr(item, 'entrystart', '?')}:{getattr(item, 'entrystop', '?')}]")


def halves(item: Item, min_entries: int) -> tuple[Item, Item] | None:
    """The two halves of a ``WorkItem`` by entry range, or None when a half would have
    fewer than ``min_entries`` entries (or ``item`` has no entry range)."""
    start, stop = getattr(item, "entrystart", None), getattr(item, "entrystop", None)
    if not isinstance(start, int) or not isinstance(stop, int):
        return None
    if (not dataclasses.is_dataclass(item) or isinstance(item, type)
            or stop - start < 2 * max(1, min_entries)):
        return None
    mid = start + (stop - start) // 2
    return dataclasses.replace(item, entrystop=mid), dataclasses.replace(item, entrystart=mid)


def item_indices(keys: Sequence[Hashable], graph: Mapping[Hashable, object]) -> list[int]:
    """Positions (in the call's item list) of the item tasks among ``keys``."""
    out = []
    for key in keys:
        if (key in graph and isinstance(key, tuple) and len(key) == 3
                and str(key[0]).endswith("-item")):
            out.append(int(key[2]))
    return sorted(set(out))


def split_failed_items(items: Sequence[Item], graph: Mapping[Hashable, object],
                       exc: MemoryCapError, min_entries: int) -> tuple[list[Item], Split]:
    """``items`` with those named by ``exc`` replaced by their halves; re-raises ``exc``
    (with a note saying why) when there is no item to split or one cannot be split."""
    indices = item_indices(list(exc.keys), graph)
    if not indices:
        exc.add_note("datavine: no coffea work item among these tasks to split")
        raise exc
    replaced: dict[int, tuple[Item, Item]] = {}
    for i in indices:
        pair = halves(items[i], min_entries)
        if pair is None:
            exc.add_note(f"datavine: work item {label(items[i])} cannot be split further "
                         f"(DatavineExecutor.split_min_entries={min_entries}); raise the "
                         "memory ceiling (MemoryPolicy.ceiling_mb) or use smaller chunks")
            raise exc
        replaced[i] = pair
    out: list[Item] = []
    for i, item in enumerate(items):
        out.extend(replaced.get(i, (item,)))
    split = Split(tuple(label(items[i]) for i in indices), exc.category, exc.peak_mb,
                  exc.cap_mb)
    return out, split
