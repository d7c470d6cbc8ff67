"""``datavine scale-test`` (and ``python -m datavine.apps.scaletest``): run, report, plot.

``add_command(subparsers)`` adds the ``scale-test`` sub-command to datavine's CLI (its
handler is ``func``, taking the parsed arguments and returning the exit code); ``main(argv)``
runs the same options on their own. The record goes to ``--json`` and the timeline to
``--png`` (both under ``--out`` by default), the run's view as one HTML file next to the
record (``scaletest.html``; the live view's address is printed when the cluster is up,
``--no-dashboard`` turns both off); the last line printed is the headline figures as
``key=value`` pairs.
"""

from __future__ import annotations

import argparse
import sys
import traceback
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from datavine.apps import cli_types
from datavine.apps.scaletest.run import COMPRESSIONS, POOLS, ScaleTestConfig, run_scale_test
from datavine.config import ConfigError
from datavine.dashboard.launch import option_from_args
from datavine.dashboard.metrics_listener import metrics_from_args
from datavine.deploy.signals import Terminated, handled, terminate_gracefully
from datavine.errors import DatavineError

DEFAULT_OUT = Path("runs/scaletest")


@dataclass(frozen=True)
class Size:
    files: int
    events_per_file: int
    passes: int


# The default run lasts tens of seconds here (ZSTD, 2 cores: ~2-3M events/s): 32M events,
# read from 4M generated ones (~430 MB, generated once); --quick is the old default.
LONG = Size(files=16, events_per_file=250_000, passes=8)
QUICK = Size(files=8, events_per_file=100_000, passes=1)
EXIT_ERROR = 2


def add_options(parser: argparse.ArgumentParser) -> None:
    """The scale test's options, on ``parser``."""
    data = parser.add_argument_group("data")
    data.add_argument("--files", type=cli_types.positive, metavar="N",
                      help=f"generated files (default {LONG.files}; --quick {QUICK.files})")
    data.add_argument("--events-per-file", type=cli_types.positive, metavar="N",
                      help=f"events per generated file (default {LONG.events_per_file}; "
                      f"--quick {QUICK.events_per_file})")
    data.add_argument("--passes", type=cli_types.positive, metavar="N",
                      help=f"read the dataset N times (default {LONG.passes}, tens of seconds "
                      f"on 2 cores so the timeline shows ramp-up, steady state and tail; "
                      f"--quick {QUICK.passes})")
    data.add_argument("--quick", action="store_true",
                      help=f"a short run: {QUICK.files} files x {QUICK.events_per_file} events, "
                      f"{QUICK.passes} pass (under a second of processing here)")
    data.add_argument("--compression", choices=COMPRESSIONS, default="zstd",
                      help="compression of the generated files (default zstd)")
    data.add_argument("--seed", type=cli_types.non_negative, default=0, help="generator seed")
    data.add_argument("--data", type=Path, default=DEFAULT_OUT / "data", metavar="DIR",
                      help=f"where generated files live (default {DEFAULT_OUT / 'data'}; "
                      "reused when their parameters match)")
    data.add_argument("--fileset", type=Path, metavar="JSON",
                      help="read these files or URLs instead of generated data")
    data.add_argument("--chunk-events", type=cli_types.positive, default=100_000, metavar="N",
                      help="events per task (default 100000)")
    pool = parser.add_argument_group("pool")
    pool.add_argument("--pool", choices=POOLS, default="local",
                      help="local: workers on this host (default); external: workers of a "
                      "pool started elsewhere connect to --port; condor: HTCondor workers "
                      "through vine_factory")
    pool.add_argument("--workers", type=cli_types.positive, metavar="N",
                      help="workers (default: one per core here)")
    pool.add_argument("--cores", type=cli_types.positive, default=1, metavar="C",
                      help="cores per worker (default 1)")
    pool.add_argument("--memory", type=cli_types.positive, metavar="MB", help="memory per worker")
    pool.add_argument("--port", type=cli_types.non_negative, default=0,
                      help="the manager's port (needed with --pool external)")
    pool.add_argument("--password", type=Path, metavar="FILE",
                      help="the manager's password file (needed with --pool external)")
    pool.add_argument("--manager-host", default="127.0.0.1",
                      help="where condor workers reach the manager (default 127.0.0.1)")
    pool.add_argument("--xcache", type=cli_types.non_negative, default=0, metavar="N",
                      help="read the generated files through a loopback XCache testbed of "
                      "N shards (default 0: local files)")
    pool.add_argument("--facility", type=Path, metavar="FILE",
                      help="manager, run settings and XCache shards from a facility file "
                      "(the data must lie in its export_root); workers from its pools, or "
                      "--pool external --workers N of a pool started elsewhere")
    pool.add_argument("--no-memory-caps", action="store_true",
                      help="run tasks in the workers' library processes, uncapped, not in "
                      "their capped child")
    pool.add_argument("--no-column-cache", action="store_true",
                      help="workers keep no decoded columns (RunConfig.column_cache off): "
                      "every pass decodes its baskets again")
    pool.add_argument("--column-cache-share", type=float, metavar="F",
                      help="the column cache's share of a bundle's memory cap "
                      "(RunConfig.column_cache_share, default 0.5, below 0.8): more room "
                      "for decoded columns, under larger caps")
    pool.add_argument("--timeout", type=cli_types.seconds, metavar="S",
                      help="fail when processing takes longer than S seconds")
    pool.add_argument("--connect-timeout", type=cli_types.seconds, default=120.0, metavar="S",
                      help="wait at most S seconds for the workers (default 120)")
    out = parser.add_argument_group("output")
    out.add_argument("--out", type=Path, default=DEFAULT_OUT, metavar="DIR",
                     help=f"folder of the default --json and --png (default {DEFAULT_OUT})")
    out.add_argument("--json", type=Path, metavar="PATH",
                     help="the JSON record (default OUT/scaletest.json)")
    out.add_argument("--png", type=Path, metavar="PATH",
                     help="the timeline (default OUT/timeline.png)")
    out.add_argument("--bin", type=cli_types.seconds, metavar="S", help="timeline bin width")
    out.add_argument("--progress", action="store_true", help="datavine's progress bar")
    from datavine.dashboard.launch import add_options as add_dashboard_options

    add_dashboard_options(out)


def add_command(subparsers: argparse._SubParsersAction) -> argparse.ArgumentParser:
    """Add ``scale-test`` to a CLI's sub-commands; returns its parser."""
    parser = subparsers.add_parser(
        "scale-test", help="the AGC-style analysis on a pool, measured like the 200 Gbps "
        "challenge (Gbps, kHz per core, files, memory, timeline)",
        description="Run the AGC-style analysis over generated NanoAOD-like files (or a "
        "fileset) on a pool and report data rate, event rate, files processed and failed, "
        "peak memory per worker, with a JSON record and a timeline PNG.")
    add_options(parser)
    parser.set_defaults(func=cmd_scale_test)
    return parser


def config_from_args(args: argparse.Namespace) -> ScaleTestConfig:
    size = QUICK if args.quick else LONG
    return ScaleTestConfig(
        files=args.files or size.files,
        events_per_file=args.events_per_file or size.events_per_file,
        passes=args.passes or size.passes,
        chunk_events=args.chunk_events, compression=args.compression, seed=args.seed,
        data_dir=args.data, fileset=args.fileset, workers=args.workers, cores=args.cores,
        memory_mb=args.memory, pool=args.pool, port=args.port, password_file=args.password,
        manager_host=args.manager_host, xcache_shards=args.xcache, facility=args.facility,
        timeout_s=args.timeout,
        connect_timeout_s=args.connect_timeout, bin_s=args.bin, progress=args.progress,
        memory_caps=not args.no_memory_caps, column_cache=not args.no_column_cache,
        column_cache_share=args.column_cache_share,
        dashboard=option_from_args(args), metrics=metrics_from_args(args),
        dashboard_html=None if args.no_dashboard else json_path(args).with_suffix(".html"))


def json_path(args: argparse.Namespace) -> Path:
    return args.json or args.out / "scaletest.json"


def cmd_scale_test(args: argparse.Namespace) -> int:
    """Run the scale test, print the report, write the JSON record and the timeline."""
    from datavine.apps.scaletest.plot import plot_timeline

    config = config_from_args(args)
    source = str(config.fileset) if config.fileset else (
        f"{config.files} generated files x {config.events_per_file:,} events "
        f"({config.compression}) in {config.data_dir}") + (
        f", read {config.passes} times" if config.passes > 1 else "")
    print(f"scale test: {source}, chunks of {config.chunk_events:,} events, pool "
          f"{config.pool} ({config.n_workers} workers x {config.cores} cores)"
          + (f", through {config.xcache_shards} XCache shard(s)" if config.xcache_shards else ""))
    report = run_scale_test(config)
    for line in report.lines():
        print(line)
    record = report.write_json(json_path(args))
    png_path = plot_timeline(report, args.png or args.out / "timeline.png")
    view = f"; view: {report.dashboard_html}" if report.dashboard_html else ""
    print(f"record: {record}; timeline: {png_path}{view}")
    print(report.figures_line())
    return 0


def main(argv: Sequence[str] | None = None) -> int:
    """``python -m datavine.apps.scaletest [options]``; returns the exit code."""
    parser = argparse.ArgumentParser(prog="python -m datavine.apps.scaletest",
                                     description="datavine's scale test (see datavine "
                                     "scale-test --help).")
    add_options(parser)
    parser.add_argument("--verbose", action="store_true", help="tracebacks on errors")
    try:
        args = parser.parse_args(argv)
    except SystemExit as exc:
        return exc.code if isinstance(exc.code, int) else EXIT_ERROR
    try:
        with terminate_gracefully():  # SIGTERM/SIGHUP clean up as Ctrl-C does
            return cmd_scale_test(args)
    except (DatavineError, ConfigError, OSError) as exc:
        if args.verbose:
            traceback.print_exc()
        print(f"scale-test: {exc}", file=sys.stderr)
        return EXIT_ERROR
    except Terminated as exc:
        handled()
        print(f"scale-test: {exc}; stopped what it had started", file=sys.stderr)
        return exc.exit_code
    except KeyboardInterrupt:
        print("scale-test: interrupted", file=sys.stderr)
        return 130
