"""Benchmark: dispatch rate of a trivial 5,000-task graph (fan-out + tree reduction).

One source task fans out to ``tasks / 2`` leaves, which a binary tree of ``add`` tasks
reduces to one value: ``tasks`` dask tasks in all, each doing microseconds of work, so the
figure is the scheduler's own cost per task (``--shape leaves``: no source task, the leaves
are the graph's roots). ``--shape sum``: ``tasks - 1`` independent leaves and one task
summing them all (``--tasks 2001``: 2,000 leaves, 5 bundles on 2 workers): one dependency
level whose inputs are small, the case where keeping values on the workers must not cost a
wait (issue 21, point 5). The same graph runs through:

- datavine: ``datavine.LocalCluster(workers, cores)``, workers connected before the clock;
- datavine with every value through the manager (``keep_on_workers=False``, "datavine
  inline"): the figure datavine's default must stay within 10% of on small graphs;
- DaskVine function-calls and DaskVine tasks (cctools' ``DaskVine.get`` on the dict graph,
  its own local ``vine_worker``s with a password); the tasks mode runs a fresh Python per
  task (~5 tasks/s), so it gets a smaller graph (``--daskvine-tasks-size``);
- dask threads, dask processes (``workers * cores`` of them), distributed LocalCluster
  (``workers`` x ``cores`` threads);
- a plain loop calling the same functions in one process (the floor of the work itself).

Every peer's result is checked against the closed-form sum. Each peer runs ``--repeat``
times (DaskVine ``--daskvine-repeat``) and its best run counts; datavine's first run
includes its library's start, and is also reported alone. The last line printed is
``tasks_per_s=... ratio_vs_daskvine_fc=...`` plus ratios against the other peers.

    .venv/bin/python benchmarks/dispatch.py [--tasks 5000] [--workers 2 --cores 1]
        [--repeat 3] [--daskvine-repeat 1] [--daskvine-tasks-size 100]
        [--shape fanout|leaves] [--peers datavine daskvine_fc ...]
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Callable
from typing import Any

import common  # this script's folder is on sys.path when it runs
import dask
import dask.multiprocessing
import dask.threaded

PEERS = ("datavine", "datavine_inline", "daskvine_fc", "daskvine_tasks", "threads",
         "processes", "distributed", "plain_loop")
NAMES = {"datavine": "datavine", "datavine_inline": "datavine inline",
         "daskvine_fc": "DaskVine function-calls",
         "daskvine_tasks": "DaskVine tasks", "threads": "dask threads",
         "processes": "dask processes", "distributed": "distributed",
         "plain_loop": "plain loop"}
SEED = 7
SHAPES = ("fanout", "leaves", "sum")


# The task functions live in this script (__main__), so every peer ships them by value.
def source() -> int:
    return SEED


def leaf(seed: int, i: int) -> int:
    return seed + i


def add(a: int, b: int) -> int:
    return a + b


def total(*values: int) -> int:
    return sum(values)


def leaves_of(tasks: int, shape: str) -> int:
    return tasks - 1 if shape == "sum" else tasks // 2


def expected(tasks: int, shape: str = "fanout") -> int:
    """The graph's value in closed form: sum of ``SEED + i`` over the leaves."""
    n = leaves_of(tasks, shape)
    return n * SEED + n * (n - 1) // 2


def build_graph(tasks: int, shape: str = "fanout") -> Any:
    """A Delayed of exactly ``tasks`` tasks: ``tasks/2`` leaves reduced by a binary tree.

    ``fanout``: the leaves depend on one source task. ``leaves``: the leaves are roots of
    the graph (the seed is a literal) and a last ``add(total, 0)`` keeps the task count.
    ``sum``: ``tasks - 1`` leaves (roots) and one task summing them.
    """
    if shape not in SHAPES:
        raise ValueError(f"--shape must be one of {SHAPES}, not {shape!r}")
    if shape == "sum":
        if tasks < 2:
            raise ValueError(f"--tasks must be >= 2 for --shape sum, not {tasks}")
        summed = dask.delayed(total, pure=False)(
            *[dask.delayed(leaf, pure=False)(SEED, i) for i in range(tasks - 1)])
        if len(dict(summed.__dask_graph__())) != tasks:
            raise AssertionError(f"built {len(dict(summed.__dask_graph__()))} tasks, "
                                 f"wanted {tasks}")
        return summed
    if tasks < 4 or tasks % 2:
        raise ValueError(f"--tasks must be an even number >= 4, not {tasks}")
    root: Any = dask.delayed(source, pure=False)() if shape == "fanout" else SEED
    level = [dask.delayed(leaf, pure=False)(root, i) for i in range(tasks // 2)]
    while len(level) > 1:
        pairs = [dask.delayed(add, pure=False)(a, b) for a, b in zip(level[::2], level[1::2],
                                                                      strict=False)]
        level = pairs + ([level[-1]] if len(level) % 2 else [])
    out = level[0] if shape == "fanout" else dask.delayed(add, pure=False)(level[0], 0)
    size = len(dict(out.__dask_graph__()))
    if size != tasks:
        raise AssertionError(f"built {size} tasks, wanted {tasks}")
    return out


def plain_loop(tasks: int, shape: str = "fanout") -> int:
    """The same calls, in order, in this process: no scheduler at all (as many calls as
    the shape has tasks)."""
    if shape == "sum":
        return total(*[leaf(SEED, i) for i in range(tasks - 1)])
    seed = source()
    level = [leaf(seed, i) for i in range(tasks // 2)]
    while len(level) > 1:
        pairs = [add(a, b) for a, b in zip(level[::2], level[1::2], strict=False)]
        level = pairs + ([level[-1]] if len(level) % 2 else [])
    return level[0]


def scalar(value: Any) -> Any:
    """A computed value, unwrapped from the tuples/lists schedulers return."""
    while isinstance(value, (list, tuple)) and len(value) == 1:
        value = value[0]
    return value


def run_repeated(peer: str, tasks: int, repeat: int, compute: Callable[[Any], Any],
                 note: str, shape: str) -> list[common.PeerResult]:
    """``repeat`` timed runs, each of a fresh graph built before its clock starts."""
    runs = []
    for _ in range(repeat):
        graph = build_graph(tasks, shape)
        runs.append(common.measure(NAMES[peer], tasks, lambda g=graph: compute(g),
                                   lambda v: scalar(v) == expected(tasks, shape), note))
    return runs


def best_noted(runs: list[common.PeerResult]) -> common.PeerResult:
    """The best run, with every run's time in its note."""
    best = common.best_of(runs)
    if len(runs) > 1:
        times = ", ".join(f"{r.seconds:.2f}" for r in runs if r.seconds is not None)
        best.note = f"{best.note + '; ' if best.note else ''}runs {times} s"
    return best


def with_scheduler(get: Callable[..., Any]) -> Callable[[Any], Any]:
    """The ordinary way in: ``dask.compute(graph, scheduler=get)``."""
    def compute(total: Any) -> Any:
        return dask.compute(total, scheduler=get)[0]
    return compute


def with_dict_graph(get: Callable[..., Any]) -> Callable[[Any], Any]:
    """DaskVine's way in: the dict graph and the keys (dask >= 2025.4 hands an expression)."""
    def compute(total: Any) -> Any:
        return get(dict(total.__dask_graph__()), total.__dask_keys__())
    return compute


def run_peer(peer: str, args: argparse.Namespace) -> list[common.PeerResult]:
    """All timed runs of one peer, its workers started once before the first."""
    slots, shape = args.workers * args.cores, f"{args.workers}x{args.cores}"

    def repeated(compute: Callable[[Any], Any], note: str, tasks: int = args.tasks,
                 repeat: int = args.repeat) -> list[common.PeerResult]:
        return run_repeated(peer, tasks, repeat, compute, note, args.shape)

    if peer == "plain_loop":
        return repeated(lambda _: plain_loop(args.tasks, args.shape),
                        "one process, no scheduler")
    if peer == "threads":
        return repeated(with_scheduler(
            lambda d, k, **kw: dask.threaded.get(d, k, num_workers=slots, **kw)),
            f"{slots} threads")
    if peer == "processes":
        return repeated(with_scheduler(
            lambda d, k, **kw: dask.multiprocessing.get(d, k, num_workers=slots, **kw)),
            f"{slots} processes, a new pool per run")
    if peer == "distributed":
        with common.distributed_client(args.workers, args.cores) as client:
            return repeated(with_scheduler(client.get), shape)
    if peer in ("daskvine_fc", "daskvine_tasks"):
        fc = peer == "daskvine_fc"
        mode = "function-calls" if fc else "tasks"
        with common.daskvine(args.workers, args.cores) as manager:
            return repeated(with_dict_graph(common.daskvine_get(manager, mode, args.cores)),
                            f"{shape}, " + ("a library per run, exec fork" if fc
                                            else "a Python per task"),
                            tasks=args.tasks if fc else args.daskvine_tasks_size,
                            repeat=args.daskvine_repeat if fc else 1)
    if peer in ("datavine", "datavine_inline"):
        import datavine

        manager = datavine.ManagerConfig(run_dir=common.run_dir(peer))
        with datavine.LocalCluster(workers=args.workers, cores=args.cores, manager=manager,
                                   keep_on_workers=peer == "datavine") as cluster:
            runs = []
            for i in range(args.repeat):
                note = shape + ("; the cluster's first run" if i == 0 else "")
                (run,) = repeated(with_scheduler(cluster.get), note, repeat=1)
                if cluster.last_summary is not None:
                    run.note += f"; {cluster.last_summary.bundles} bundles"
                runs.append(run)
            return runs
    raise ValueError(f"unknown peer {peer!r}: choose from {', '.join(PEERS)}")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--tasks", type=int, default=5000, help="tasks in the graph (even)")
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument("--cores", type=int, default=1, help="cores per worker")
    parser.add_argument("--repeat", type=int, default=3,
                        help="timed runs per peer, best kept (not DaskVine's)")
    parser.add_argument("--daskvine-repeat", type=int, default=1,
                        help="timed runs of DaskVine function-calls (~100 s each here)")
    parser.add_argument("--daskvine-tasks-size", type=int, default=100,
                        help="graph size for DaskVine's tasks mode (~5 tasks/s)")
    parser.add_argument("--shape", choices=SHAPES, default="fanout",
                        help="fanout: one source task feeds the leaves; leaves: no source; "
                        "sum: tasks-1 leaves and their sum")
    parser.add_argument("--peers", nargs="+", default=list(PEERS), choices=PEERS)
    args = parser.parse_args(argv)
    build_graph(args.tasks, args.shape)  # bad sizes fail before any cluster starts
    common.setup()

    print(f"# dispatch: {args.tasks} tasks ({args.shape}), {args.workers} workers x "
          f"{args.cores} cores; {common.machine_info()}", flush=True)
    all_runs = {peer: run_peer(peer, args) for peer in args.peers}
    results = {peer: best_noted(runs) for peer, runs in all_runs.items()}
    print(common.table(list(results.values()), "tasks"), flush=True)

    mine = results["datavine"].rate if "datavine" in results else None
    pairs: dict[str, Any] = {"tasks_per_s": f"{mine:.0f}" if mine else "nan"}
    if "daskvine_fc" in results:
        pairs["ratio_vs_daskvine_fc"] = common.ratio(mine, results["daskvine_fc"].rate)
    if "datavine_inline" in results:
        pairs["ratio_vs_keep_on_workers_false"] = common.ratio(
            mine, results["datavine_inline"].rate)
    for peer, result in results.items():
        if peer not in ("datavine", "daskvine_fc", "datavine_inline"):
            pairs[f"ratio_vs_{peer}"] = common.ratio(mine, result.rate)
    for peer, result in results.items():
        pairs[f"{peer}_tasks_per_s"] = f"{result.rate:.0f}" if result.rate else "nan"
    if "datavine" in all_runs:
        first = all_runs["datavine"][0].rate
        pairs["datavine_first_run_tasks_per_s"] = f"{first:.0f}" if first else "nan"
    pairs["shape"] = args.shape
    print(common.kv_line(pairs), flush=True)
    return 0 if all(r.ok for r in results.values()) else 1


if __name__ == "__main__":
    sys.exit(main())
