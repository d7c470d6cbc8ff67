"""Benchmark: dispatch rate of a trivial 5,000-task graph (fan-out + tree reduction).

One source task fans out to ``tasks / 2`` leaves, which a binary tree of ``add`` tasks
reduces to one value: ``tasks`` dask tasks in all, each doing microseconds of work, so the
figure is the scheduler's own cost per task. The same graph runs through:

- datavine: ``datavine.LocalCluster(workers, cores)``, workers connected before the clock;
- DaskVine function-calls and DaskVine tasks (cctools' ``DaskVine.get`` on the dict graph,
  its own local ``vine_worker``s with a password); the tasks mode runs a fresh Python per
  task (~5 tasks/s), so it gets a smaller graph (``--daskvine-tasks-size``);
- dask threads, dask processes (``workers * cores`` of them), distributed LocalCluster
  (``workers`` x ``cores`` threads);
- a plain loop calling the same functions in one process (the floor of the work itself).

Every peer's result is checked against the closed-form sum. The last line printed is
``tasks_per_s=... ratio_vs_daskvine_fc=...`` plus ratios against the other peers.

    .venv/bin/python benchmarks/dispatch.py [--tasks 5000] [--workers 2 --cores 1]
        [--repeat 2] [--peers datavine daskvine_fc ...] [--daskvine-tasks-size 100]
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

PEERS = ("datavine", "daskvine_fc", "daskvine_tasks", "threads", "processes", "distributed",
         "plain_loop")
NAMES = {"datavine": "datavine", "daskvine_fc": "DaskVine function-calls",
         "daskvine_tasks": "DaskVine tasks", "threads": "dask threads",
         "processes": "dask processes", "distributed": "distributed",
         "plain_loop": "plain loop"}
SEED = 7


# The task functions live in this script (__main__), so every peer ships them by value.
def source() -> int:
    return SEED


def leaf(seed: int, i: int) -> int:
    return seed + i


def add(a: int, b: int) -> int:
    return a + b


def expected(tasks: int) -> int:
    """The graph's value in closed form: sum of ``SEED + i`` over the leaves."""
    n = tasks // 2
    return n * SEED + n * (n - 1) // 2


def build_graph(tasks: int) -> Any:
    """A Delayed of exactly ``tasks`` tasks: 1 source, ``tasks/2`` leaves, a binary tree."""
    if tasks < 4 or tasks % 2:
        raise ValueError(f"--tasks must be an even number >= 4, not {tasks}")
    root = dask.delayed(source, pure=False)()
    level = [dask.delayed(leaf, pure=False)(root, i) for i in range(tasks // 2)]
    while len(level) > 1:
        pairs = [dask.delayed(add, pure=False)(a, b) for a, b in zip(level[::2], level[1::2],
                                                                      strict=False)]
        level = pairs + ([level[-1]] if len(level) % 2 else [])
    total = level[0]
    size = len(dict(total.__dask_graph__()))
    if size != tasks:
        raise AssertionError(f"built {size} tasks, wanted {tasks}")
    return total


def plain_loop(tasks: int) -> int:
    """The same calls, in order, in this process: no scheduler at all."""
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
                 note: str = "") -> common.PeerResult:
    """``repeat`` timed runs, each of a fresh graph built before its clock starts; the best
    run, with all times noted."""
    runs = []
    for _ in range(repeat):
        graph = build_graph(tasks)
        runs.append(common.measure(NAMES[peer], tasks, lambda g=graph: compute(g),
                                   lambda v: scalar(v) == expected(tasks), note))
    best = common.best_of(runs)
    if repeat > 1:
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


def run_peer(peer: str, args: argparse.Namespace) -> common.PeerResult:
    slots = args.workers * args.cores
    if peer == "plain_loop":
        return run_repeated(peer, args.tasks, args.repeat, lambda _: plain_loop(args.tasks),
                            "one process, no scheduler")
    if peer == "threads":
        return run_repeated(peer, args.tasks, args.repeat, with_scheduler(
            lambda d, k, **kw: dask.threaded.get(d, k, num_workers=slots, **kw)),
            f"{slots} threads")
    if peer == "processes":
        return run_repeated(peer, args.tasks, args.repeat, with_scheduler(
            lambda d, k, **kw: dask.multiprocessing.get(d, k, num_workers=slots, **kw)),
            f"{slots} processes")
    if peer == "distributed":
        with common.distributed_client(args.workers, args.cores) as client:
            return run_repeated(peer, args.tasks, args.repeat, with_scheduler(client.get),
                                f"{args.workers}x{args.cores}")
    if peer in ("daskvine_fc", "daskvine_tasks"):
        mode = "function-calls" if peer == "daskvine_fc" else "tasks"
        size = args.tasks if peer == "daskvine_fc" else args.daskvine_tasks_size
        repeat = args.repeat if peer == "daskvine_fc" else 1
        with common.daskvine(args.workers, args.cores) as manager:
            return run_repeated(peer, size, repeat, with_dict_graph(
                common.daskvine_get(manager, mode, args.cores)),
                f"{args.workers}x{args.cores}, " + ("library, exec fork" if mode == "function-calls"
                                                    else "a Python per task"))
    if peer == "datavine":
        import datavine

        manager = datavine.ManagerConfig(run_dir=common.run_dir("datavine"))
        with datavine.LocalCluster(workers=args.workers, cores=args.cores,
                                   manager=manager) as cluster:
            result = run_repeated(peer, args.tasks, args.repeat, with_scheduler(cluster.get),
                                  f"{args.workers}x{args.cores}")
            summary = cluster.last_summary
            if summary is not None:
                result.note += f"; last run {summary.bundles} bundles"
            return result
    raise ValueError(f"unknown peer {peer!r}: choose from {', '.join(PEERS)}")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--tasks", type=int, default=5000, help="tasks in the graph (even)")
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument("--cores", type=int, default=1, help="cores per worker")
    parser.add_argument("--repeat", type=int, default=2,
                        help="timed runs per peer (best kept; DaskVine tasks runs once)")
    parser.add_argument("--daskvine-tasks-size", type=int, default=100,
                        help="graph size for DaskVine's tasks mode (~5 tasks/s)")
    parser.add_argument("--peers", nargs="+", default=list(PEERS), choices=PEERS)
    args = parser.parse_args(argv)
    build_graph(args.tasks)  # bad sizes fail before any cluster starts
    common.quiet()

    print(f"# dispatch: {args.tasks} tasks, {args.workers} workers x {args.cores} cores; "
          f"{common.machine_info()}", flush=True)
    results = {peer: run_peer(peer, args) for peer in args.peers}
    print(common.table(list(results.values()), "tasks"), flush=True)

    mine = results["datavine"].rate if "datavine" in results else None
    pairs: dict[str, Any] = {"tasks_per_s": f"{mine:.0f}" if mine else "nan"}
    if "daskvine_fc" in results:
        pairs["ratio_vs_daskvine_fc"] = common.ratio(mine, results["daskvine_fc"].rate)
    for peer, result in results.items():
        if peer not in ("datavine", "daskvine_fc"):
            pairs[f"ratio_vs_{peer}"] = common.ratio(mine, result.rate)
    for peer, result in results.items():
        pairs[f"{peer}_tasks_per_s"] = f"{result.rate:.0f}" if result.rate else "nan"
    print(common.kv_line(pairs), flush=True)
    return 0 if all(r.ok for r in results.values()) else 1


if __name__ == "__main__":
    sys.exit(main())
