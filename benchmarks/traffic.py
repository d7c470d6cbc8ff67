"""Where the intermediate bytes go: through the manager, or worker to worker.

    .venv/bin/python benchmarks/traffic.py [--workers 2] [--repeat 2]
        [--peers datavine inline daskvine distributed]

Two graphs whose intermediates are large, on ``--workers`` local 1-core workers:

- ``tree``: 32 tasks each making a 16 MiB numpy array, merged 4 at a time (537 MB of
  intermediates, a 16 MiB result);
- ``agc``: the AGC-style selection over 32 chunks of generated ZSTD NanoAOD-like files
  (``runs/data-traffic``, made once), each chunk also filling a histogram of 640 systematic
  variations x 3,200 bins (16 MiB, as analyses with many systematics carry), merged 4 at a
  time.

Peers: datavine (values kept on workers; the column cache off, so that every repeat reads
its chunks as the other peers do), datavine with every value through the manager
(``RunConfig(keep_on_workers=False)``, "inline"), cctools' DaskVine function-calls with
``worker_transfers=True``, and distributed. For each: seconds, tasks/s (events/s for agc),
the manager's bytes out + in (TaskVine's file counters, plus the results that come back as
a call's standard output, counted by their length: :func:`count_replies`; distributed keeps
values on its workers by design and is not counted), the final output's bytes, and the
bytes the workers sent one another (datavine's count of kept files fetched by another
worker; distributed's ``transfer_outgoing_bytes_total``, which counts what its workers send
the client too). Each peer runs ``--repeat`` times; the fastest run counts. Last line:
``manager_bytes_ratio`` (datavine's manager bytes / final output bytes, tree),
``throughput_ratio`` (datavine / inline, tree and agc), ``ratio_vs_daskvine`` (datavine /
DaskVine, tree and agc).
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import common

from datavine.scheduler.graph import add_merge_tree

VARIATIONS, BINS = 640, 3200  # 16 MiB of float64 per chunk


# --- the graphs (functions travel by value: this is __main__) -------------------------------
def make_array(i: int) -> Any:
    import numpy as np

    return np.full(2 * 1024 * 1024, float(i))  # 16 MiB


def add(*parts: Any) -> Any:
    return sum(parts[1:], parts[0])


def chunk_with_systematics(path: str, start: int, stop: int) -> tuple[Any, Any]:
    """The AGC chunk result and a 16 MiB histogram of variations (scaled nominal shape)."""
    import numpy as np

    from datavine.apps.analysis.agc import process_chunk

    result = process_chunk(path, start, stop)
    shape = np.interp(np.linspace(0, len(result.counts) - 1, BINS),
                      np.arange(len(result.counts)), result.counts.astype(float))
    scale = 1.0 + 0.01 * np.arange(VARIATIONS)[:, None]
    return result, scale * shape[None, :]


def merge_systematics(*parts: tuple[Any, Any]) -> tuple[Any, Any]:
    result, hist = parts[0][0], parts[0][1].copy()
    for r, h in parts[1:]:
        result = result + r
        hist += h
    return result, hist


def tree_graph(tag: int = 0) -> tuple[dict[Any, Any], Any, Callable[[Any], bool]]:
    """``tag``: in every key, so that each repeat computes anew (distributed would hand back
    values it still holds from the last one)."""
    dsk: dict[Any, Any] = {("make", tag, i): (make_array, i) for i in range(32)}
    final = add_merge_tree(dsk, list(dsk), 4, key=lambda d, j: ("add", tag, d, j),
                           task=lambda keys: (add, *keys))
    return dsk, final, lambda v: float(v[0]) == sum(range(32)) and v.nbytes == 16 * 2**20


def agc_graph(chunks: list[Any], reference: Any, tag: int = 0,
              ) -> tuple[dict[Any, Any], Any, Callable[[Any], bool]]:
    dsk: dict[Any, Any] = {("agc-chunk", tag, i): (chunk_with_systematics, str(c.path),
                                                   c.entry_start, c.entry_stop)
                           for i, c in enumerate(chunks)}
    final = add_merge_tree(dsk, list(dsk), 4, key=lambda d, j: ("agc-merge", tag, d, j),
                           task=lambda keys: (merge_systematics, *keys))
    return dsk, final, lambda v: v[0] == reference and v[1].shape == (VARIATIONS, BINS)


# --- peers ---------------------------------------------------------------------------------
@dataclass
class Peer:
    """One peer, its workers connected: its ``get``, the manager's file bytes so far, and
    the bytes its workers sent one another so far (None: not counted)."""

    get: Callable[..., Any]
    manager_bytes: Callable[[], int]
    peer_bytes: Callable[[], int | None]


@contextmanager
def peer(name: str, workers: int) -> Iterator[Peer]:
    if name in ("datavine", "inline"):
        import datavine

        # column_cache off: each repeat reads its chunks, as distributed's does (with it on, a
        # repeat reads nothing, its results' bytes_read is 0, the check fails, and the agc
        # row was the first, cold run against distributed's best of --repeat)
        run = datavine.RunConfig(keep_on_workers=name == "datavine", column_cache=False,
                                 preload=("awkward", "uproot"))
        with datavine.LocalCluster(workers=workers, cores=1, run=run,
                                   manager=datavine.ManagerConfig(
                                       run_dir=common.run_dir(name))) as cluster:
            moved = [0]  # worker to worker, summed over the runs so far

            def get(dsk: Any, keys: Any) -> Any:
                try:
                    return cluster.get(dsk, keys)
                finally:
                    if cluster.last_summary is not None:
                        moved[0] += cluster.last_summary.traffic.peer

            replies = count_replies(cluster)
            yield Peer(get, lambda: sum(cluster.runtime.file_bytes()) + replies[0],
                       lambda: moved[0])
    elif name == "daskvine":
        with common.daskvine(workers, 1) as manager:
            def vine_get(dsk: Any, keys: Any) -> Any:
                return manager.get(dict(dsk), keys, task_mode="function-calls",
                                   worker_transfers=True, progress_disable=True,
                                   lib_resources={"cores": 1, "slots": 1})
            yield Peer(vine_get, lambda: int(manager.stats.bytes_sent)
                       + int(manager.stats.bytes_received), lambda: None)
    else:
        with common.distributed_client(workers, 1) as client:
            def sent() -> int:  # what the workers sent each other (and the client)
                return sum(client.run(lambda dask_worker: dask_worker
                                      .transfer_outgoing_bytes_total).values())
            yield Peer(client.get, lambda: 0, sent)


def count_replies(cluster: Any) -> list[int]:
    """A counter of the bytes of the calls' results that came back to the manager as their
    standard output (base64 text, :mod:`datavine.manager.bundle_calls`): TaskVine's file
    counters do not see them. A private hook of the benchmark's own (it wraps the port's
    ``take``); the counter stays 0 where the port has none."""
    counted = [0]
    calls = getattr(getattr(cluster.runtime, "taskvine", None), "_bundles", None)
    take = getattr(calls, "take", None)
    if take is None:
        return counted

    def take_counted(task: Any) -> Any:
        ended = take(task)
        reply = getattr(ended, "reply", None)
        if isinstance(reply, str | bytes):
            counted[0] += len(reply)
        return ended

    calls.take = take_counted
    return counted


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument("--repeat", type=int, default=2)
    parser.add_argument("--limit", type=float, default=180.0,
                        help="seconds a peer's run may take before it counts as failed (a "
                             "peer stuck in a recovery loop must not hang the benchmark)")
    parser.add_argument("--peers", nargs="+", default=["datavine", "inline", "daskvine",
                                                       "distributed"])
    parser.add_argument("--data", type=Path, default=common.REPO / "runs" / "data-traffic")
    args = parser.parse_args(argv)
    common.setup()
    from datavine.apps.analysis.agc import make_chunks, run_plain_loop
    from datavine.io.datagen import generate_dataset

    files = generate_dataset(args.data, 8, 100_000, "zstd")
    chunks = make_chunks(files, 25_000)
    reference = run_plain_loop(chunks)
    graphs: dict[str, Callable[[int], tuple[dict[Any, Any], Any, Callable[[Any], bool]]]] = {
        "tree": tree_graph, "agc": lambda tag: agc_graph(chunks, reference, tag)}
    units = {"tree": len(tree_graph()[0]), "agc": 800_000}
    print(common.machine_info())
    rows: dict[tuple[str, str], Row] = {}
    for name in args.peers:
        with peer(name, args.workers) as vine:
            for graph_name, build in graphs.items():
                best: Row | None = None
                for repeat in range(args.repeat):
                    dsk, final, check = build(repeat)
                    before, peer_before = vine.manager_bytes(), vine.peer_bytes()
                    out: list[Any] = []

                    def run(out: list[Any] = out, dsk: Any = dsk, final: Any = final,
                            get: Callable[..., Any] = vine.get) -> Any:
                        out.append(get(dsk, [final])[0])
                        return out[0]

                    result = common.measure(f"{name} {graph_name}", units[graph_name], run,
                                            check, limit_s=args.limit)
                    moved = vine.manager_bytes() - before
                    peer_after = vine.peer_bytes()
                    between = (peer_after - peer_before if peer_after is not None
                               and peer_before is not None else None)
                    size = output_bytes(out[0]) if out else 0
                    if best is None or (result.rate or 0) > (best.result.rate or 0):
                        best = Row(result, moved, size, between)
                assert best is not None
                rows[(name, graph_name)] = best
    print_table(rows)
    print(common.kv_line(summary(rows)))
    return 0


@dataclass
class Row:
    """A peer's best run of one graph: its measurement, the manager's bytes, the output's
    bytes and the bytes its workers sent one another (None: not counted)."""

    result: common.PeerResult
    manager: int
    output: int
    between: int | None


def output_bytes(value: Any) -> int:
    import cloudpickle

    return len(cloudpickle.dumps(value))


def print_table(rows: dict[tuple[str, str], Row]) -> None:
    print("\n| graph | peer | seconds | rate | manager MB | output MB | manager / output | "
          "worker to worker MB | correct |\n|---|---|---:|---:|---:|---:|---:|---:|---|")
    mb = 2**20
    for (name, graph_name), row in rows.items():
        r, size = row.result, row.output
        counted = row.manager if name != "distributed" else None
        between = f"{row.between / mb:,.1f}" if row.between is not None else "n/a"
        print(f"| {graph_name} | {name} | {r.seconds or 0:.2f} | {r.rate or 0:,.0f} | "
              f"{f'{counted / mb:,.1f}' if counted is not None else 'n/a'} | {size / mb:.1f} | "
              f"{f'{counted / size:.2f}' if counted is not None and size else 'n/a'} | "
              f"{between} | {'yes' if r.ok else 'NO'} |")
    print()


def summary(rows: dict[tuple[str, str], Row]) -> dict[str, Any]:
    def rate(name: str, graph: str) -> float | None:
        row = rows.get((name, graph))
        return row.result.rate if row else None

    def bytes_ratio(graph: str) -> str:
        row = rows.get(("datavine", graph))
        return f"{row.manager / row.output:.2f}" if row and row.output else "nan"

    return {
        "manager_bytes_ratio": bytes_ratio("tree"),
        "manager_bytes_ratio_agc": bytes_ratio("agc"),
        "throughput_ratio": common.ratio(rate("datavine", "tree"), rate("inline", "tree")),
        "throughput_ratio_agc": common.ratio(rate("datavine", "agc"), rate("inline", "agc")),
        "ratio_vs_daskvine": common.ratio(rate("datavine", "tree"), rate("daskvine", "tree")),
        "ratio_vs_daskvine_agc": common.ratio(rate("datavine", "agc"), rate("daskvine", "agc")),
        "ratio_vs_distributed": common.ratio(rate("datavine", "tree"),
                                             rate("distributed", "tree")),
        "ratio_vs_distributed_agc": common.ratio(rate("datavine", "agc"),
                                                 rate("distributed", "agc")),
    }


if __name__ == "__main__":
    sys.exit(main())
