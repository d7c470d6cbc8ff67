"""Graph normalisation: dict graphs, HighLevelGraphs and expressions become one DAG."""

from __future__ import annotations

import operator

import dask
import dask.array as da
import dask.base
import pytest
from dask import delayed
from dask.core import flatten

from datavine.scheduler import graph


def test_dict_graph_with_tuples_is_normalised_and_culled() -> None:
    dsk = {"a": 1, "b": (operator.add, "a", 10), "c": (operator.mul, "b", 2), "unused": (len, [])}
    g = graph.build(dsk, ["c"])
    assert set(g.nodes) == {"a", "b", "c"}
    assert g.dependencies["c"] == {"b"}
    assert g.dependents["a"] == {"b"}
    values: dict = {}
    for key in sorted(g.nodes, key=g.priority.__getitem__):
        values[key] = g.nodes[key](values)
    assert values["c"] == 22


def _evaluate(g: graph.TaskGraph) -> dict:
    """Every node's value, in the graph's priority order (inputs must come first)."""
    values: dict = {}
    for key in sorted(g.nodes, key=g.priority.__getitem__):
        assert g.dependencies[key] <= values.keys(), f"{key} ordered before its inputs"
        values[key] = g.nodes[key](values)
    return values


def test_collection_graph_matches_its_keys() -> None:
    x = da.ones((10, 10), chunks=5).sum()
    (dsk, keys), = [(x.__dask_graph__(), x.__dask_keys__())]
    g = graph.build(dsk, keys if isinstance(keys, list) else [keys])
    assert g.outputs == set(flatten(keys))  # the collection's own keys, no others
    assert set(g.nodes) == set(dict(dsk))  # all its tasks: 4 chunks, 4 partial sums, 1 total
    assert all(deps <= g.nodes.keys() for deps in g.dependencies.values())
    values = _evaluate(g)
    assert [values[k] for k in g.outputs] == [100.0]


def test_pack_results_keeps_nesting() -> None:
    values = {"a": 1, "b": 2, "c": 3}
    assert graph.pack_results([["a", "b"], ["c"]], values) == ((1, 2), (3,))
    assert graph.pack_results("a", values) == 1
    assert graph.pack_results([], values) == ()


def test_missing_key_is_named_and_a_key_error() -> None:
    with pytest.raises(graph.GraphError, match="missing"):
        graph.build({"a": 1}, ["missing"])
    with pytest.raises(KeyError) as err:  # what dask's own schedulers raise
        graph.build({"a": 1}, [["missing"], "a"])
    assert str(err.value) == "requested key(s) not in the graph: ['missing']"


def test_scheduler_receives_what_dask_version_gives() -> None:
    seen = []

    def spy(dsk, keys, **kwargs):
        g = graph.build(dsk, keys)
        seen.append((keys, g.outputs))
        return graph.pack_results(keys, _evaluate(g))

    result = dask.compute(delayed(operator.add)(1, 2), da.arange(10, chunks=3).sum(),
                          scheduler=spy)
    assert result == (3, 45)
    # one call for both collections, whatever type this dask gives, its keys all built
    ((keys, outputs),) = seen
    assert isinstance(keys, list) and len(keys) == 2 and outputs == set(flatten(keys)), keys


def test_delayed_graphs_skip_dasks_cull_and_build_the_same() -> None:
    """A graph of ``dask.delayed`` calls is taken unculled (dask's cull is O(layers x keys),
    and build culls anyway): the same nodes, dependencies and results as dask's optimized
    graph; any other collection, or delayed with fusion asked for, goes through dask's
    optimizer."""
    collections_to_expr = getattr(dask.base, "collections_to_expr", None)
    if collections_to_expr is None:
        pytest.skip("this dask has no expressions (dask < 2025.4: .venv-legacy)")

    parts = [delayed(operator.mul, pure=True)(i, 2, dask_key_name=f"p-{i}") for i in range(20)]
    total = delayed(sum, pure=True)(parts, dask_key_name="total")
    unused = delayed(operator.neg)(7, dask_key_name="unused")  # not asked for
    expr = collections_to_expr([total])
    unculled = graph._delayed_graphs(expr)
    assert unculled is not None and "total" in unculled and "unused" not in unculled
    fast = graph.build(expr, [["total"]])
    slow = graph.build(dict(collections_to_expr([total]).__dask_graph__()), [["total"]])
    assert fast.nodes.keys() == slow.nodes.keys() and fast.dependencies == slow.dependencies
    assert fast.priority == slow.priority
    assert _evaluate(fast)["total"] == sum(2 * i for i in range(20))
    assert graph._delayed_graphs(collections_to_expr([da.ones(4, chunks=2).sum()])) is None
    assert graph._delayed_graphs(collections_to_expr([total, da.ones(4).sum()])) is None
    with dask.config.set({"optimization.fuse.delayed": True}):
        assert graph._delayed_graphs(collections_to_expr([total])) is None
    assert unused.key == "unused"
