"""What a queued bundle will read, found in its task nodes: the decisions of a prefetch, pure.

:func:`chunk_reads` looks into a bundle's task nodes (dask task-spec nodes: their function,
arguments and keyword arguments, and what those hold, shallowly and boundedly, as
:mod:`datavine.scheduler.inputs` does on the manager) for the chunks its tasks will read:
an object naming a ``root://`` file and an entry range (the AGC's ``Chunk``: ``path``,
``entry_start``, ``entry_stop``; coffea's ``WorkItem``: ``filename``, ``entrystart``,
``entrystop``, ``treename``), or a ``(url, start, stop)`` tuple. Only remote files count: a
local file is read from the page cache, nothing to overlap. :func:`tree_for` picks the tree
whose branches are read ahead. No I/O here; standard library only (imported on workers).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import NamedTuple

REMOTE = ("root://", "roots://", "xroot://")
URL_ATTRS = ("path", "filename", "file_path")
START_ATTRS = ("entry_start", "entrystart")
STOP_ATTRS = ("entry_stop", "entrystop")
TREE_ATTRS = ("treename", "tree")
MAX_DEPTH = 5
MAX_ITEMS = 64
MAX_READS = 16  # chunks of one bundle read ahead, at most


class ChunkRead(NamedTuple):
    """One chunk a bundle will read: a remote file, its entries ``[start, stop)``, its tree
    (None: not named)."""

    url: str
    start: int
    stop: int
    tree: str | None = None


def chunk_reads(nodes: Sequence[tuple[object, object]]) -> list[ChunkRead]:
    """The chunks the bundle's nodes (``(key, node)`` pairs) will read, in order, each once."""
    found: list[ChunkRead] = []
    for _, node in nodes:
        _scan(node, found, 0)
        if len(found) >= MAX_READS:
            break
    return list(dict.fromkeys(found))[:MAX_READS]


def tree_for(read: ChunkRead, known: Sequence[str], default: str = "Events") -> str:
    """The tree to read ahead for ``read``: the one it names; else ``default`` when the
    process has read it, else the tree it read last (``known``: most recent last)."""
    if read.tree:
        return read.tree
    if default in known or not known:
        return default
    return known[-1]


def _scan(obj: object, found: list[ChunkRead], depth: int) -> None:
    if depth > MAX_DEPTH or obj is None or isinstance(obj, (str, bytes, int, float, bool)):
        return
    read = _as_read(obj)
    if read is not None:
        found.append(read)
        return
    if isinstance(obj, Mapping):
        for i, value in enumerate(obj.values()):
            if i >= MAX_ITEMS:
                break
            _scan(value, found, depth + 1)
        return
    if isinstance(obj, (list, tuple, set, frozenset)):
        for i, item in enumerate(obj):
            if i >= MAX_ITEMS:
                break
            _scan(item, found, depth + 1)
        return
    # a dask task-spec node: Task (func, args, kwargs), DataNode (value); a bound method's
    # object (the AGC's chunk source: its method is the task's function)
    for attr in ("args", "kwargs", "value", "func", "__self__"):
        inner = getattr(obj, attr, None)
        if inner is not None and inner is not obj:
            _scan(inner, found, depth + 1)


def _as_read(obj: object) -> ChunkRead | None:
    """``obj`` as a chunk read, if it is one."""
    url: object
    start: object
    stop: object
    tree: object
    if isinstance(obj, tuple) and len(obj) in (3, 4):
        url, start, stop = obj[0], obj[1], obj[2]
        tree = obj[3] if len(obj) == 4 else None
    else:
        url = _first(obj, URL_ATTRS)
        start, stop = _first(obj, START_ATTRS), _first(obj, STOP_ATTRS)
        tree = _first(obj, TREE_ATTRS)
    if not (isinstance(url, str) and url.startswith(REMOTE)):
        return None
    if not (isinstance(start, int) and isinstance(stop, int) and _entry(start)
            and _entry(stop) and stop > start):
        return None
    return ChunkRead(url, start, stop, tree if isinstance(tree, str) else None)


def _first(obj: object, names: Sequence[str]) -> object:
    for name in names:
        value = getattr(obj, name, None)
        if value is not None:
            return value
    return None


def _entry(value: object) -> bool:
    return isinstance(value, int) and not isinstance(value, bool) and value >= 0
