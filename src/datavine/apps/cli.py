"""The ``datavine`` command: the main job on the embedded default, pools, the scale test.

- ``datavine run``: generates NanoAOD-like data (reused when present), serves it through a
  loopback XCache testbed when XRootD is installed (else reads local files, and says so),
  starts a :class:`~datavine.manager.cluster.LocalCluster` (one 1-core worker per core of this
  machine), runs the AGC-style analysis (:mod:`datavine.apps.analysis.agc`) as a dask graph on
  it and prints the result, the run summary and the events/s; ``--json`` writes a record,
  and the run's view as one HTML file next to it. The live view's address is printed when
  the cluster is up (``--no-dashboard``: none; :mod:`datavine.dashboard`).
  ``--facility FILE`` takes the manager, run settings, shards and pools from a facility
  description (:mod:`datavine.deploy.facility`).
- ``datavine pool start|status|stop``: :mod:`datavine.deploy.pools.cli`.
- ``datavine scale-test``: :mod:`datavine.apps.scaletest.cli`, when that module is installed.
- ``datavine box up|down|status|exec|cut|restore|shape``: a facility in a box
  (:mod:`datavine.deploy.box.cli`).
- ``datavine story RUN.json [TASK]``: what happened to a finished run's bundles, or to one
  task (:mod:`datavine.apps.story`).
- ``datavine doctor``: what the TaskVine in use lacks for datavine, one line each, and how
  to get it (:mod:`datavine.apps.doctor`).

Settings that cannot be used (:class:`~datavine.config.ConfigError`) and datavine's own
errors (:class:`~datavine.errors.DatavineError`) end the command with exit code 2 and one
line naming the setting or file; ``--verbose`` shows the whole message and traceback.
"""

from __future__ import annotations

import argparse
import contextlib
import importlib
import json
import sys
import time
import traceback
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING, TypedDict

from datavine.apps import cli_types
from datavine.apps.jsondata import JSON
from datavine.config import ConfigError
from datavine.deploy.local_workers import default_workers
from datavine.deploy.signals import Terminated, handled, terminate_gracefully
from datavine.errors import DatavineError

if TYPE_CHECKING:
    import numpy as np
    from _typeshed import DataclassInstance

    from datavine.apps.analysis.agc import Chunk
    from datavine.apps.analysis.sources import ChunkSource, SourcedResult
    from datavine.deploy.facility import Facility
    from datavine.io.shards import ShardMap
    from datavine.manager.cluster import Cluster
    from datavine.scheduler.summary import RunSummary

EXIT_ERROR = 2
DEFAULT_DATA = Path("runs/data")


class RunError(DatavineError):
    """The main job cannot go on; the message names the file or setting."""


class RunRecord(TypedDict, total=False):
    """The JSON record of ``datavine run --json``: filled as the job goes."""

    command: str
    setup_s: dict[str, float]  # seconds of each step before the analysis
    data: dict[str, JSON]
    reading: dict[str, JSON]  # how the inputs are read: local files, shards
    cluster: dict[str, JSON]
    dashboard_html: str
    events: int
    events_selected: int
    chunks: int
    bytes_read: int
    wall_s: float
    events_per_s: float
    histogram: dict[str, JSON]
    servers: dict[str, int]
    failovers: int
    summary: dict[str, JSON] | None



def add_run_command(subparsers: argparse._SubParsersAction) -> None:
    run = subparsers.add_parser(
        "run", help="the main job: AGC-style analysis of generated NanoAOD-like data",
        description="Generate NanoAOD-like data (reused when present), read it through a "
        "loopback XCache testbed (or local files) on local TaskVine workers, and report.")
    data = run.add_argument_group("data")
    data.add_argument("--data", type=Path, default=DEFAULT_DATA, metavar="DIR",
                      help=f"where the generated files live (default {DEFAULT_DATA})")
    data.add_argument("--files", type=cli_types.positive, default=8, metavar="N")
    data.add_argument("--events", type=cli_types.positive, default=100_000, metavar="N",
                      help="events per file (default 100000)")
    data.add_argument("--compression", choices=("zstd", "lz4", "zlib", "lzma"), default="zstd")
    data.add_argument("--chunk-events", type=cli_types.positive, default=100_000, metavar="N",
                      help="events per task (default 100000)")
    where = run.add_argument_group("where it runs")
    where.add_argument("--workers", type=cli_types.positive, default=None, metavar="N",
                       help=f"local 1-core workers (default: cores here, {default_workers()})")
    where.add_argument("--no-xcache", action="store_true",
                       help="read the local files, not through the XCache testbed")
    where.add_argument("--shards", type=cli_types.positive, default=2, metavar="N",
                       help="XCache shards of the testbed (default 2, racks A and B)")
    where.add_argument("--pool-workers", type=cli_types.positive, default=None, metavar="N",
                       help="start no local workers: wait for N workers of a pool started "
                       "with 'datavine pool start' (give the pool --port and --password)")
    where.add_argument("--pool-timeout", type=cli_types.seconds, default=120.0, metavar="S",
                       help="with --pool-workers: give up after S seconds (default 120)")
    where.add_argument("--port", type=cli_types.port, default=0, metavar="P",
                       help="the manager's port (default: any free port)")
    where.add_argument("--listen-host", default="127.0.0.1", metavar="HOST",
                       help="the address the manager listens on (default 127.0.0.1: workers "
                       "on this host only; a pool's workers on other hosts need the address "
                       "they reach it by, or 0.0.0.0 for every interface)")
    where.add_argument("--password", type=Path, default=None, metavar="FILE",
                       help="the manager's password file (default: a new one for this run)")
    where.add_argument("--facility", type=Path, metavar="FILE",
                       help="manager, run settings, shards and pools from a facility file")
    where.add_argument("--no-memory-caps", action="store_true",
                       help="run bundles in the library process itself, uncapped")
    where.add_argument("--timeout", type=cli_types.seconds, default=None, metavar="S",
                       help="fail when the analysis takes longer than S seconds")
    where.add_argument("--task-time-limit", type=cli_types.seconds, default=None, metavar="S",
                       help="stop a task that runs longer than S seconds (retried once)")
    out = run.add_argument_group("output")
    out.add_argument("--json", type=Path, metavar="FILE", help="write a JSON record of the run")
    out.add_argument("--no-progress", action="store_true", help="no progress bar")
    from datavine.dashboard.launch import add_options as add_dashboard_options

    add_dashboard_options(out)
    run.set_defaults(func=cmd_run)


def add_scale_test_command(subparsers: argparse._SubParsersAction) -> bool:
    """``datavine scale-test`` when :mod:`datavine.apps.scaletest.cli` is installed."""
    try:
        module = importlib.import_module("datavine.apps.scaletest.cli")
    except ModuleNotFoundError as exc:
        if exc.name and exc.name.startswith("datavine.apps.scaletest"):
            return False
        raise
    module.add_command(subparsers)
    return True


def build_parser() -> argparse.ArgumentParser:
    from datavine import __version__
    from datavine.apps.doctor import add_command as add_doctor_command
    from datavine.apps.story import add_command as add_story_command
    from datavine.deploy.box.cli import add_box_commands
    from datavine.deploy.pools.cli import add_pool_commands

    parser = argparse.ArgumentParser(
        prog="datavine", description="A data-aware scheduler for particle-physics analysis "
        "on TaskVine.")
    parser.add_argument("--version", action="version", version=f"datavine {__version__}")
    parser.add_argument("--verbose", action="store_true",
                        help="on an error, show the whole message and the traceback")
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    add_run_command(sub)
    add_pool_commands(sub)
    add_scale_test_command(sub)
    add_box_commands(sub)
    add_story_command(sub)
    add_doctor_command(sub)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point of the ``datavine`` console script; returns the exit code."""
    parser = build_parser()
    try:
        args = parser.parse_args(argv)
    except SystemExit as exc:  # argparse: 2 for bad arguments, 0 for --help
        return exc.code if isinstance(exc.code, int) else EXIT_ERROR
    try:
        with terminate_gracefully():  # SIGTERM/SIGHUP clean up as Ctrl-C does
            return int(args.func(args))
    except (DatavineError, ConfigError) as exc:
        if args.verbose:
            traceback.print_exc()
        message = str(exc).strip().splitlines() or [type(exc).__name__]
        more = " (--verbose shows more)" if len(message) > 1 and not args.verbose else ""
        print(f"datavine {args.command}: {message[0]}{more}", file=sys.stderr)
        return EXIT_ERROR
    except Terminated as exc:
        handled()
        done = ("; started pools are left running (datavine pool stop)" if args.command == "pool"
                else "; stopped what it had started")
        print(f"datavine {args.command}: {exc}{done}", file=sys.stderr)
        return exc.exit_code
    except KeyboardInterrupt:
        print(f"datavine {args.command}: interrupted", file=sys.stderr)
        return 130


# ----------------------------------------------------------------------------------------------
# datavine run


def cmd_run(args: argparse.Namespace) -> int:
    """``datavine run``: see the module docstring."""
    record = run_job(args)
    if args.json is not None:
        write_record(args.json, record)
    return 0


def write_record(path: Path, record: RunRecord) -> None:
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(json.dumps(record, indent=2, default=str) + "\n")
    except OSError as exc:
        raise RunError(f"cannot write the JSON record --json {path}: {exc.strerror}") from exc
    print(f"record written to {path}")


def run_job(args: argparse.Namespace) -> RunRecord:
    """Data, inputs, cluster, analysis, report; returns the JSON record."""
    from datavine.deploy.facility import load_facility

    facility = load_facility(args.facility) if args.facility is not None else None
    record: RunRecord = {"command": "run", "setup_s": {}}
    files = make_data(args, record)
    with contextlib.ExitStack() as stack:
        t0 = time.monotonic()
        source, chunks = open_inputs(stack, args, files, facility, record)
        record["setup_s"]["inputs"] = round(time.monotonic() - t0, 3)
        t0 = time.monotonic()
        shardmap = getattr(source, "shardmap", None)
        cluster = start_cluster(stack, args, facility, shardmap, record)
        record["setup_s"]["cluster"] = round(time.monotonic() - t0, 3)
        result, wall_s = run_analysis(cluster, source, chunks)
        summary = cluster.last_summary
        if args.json is not None:
            save_view(cluster, args.json.with_suffix(".html"), record)
    report(result, wall_s, summary, record, show_summary=args.no_progress)
    return record


def save_view(cluster: Cluster, path: Path, record: RunRecord) -> None:
    """The run's view as one HTML file (``--json X`` -> ``X.html``), when it has one."""
    try:
        saved = cluster.save_report(path, title="datavine run")
    except OSError as exc:
        raise RunError(f"cannot write the run's view {path}: {exc.strerror or exc}") from exc
    if saved is not None:
        record["dashboard_html"] = str(saved)
        print(f"view saved to {saved}")


def make_data(args: argparse.Namespace, record: RunRecord) -> list[Path]:
    """The generated files (made once, reused by later runs with the same parameters)."""
    from datavine.io.datagen import generate_dataset

    t0 = time.monotonic()
    print(f"data: {args.files} files x {args.events:,} events ({args.compression}) in "
          f"{args.data}")
    try:
        files = generate_dataset(args.data, args.files, args.events, args.compression)
    except OSError as exc:
        raise RunError(f"cannot write the generated data into --data {args.data}: "
                       f"{exc.strerror or exc}") from exc
    size = sum(f.stat().st_size for f in files)
    record["setup_s"]["data"] = round(time.monotonic() - t0, 3)
    record["data"] = {"dir": str(args.data.resolve()), "files": len(files),
                      "events_per_file": args.events, "compression": args.compression,
                      "chunk_events": args.chunk_events, "bytes": size}
    print(f"data: ready in {time.monotonic() - t0:.1f} s, {size / 1e6:.1f} MB")
    return files


def open_inputs(stack: contextlib.ExitStack, args: argparse.Namespace, files: list[Path],
                facility: Facility | None,
                record: RunRecord) -> tuple[ChunkSource, list[Chunk]]:
    """The chunk source and the chunks: local files, the facility's shards or the testbed."""
    from datavine.apps.analysis.agc import make_chunks
    from datavine.apps.analysis.sources import LocalFiles, XCacheShards, to_origin

    if args.no_xcache:
        record["reading"] = {"mode": "local"}
        return LocalFiles(), make_chunks(files, args.chunk_events)
    if facility is not None and facility.shards is not None:
        return XCacheShards(facility.shards), facility_chunks(facility, files, args, record)
    from datavine.apps.testbed import serve_on_testbed
    from datavine.io.xcache.testbed import xcache_missing

    why = xcache_missing()
    if why:
        print(f"note: reading the local files, not through XCache: {why}")
        record["reading"] = {"mode": "local", "notice": why}
        return LocalFiles(), make_chunks(files, args.chunk_events)

    testbed, folder, served = serve_on_testbed(stack, args.data, files, args.shards)
    shardmap = testbed.shard_map()
    print(f"xcache: origin {testbed.origin_url}, {args.shards} shard(s): " + ", ".join(
        f"{s.name} {s.url} rack {s.rack}" for s in shardmap.shards))
    record["reading"] = {"mode": "xcache-testbed", "origin": testbed.origin_url,
                         "shards": [{"name": s.name, "url": s.url, "rack": s.rack}
                                    for s in shardmap.shards]}
    chunks = to_origin(make_chunks(served, args.chunk_events), folder, testbed.origin_url)
    return XCacheShards(shardmap), chunks


def facility_chunks(facility: Facility, files: list[Path], args: argparse.Namespace,
                    record: RunRecord) -> list[Chunk]:
    """Chunks addressed at the facility's origin: ``--data`` must lie in its export root."""
    from datavine.apps.analysis.agc import make_chunks
    from datavine.apps.analysis.sources import to_origin

    shards = facility.shards
    assert shards is not None
    if shards.origin is None or facility.export_root is None:
        raise RunError(f"{facility.path}: xcache.origin and xcache.export_root are needed to "
                       "read --data through the facility's shards (or pass --no-xcache)")
    try:
        chunks = to_origin(make_chunks(files, args.chunk_events), facility.export_root,
                           shards.origin.url)
    except ValueError as exc:
        raise RunError(f"{facility.path}: xcache.export_root: {exc}") from exc
    record["reading"] = {"mode": "xcache-facility", "origin": shards.origin.url,
                         "shards": [{"name": s.name, "url": s.url, "rack": s.rack}
                                    for s in shards.shards]}
    return chunks


def start_cluster(stack: contextlib.ExitStack, args: argparse.Namespace,
                  facility: Facility | None, shardmap: ShardMap | None,
                  record: RunRecord) -> Cluster:
    """A started cluster (:mod:`datavine.apps.command_cluster`): local workers, a pool's, or
    the facility's pools; closed by ``stack``.

    ``shardmap`` (the shards the data is read through) lets the runtime place chunk tasks
    near their shard; local workers are then split over the shards' racks."""
    from datavine.apps.command_cluster import ClusterRequest, start_command_cluster
    from datavine.dashboard.launch import announce, option_from_args
    from datavine.dashboard.metrics_listener import metrics_from_args
    from datavine.manager.cluster import LocalCluster

    if facility is not None:
        if args.port or args.password is not None or args.listen_host != "127.0.0.1":
            raise RunError(f"--port, --password and --listen-host do not go with --facility: "
                           f"set them in the [manager] section of {facility.path}")
    elif args.password is not None and not args.password.is_file():
        raise RunError(f"--password {args.password}: no such file")
    chosen = start_command_cluster(stack, ClusterRequest(
        facility=facility, shardmap=shardmap, progress=not args.no_progress,
        timeout_s=args.timeout, memory_caps=not args.no_memory_caps,
        task_time_limit_s=args.task_time_limit, port=args.port, password_file=args.password,
        listen_host=args.listen_host, workers=args.workers, pool_workers=args.pool_workers,
        connect_timeout_s=args.pool_timeout, dashboard=option_from_args(args),
        metrics=metrics_from_args(args)))
    cluster, run = chosen.cluster, chosen.cluster.run_config
    assert cluster.runtime is not None
    workers = cluster.runtime.connected_workers()
    racks = cluster.workers_config.racks if isinstance(cluster, LocalCluster) else ()
    where = f" in racks {', '.join(racks)}" if racks else ""
    print(f"cluster: {chosen.kind}{where}, {workers} connected to the manager on port "
          f"{cluster.port}; memory caps {'on' if run.memory is not None else 'off'}")
    print(announce(cluster), flush=True)
    record["cluster"] = {"kind": chosen.kind, "workers": workers, "port": cluster.port,
                         "racks": list(racks), "memory_caps": run.memory is not None,
                         "dashboard": (cluster.dashboard.address  # never its token
                                       if cluster.dashboard is not None else None)}
    return cluster


def run_analysis(cluster: Cluster, source: ChunkSource,
                 chunks: list[Chunk]) -> tuple[SourcedResult, float]:
    """The analysis graph computed on ``cluster``; (merged result, wall seconds)."""
    import dask

    from datavine.apps.analysis.sources import analysis_graph

    total = analysis_graph(source, chunks)
    # events/s in the view and the metrics: the keys analysis_graph gives
    cluster.expect_events({f"agc-chunk-{i}": c.entry_stop - c.entry_start
                           for i, c in enumerate(chunks)})
    t0 = time.monotonic()
    (result,) = dask.compute(total, scheduler=cluster.get)
    return result, time.monotonic() - t0


def report(result: SourcedResult, wall_s: float, summary: RunSummary | None, record: RunRecord,
           *, show_summary: bool) -> None:
    """Print the result and throughput; fill the record."""
    res = result.result
    share = res.events_selected / res.events if res.events else 0.0
    rate = res.events / wall_s if wall_s > 0 else 0.0
    print(f"result: {res.events:,} events in {res.chunks} chunks, {res.events_selected:,} "
          f"selected ({share:.2%})")
    print(f"trijet mass [GeV]: {histogram_line(res.counts, res.edges)}")
    servers = ", ".join(f"{name} {n}" for name, n in sorted(result.servers.items()))
    print(f"read: {res.bytes_read / 1e6:.1f} MB; chunks by server: {servers}; "
          f"{result.failovers} chunk(s) away from their home shard")
    if show_summary and summary is not None:
        for line in summary.lines():
            print(line)
    workers = record.get("cluster", {}).get("workers", "?")
    print(f"throughput: {res.events:,} events in {wall_s:.2f} s on {workers} worker(s): "
          f"{rate:,.0f} events/s")
    record.update({
        "events": res.events, "events_selected": res.events_selected, "chunks": res.chunks,
        "bytes_read": res.bytes_read, "wall_s": round(wall_s, 4), "events_per_s": rate,
        "histogram": {"edges": res.edges.tolist(), "counts": res.counts.tolist()},
        "servers": dict(result.servers), "failovers": result.failovers,
        "summary": summary_dict(summary) if summary is not None else None,
    })


def summary_dict(summary: RunSummary) -> dict[str, JSON]:
    """The run summary as JSON-ready data (``RunSummary.to_dict`` cannot copy its
    defaultdict fields with ``dataclasses.asdict``)."""
    data = plain_fields(summary)
    data["tasks_per_s"] = summary.tasks_per_s
    reads = plain_fields(summary.reads)  # plain(summary)["reads"]
    reads["near_fraction"] = summary.reads.near_fraction
    data["reads"] = reads
    return data


def plain_fields(record: DataclassInstance) -> dict[str, JSON]:
    """A dataclass's fields, :func:`plain`."""
    import dataclasses

    return {f.name: plain(getattr(record, f.name)) for f in dataclasses.fields(record)}


def plain(value: object) -> JSON:
    """Dataclasses, mappings and sequences as dicts and lists (keys as strings)."""
    import dataclasses

    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        return plain_fields(value)
    if isinstance(value, dict):
        return {k if isinstance(k, str) else str(k): plain(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [plain(v) for v in value]
    return value if isinstance(value, (str, int, float, bool, type(None))) else str(value)


def histogram_line(counts: np.ndarray, edges: np.ndarray) -> str:
    """A one-line picture of a histogram: its peak bin, mean and a bar per bin."""
    total = int(counts.sum())
    if total == 0:
        return "empty"
    peak = int(counts.argmax())
    centres = (edges[:-1] + edges[1:]) / 2
    mean = float((counts * centres).sum() / total)
    bars = " ▁▂▃▄▅▆▇█"
    top = counts.max()
    picture = "".join(bars[round(8 * float(c) / top)] for c in counts)
    return (f"{total:,} entries, peak {edges[peak]:.0f}-{edges[peak + 1]:.0f}, mean "
            f"{mean:.1f} |{picture}|")


if __name__ == "__main__":
    sys.exit(main())
