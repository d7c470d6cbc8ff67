"""Which entry ranges of its files a task reads, found before it runs: the *pieces* that
workers' column caches hold (:mod:`datavine.io.column_cache`).

A worker reports the pieces it holds by name (``/store/x.root@0-100000``: a logical file
name and an entry range, :func:`datavine.io.column_cache.piece_name`), and placement counts a
worker "cached" for a task when it holds the task's piece
(:func:`datavine.scheduler.placement.score`).
This module names a task's pieces the same way from its arguments: a ``(path, entry_start,
entry_stop)`` triple (the AGC's :class:`~datavine.apps.analysis.agc.Chunk`), or an object
with ``filename``, ``entrystart`` and ``entrystop`` (coffea's ``WorkItem``). The search is
shallow and bounded, as :mod:`datavine.scheduler.inputs`' is. Pure: no I/O.
"""

from __future__ import annotations

from collections.abc import Hashable, Mapping
from typing import TypeGuard

from dask._task_spec import DataNode, GraphNode, Task, TaskRef

from datavine.io.column_cache import marker_name, piece_name
from datavine.io.shards import logical_name
from datavine.scheduler.inputs import looks_like_input

__all__ = ["PiecesOf", "marker_name", "piece_name", "task_entries", "task_pieces"]

_MAX_DEPTH = 4
_MAX_ITEMS = 64


def task_pieces(node: GraphNode) -> tuple[str, ...]:
    """The pieces the task will read, in argument order, without duplicates."""
    return _pieces(_ranges(node))


class PiecesOf:
    """Each task's pieces (:func:`task_pieces`) and entries (:func:`task_entries`), its
    arguments walked once per task: placement asks for a bundle's pieces, the planner for a
    ready task's holder, speculation for a call's, and the run's order for the entries of
    every task first."""

    def __init__(self, nodes: Mapping[Hashable, GraphNode]) -> None:
        self._nodes = nodes
        self._found: dict[Hashable, tuple[str, ...]] = {}
        self._ranges: dict[Hashable, list[Range]] = {}  # walked, pieces not asked for yet

    def __call__(self, key: Hashable) -> tuple[str, ...]:
        found = self._found.get(key)
        if found is None:
            ranges = self._ranges.pop(key, None)
            found = self._found[key] = _pieces(_ranges(self._nodes[key]) if ranges is None
                                               else ranges)
        return found

    def entries(self, key: Hashable) -> int | None:
        """:func:`task_entries` of the task ``key``; its walk kept for its pieces."""
        ranges = self._ranges.get(key)
        if ranges is None:
            ranges = self._ranges[key] = _ranges(self._nodes[key])
        return _entries(ranges)


def task_entries(node: GraphNode) -> int | None:
    """The number of entries the task's pieces name (None: it names no non-empty range)."""
    return _entries(_ranges(node))


Range = tuple[str, int, int]  # a path or URL, an entry range


def _pieces(ranges: list[Range]) -> tuple[str, ...]:
    return tuple(dict.fromkeys(piece_name(logical_name(path), start, stop)
                               for path, start, stop in ranges))


def _entries(ranges: list[Range]) -> int | None:
    return sum(stop - start for _, start, stop in set(ranges) if stop > start) or None


def _ranges(node: GraphNode) -> list[Range]:
    found: list[Range] = []
    if isinstance(node, Task):
        _scan((node.args, node.kwargs), found, 0)
    elif isinstance(node, DataNode):
        _scan(node.value, found, 0)
    return found


def _range(obj: object) -> Range | None:
    if (isinstance(obj, tuple) and len(obj) == 3 and isinstance(obj[0], str)
            and _whole(obj[1]) and _whole(obj[2]) and looks_like_input(obj[0])):
        return obj[0], obj[1], obj[2]
    filename = getattr(obj, "filename", None)
    if isinstance(filename, str) and looks_like_input(filename):
        start, stop = getattr(obj, "entrystart", None), getattr(obj, "entrystop", None)
        if _whole(start) and _whole(stop):
            return filename, start, stop
    return None


def _whole(value: object) -> TypeGuard[int]:
    return isinstance(value, int) and not isinstance(value, bool)


def _scan(obj: object, found: list[Range], depth: int) -> None:
    if depth > _MAX_DEPTH or obj is None or isinstance(obj, (str, int, float, bool, bytes,
                                                             TaskRef)):
        return
    piece = _range(obj)
    if piece is not None:
        found.append(piece)
        return
    if isinstance(obj, GraphNode):
        inner = (obj.args, obj.kwargs) if isinstance(obj, Task) else getattr(obj, "value", None)
        _scan(inner, found, depth + 1)
        return
    if isinstance(obj, Mapping):
        for i, v in enumerate(obj.values()):
            if i >= _MAX_ITEMS:
                break
            _scan(v, found, depth + 1)
        return
    if isinstance(obj, (list, tuple)):
        for i, v in enumerate(obj):
            if i >= _MAX_ITEMS:
                break
            _scan(v, found, depth + 1)
