"""Normalise what dask hands a scheduler into one DAG of task-spec nodes.

dask >= 2025.4 hands ``get`` an expression (``_HLGExprSequence``); older dask, and
dask-awkward/coffea users today, hand a classic dict graph (tuples, possibly inside a
HighLevelGraph). Both become ``{key: GraphNode}`` from ``dask._task_spec``, culled to what the
requested keys need, with dependency and dependent maps and dask's own priorities.
"""

from __future__ import annotations

from collections.abc import Callable, Hashable, Iterable, Iterator, Mapping
from dataclasses import dataclass
from typing import Any, cast

from dask._task_spec import DataNode, GraphNode, convert_legacy_graph
from dask.order import order
from dask.typing import Key as DaskKey
from dask.utils import ensure_dict, key_split

Key = Hashable


class GraphError(ValueError):
    """The graph handed to datavine is malformed; the message names the key at fault."""


class MissingKeyError(GraphError, KeyError):
    """A requested key is not in the graph: a ``KeyError``, as dask's schedulers raise."""

    def __str__(self) -> str:  # KeyError would quote the message
        return str(self.args[0]) if self.args else ""


@dataclass
class TaskGraph:
    """A culled DAG ready for scheduling.

    Attributes:
        nodes: key -> executable node (``node(values)`` runs it).
        dependencies: key -> keys it needs.
        dependents: key -> keys that need it.
        priority: dask.order's priority (lower runs first; depth-first, memory friendly).
        outputs: the flat set of keys the caller asked for.
    """

    nodes: dict[Key, GraphNode]
    dependencies: dict[Key, frozenset[Key]]
    dependents: dict[Key, set[Key]]
    priority: dict[Key, int]
    outputs: set[Key]

    def __len__(self) -> int:
        return len(self.nodes)

    def category(self, key: Key) -> str:
        """The task's category: dask's key prefix, e.g. ``'sum-aggregate'``."""
        return str(key_split(key))

    def output_kind(self, key: Key) -> str:
        """What the task's output sizes are learned by, across runs: its category and the
        function it calls (``'add:numpy.add'``): prefixes as common as ``add`` name
        unrelated tasks in different graphs."""
        func = getattr(self.nodes[key], "func", None)
        name = getattr(func, "__qualname__", None) or getattr(func, "__name__", None)
        module = getattr(func, "__module__", None)
        return f"{self.category(key)}:{module}.{name}" if name else self.category(key)

    def modules(self, limit: int = 32) -> list[str]:
        """Top-level packages of the tasks' functions (for the workers to import once)."""
        found: dict[str, None] = {}
        for node in self.nodes.values():
            module = getattr(getattr(node, "func", None), "__module__", None)
            if isinstance(module, str) and module not in ("__main__", "builtins"):
                found.setdefault(module.split(".", 1)[0])
                if len(found) >= limit:
                    break
        return list(found)


def to_mapping(dsk: Any) -> Mapping[Key, Any]:
    """Whatever dask passed as ``dsk`` (dict, HighLevelGraph, expression) as a mapping."""
    if isinstance(dsk, Mapping):
        return dsk
    unculled = _delayed_graphs(dsk)
    if unculled is not None:
        return unculled
    if hasattr(dsk, "__dask_graph__"):
        graph = dsk.__dask_graph__()
        return graph if isinstance(graph, Mapping) else dict(graph)
    raise GraphError(f"cannot schedule a {type(dsk).__name__}: expected a dask graph or expression")


def _delayed_graphs(expr: object) -> dict[Key, object] | None:
    """The graphs of an expression of ``dask.delayed`` collections, merged and not culled;
    None for any other expression (its optimizer is run: blockwise fusion, column
    projection, ...).

    ``dask.delayed``'s optimizer only culls (unless ``optimization.fuse.delayed``), and
    :func:`build` culls again: dask's cull walks the needed keys once per layer, and each
    ``delayed`` call is a layer, so a graph of n delayed calls took O(n^2) (~28 ms of the
    manager's CPU for 769 calls, a third of its per-bundle cost of building the graph;
    benchmarks/workers.py)."""
    import dask
    from dask.delayed import optimize as delayed_optimize

    operands = getattr(expr, "operands", None)
    if not isinstance(operands, (list, tuple)) or not operands or dask.config.get(
            "optimization.fuse.delayed", False):
        return None
    if not all(getattr(op, "low_level_optimizer", None) is delayed_optimize
               and hasattr(op, "hlg") for op in operands):
        return None
    merged: dict[Key, object] = {}
    for op in operands:
        merged.update(ensure_dict(op.hlg))  # layer by layer
    return merged


def build(dsk: Any, keys: Any) -> TaskGraph:
    """Normalise ``dsk`` and cull it to what ``keys`` (a nested list of keys) need."""
    outputs = set(_flat(keys)) if isinstance(keys, list) else {keys}
    nodes = convert_legacy_graph(dict(to_mapping(dsk)))
    missing = [k for k in outputs if k not in nodes]
    if missing:
        raise MissingKeyError(f"requested key(s) not in the graph: {missing[:5]}")
    needed = _cull(nodes, outputs)
    dependencies = {k: frozenset(nodes[k].dependencies) for k in needed}
    dependents: dict[Key, set[Key]] = {k: set() for k in needed}
    for key, deps in dependencies.items():
        for dep in deps:
            dependents[dep].add(key)
    sub: dict[Key, GraphNode] = {k: nodes[k] for k in needed}
    priority: dict[Key, int] = dict(order(cast("Mapping[DaskKey, GraphNode]", sub)).items())
    return TaskGraph(sub, dependencies, dependents, priority, outputs)


def _flat(keys: object) -> Iterator[Key]:
    """The keys in a nested list of keys (dask's ``flatten``: lists nest, tuples are keys)."""
    if isinstance(keys, list):
        for item in keys:
            yield from _flat(item)
    else:
        yield keys


def _cull(nodes: Mapping[Key, GraphNode], outputs: Iterable[Key]) -> set[Key]:
    needed: set[Key] = set()
    stack = list(outputs)
    while stack:
        key = stack.pop()
        if key in needed:
            continue
        node = nodes.get(key)
        if node is None:
            raise GraphError(f"task dependency {key!r} is not in the graph")
        needed.add(key)
        stack.extend(d for d in node.dependencies if d not in needed)
    return needed


def pack_results(keys: Any, values: Mapping[Key, Any]) -> Any:
    """Arrange ``values`` in the nested structure of ``keys`` as dask's schedulers return
    it: a list of keys gives a tuple of values, nested lists nested tuples."""
    if isinstance(keys, list):
        return tuple(pack_results(k, values) for k in keys)
    return values[keys]


def is_trivial(node: GraphNode) -> bool:
    """Literal data nodes cost nothing to run anywhere."""
    return isinstance(node, DataNode)


def add_merge_tree(graph: dict[Key, Any], leaves: list[Key], fanin: int,
                   key: Callable[[int, int], Key], task: Callable[[list[Key]], Any]) -> Key:
    """Add merges of ``fanin`` contiguous keys to ``graph``, level by level, until one key is
    left, and return it (the only leaf when there is one). Merge ``j`` of level ``depth`` is
    ``graph[key(depth, j)] = task(its input keys)``."""
    level, depth = list(leaves), 0
    while len(level) > 1:
        merged = []
        for j in range(0, len(level), fanin):
            merged.append(key(depth, j // fanin))
            graph[merged[-1]] = task(level[j:j + fanin])
        level, depth = merged, depth + 1
    return level[0]
