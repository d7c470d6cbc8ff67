"""Benchmark: stragglers on the box (issue 29): a slow worker, a slow shard, speculation on/off.

The box (:mod:`datavine.deploy.box`): 2 racks x 2 hosts, one 1-core ``vine_worker`` per rack
host (4 workers: a1, a2, b1, b2), an XCache shard on a1 and on b1, the origin on the manager
host, racks joined by a 200 Mbit/s spine. ``--files`` generated NanoAOD-like ZSTD files of
``--events`` events, one chunk per file, read through the shards. Every run gets a fresh box
(cold caches, new workers) and runs the analysis on the manager host (this script again, as
``--drive``: a :class:`datavine.Cluster` from the box's facility file that waits for the 4
workers, then the timed ``dask.compute``). Scenarios:

- ``unslowed``: the box as it is (the baseline of both others);
- ``slow-worker``: a2's worker (the ``vine_worker``, its library and the library's child)
  held to ``--worker-quota`` of a core (cgroup v1 CPU quota,
  :class:`datavine.deploy.box.slowdown.CpuQuota`), from before it connects;
- ``slow-shard``: a1's cable (shard xcache-A, and a1's worker) shaped with ``tc tbf``, both
  ways, to 1/10 of the shard's unshaped read rate, measured first on a box of its own
  (``xrdcp`` of files homed on xcache-A from a2, warm cache).

Each runs with ``RunConfig(speculation=True)`` and ``False`` (with ``read_around_slow_shards``
alike: off is no backup copy and no slow shard read around), alternating which goes first,
``--rounds`` times; every result is checked equal to the plain loop's over the local files.
Where RunConfig has no ``speculation`` field yet, only the default scheduler runs
(``speculation=unsupported``).

Ratios (medians; the unslowed time is the faster mode's median, the same for both modes,
so that speculation's own cost is not taken out of its ratios: it is shown as
``unslowed_on_over_off``): ``slow_worker_ratio_*`` = slow-worker run / the ideal for the
capacity left, the unslowed run x ``min(4, cores) / min(3.25, cores)`` (4 worker cores
against 3.25; on a machine with fewer cores than workers the quarter core lost is not
missed: the ideal is the unslowed run itself); ``slow_worker_literal_*`` = slow-worker run /
(the plain loop's single-core time / 3.25), the issue's ideal, which leaves out the box's
own costs (3 xrootd, the manager, reads over the network) and is unattainable with fewer
than 4 cores; ``slow_shard_ratio_*`` = slow-shard run / unslowed run. Goals: slow worker
<= 1.15, slow shard <= 1.2, with speculation on. Each run's logs (manager, workers, the
driver's output and the run summary) are kept under ``--keep``.

    .venv/bin/python benchmarks/stragglers.py [--files 24 --events 100000 --rounds 3]

Needs root (namespaces, cgroups, tc) and XRootD (scripts/setup.sh --xcache).
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import json
import os
import pickle
import shutil
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from datavine.config import RunConfig

MODES = ("on", "off")
SCENARIOS = ("unslowed", "slow-worker", "slow-shard")
SLOW_WORKER_HOST = "a2"  # not a shard's host: its slowness is CPU only
SLOW_SHARD_HOST = "a1"  # xcache-A
WORKERS = 4


def speculation_supported() -> bool:
    return "speculation" in {f.name for f in dataclasses.fields(RunConfig)}


# --- on the manager host ----------------------------------------------------------------------
def drive(plan_path: Path) -> int:
    """The timed analysis on the box's workers; prints one JSON line."""
    import common  # this script's folder is on sys.path when it runs
    import dask

    import datavine
    from datavine.apps.analysis.sources import XCacheShards, analysis_graph

    plan = json.loads(plan_path.read_text())
    facility, shards, chunks = common.box_chunks(plan)
    run = facility.run.replace(shardmap=shards, progress=False)
    if plan["speculation"] is not None:  # a field RunConfig.replace does not know yet
        # off: no backup copies and no slow shard read around (the "speculation off")
        fields = {f.name for f in dataclasses.fields(RunConfig)}
        extra: dict[str, Any] = {name: plan["speculation"] for name in
                                 ("speculation", "read_around_slow_shards") if name in fields}
        run = dataclasses.replace(run, **extra)
    with datavine.Cluster(facility.manager, run, min_workers=plan["workers"],
                          connect_timeout_s=90) as cluster:
        graph = analysis_graph(XCacheShards(shards), chunks)
        t0 = time.monotonic()
        (result,) = dask.compute(graph, scheduler=cluster.get)
        seconds = time.monotonic() - t0
        summary = cluster.last_summary
    reference = pickle.loads(Path(plan["reference"]).read_bytes())
    if summary is not None:  # kept with the run's logs (--keep)
        from datavine.apps.cli import summary_dict

        print("\n".join(summary.lines()), file=sys.stderr)
        Path(plan["summary"]).write_text(json.dumps(summary_dict(summary), default=str))
    first: dict[str, float] = {}  # each worker's first result: a start that stalled shows
    for at, _, worker in (summary.completions if summary is not None else []):
        first.setdefault(worker, at)
    backups: Any = getattr(summary, "backups", None) or {}
    if dataclasses.is_dataclass(backups) and not isinstance(backups, type):
        backups = dataclasses.asdict(backups)
    print(json.dumps({
        "seconds": seconds, "events": result.result.events,
        "correct": not differences(result.result, reference),
        "differences": differences(result.result, reference),
        "backups": {str(k): int(v) for k, v in dict(backups).items()
                    if isinstance(v, (int, float))},
        "hosts": dict(summary.hosts) if summary is not None else {},
        "servers": dict(result.servers), "failovers": result.failovers,
        "retries": summary.retries if summary is not None else None,
        "first_result_s": max(first.values()) if first else None,
        "slow_shards": list(getattr(getattr(summary, "reads", None), "slow_shards", [])),
    }))
    return 0


def differences(got: Any, want: Any) -> list[str]:
    """What differs between two analysis results (ChunkResult): the histogram, the event
    counts, the chunks merged. ``bytes_read`` is left out: it counts I/O, which a worker's
    column cache saves (a retried or copied chunk finds its columns in memory)."""
    out = [name for name in ("events", "events_selected", "chunks")
           if getattr(got, name) != getattr(want, name)]
    import numpy as np

    out += [name for name in ("counts", "edges")
            if not np.array_equal(getattr(got, name), getattr(want, name))]
    return out


# --- on this machine --------------------------------------------------------------------------
@dataclasses.dataclass
class Run:
    scenario: str
    mode: str  # on, off, or default (speculation unsupported)
    seconds: float | None = None
    correct: bool = False
    backups: dict[str, int] = dataclasses.field(default_factory=dict)
    hosts: dict[str, int] = dataclasses.field(default_factory=dict)
    throttled: int | None = None  # slow-worker: periods the quota held the worker back
    first_result_s: float | None = None  # the last worker's first result (a stalled start)
    slow_shards: list[str] = dataclasses.field(default_factory=list)  # the summary's judgements
    differences: list[str] = dataclasses.field(default_factory=list)  # from the plain loop's
    load: float = 0.0
    error: str = ""


def spec() -> Any:
    from datavine.deploy.box.plan import BoxSpec

    return BoxSpec(name="strag", racks=2, hosts_per_rack=2, link_mbit=200.0)


def shard_read_mbytes(data: Path, files: list[Path], workdir: Path) -> float:
    """The unshaped shard's read rate (MB/s) as a client on another host of its rack sees it:
    ``xrdcp`` of files homed on xcache-A, read once to fill the cache, then again."""
    from datavine.apps.analysis.sources import origin_url
    from datavine.deploy.box.facility import bring_up, take_down
    from datavine.deploy.box.services import shard_map

    box = bring_up(spec(), workdir / "box-probe", data=data)
    try:
        shards = shard_map(box)
        assert shards.origin is not None
        urls = [origin_url(f, data, shards.origin.url) for f in files]
        home = [u for u in urls if shards.shard_for(u).name == "xcache-A"][:3]
        xa = next(s for s in shards.shards if s.name == "xcache-A")
        rates = []
        for attempt in range(3):
            for url in home:
                t0 = time.monotonic()
                box.run(SLOW_WORKER_HOST, ["xrdcp", "-s", "-f", shards.rewrite(url, xa),
                                           "/dev/null"], timeout_s=120)
                seconds = time.monotonic() - t0
                if attempt:  # the first pass filled the cache
                    rates.append(Path(files[urls.index(url)]).stat().st_size / seconds / 1e6)
        return max(rates)
    finally:
        take_down(box)


def run_once(args: argparse.Namespace, scenario: str, mode: str, data: Path,
             files: list[Path], reference: Path, shard_mbit: float, workdir: Path) -> Run:
    """A fresh box, its workers, the scenario's slowdown, the analysis on the manager host."""
    from datavine.deploy.box.facility import WORKERS as WORKER_SERVICE
    from datavine.deploy.box.facility import bring_up, start_workers, take_down
    from datavine.deploy.box.slowdown import CpuQuota, service_pids, slow_host_link

    run = Run(scenario, mode, load=os.getloadavg()[0])
    folder = workdir / f"box-{scenario}-{mode}"
    shutil.rmtree(folder, ignore_errors=True)
    box = bring_up(spec(), folder, data=data)
    try:
        start_workers(box)
        plan = {"facility": str(box.dir / "facility.toml"), "files": [str(f) for f in files],
                "chunk_events": args.events, "workers": WORKERS, "reference": str(reference),
                "speculation": {"on": True, "off": False}.get(mode),
                "summary": str(box.dir / "summary.json")}
        (box.dir / "plan.json").write_text(json.dumps(plan))
        with contextlib.ExitStack() as stack:
            quota = None
            if scenario == "slow-worker":
                quota = stack.enter_context(CpuQuota(f"dvstrag{os.getpid()}",
                                                     args.worker_quota))
                quota.follow(service_pids(box, SLOW_WORKER_HOST, WORKER_SERVICE))
            elif scenario == "slow-shard":
                stack.enter_context(slow_host_link(box, SLOW_SHARD_HOST, shard_mbit))
            done = box.run("mgr", [sys.executable, str(Path(__file__).resolve()), "--drive",
                                   str(box.dir / "plan.json")],
                           timeout_s=args.timeout, check=False)
            if quota is not None:
                run.throttled = quota.stat().get("nr_throttled")
        keep = args.keep / f"{len(list(args.keep.iterdir())) + 1:02d}-{scenario}-{mode}"
        keep.mkdir(parents=True)
        (keep / "drive.log").write_text(done.stdout + done.stderr)
        for part in ("manager", "logs", "summary.json"):  # a few hundred KB
            with contextlib.suppress(OSError):
                if (box.dir / part).is_dir():
                    shutil.copytree(box.dir / part, keep / part)
                else:
                    shutil.copy(box.dir / part, keep / part)
        for log in (box.dir / "xcache").glob("*/*/xrootd.log"):  # not the caches
            with contextlib.suppress(OSError):
                shutil.copy(log, keep / f"{log.parent.name}-{log.name}")
        if done.returncode != 0:
            tail = (done.stderr or done.stdout).strip().splitlines()[-3:]
            run.error = f"exit {done.returncode}: {' | '.join(tail)} (logs: {keep})"
            return run
        record = json.loads(done.stdout.strip().splitlines()[-1])
        run.seconds, run.correct = record["seconds"], record["correct"]
        run.backups, run.hosts = record["backups"], record["hosts"]
        run.first_result_s = record.get("first_result_s")
        run.slow_shards = record.get("slow_shards") or []
        run.differences = record.get("differences") or []
    finally:
        take_down(box)
    return run


def median(runs: list[Run], scenario: str, mode: str) -> float | None:
    values = [r.seconds for r in runs if r.scenario == scenario and r.mode == mode
              and r.seconds is not None and not r.error]
    return statistics.median(values) if values else None


def div(a: float | None, b: float | None) -> float | None:
    return a / b if a is not None and b else None


def fmt(x: float | None, spec_: str = ".3f") -> str:
    return "n/a" if x is None else format(x, spec_)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--drive", type=Path, help=argparse.SUPPRESS)  # on the manager host
    parser.add_argument("--files", type=int, default=24)
    parser.add_argument("--events", type=int, default=100_000)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--worker-quota", type=float, default=0.25,
                        help="the slow worker's share of a core (default 0.25)")
    parser.add_argument("--shard-slowdown", type=float, default=10.0,
                        help="the slow shard's link at its read rate / this (default 10)")
    parser.add_argument("--shard-mbit", type=float, default=None,
                        help="the slow shard's link in Mbit/s, instead of measuring its rate")
    parser.add_argument("--scenarios", default=",".join(SCENARIOS))
    parser.add_argument("--timeout", type=float, default=300.0)
    parser.add_argument("--data-dir", type=Path, default=None)
    parser.add_argument("--keep", type=Path, default=None,
                        help="where each run's logs and summary are kept (default: a new "
                        "folder under runs/benchmarks)")
    args = parser.parse_args()
    if args.drive is not None:
        return drive(args.drive)

    import common  # this script's folder is on sys.path when it runs

    from datavine.deploy.box.net import box_missing
    from datavine.deploy.box.slowdown import cpu_quota_missing

    why = box_missing() or cpu_quota_missing()
    if why:
        print(f"stragglers: cannot run here: {why}", file=sys.stderr)
        return 2
    print(common.machine_info())
    if args.keep is None:
        args.keep = common.run_dir("stragglers")
    args.keep.mkdir(parents=True, exist_ok=True)
    print(f"each run's logs and summary: {args.keep}")
    supported = speculation_supported()
    modes = MODES if supported else ("default",)
    scenarios = [s for s in args.scenarios.split(",") if s]
    if "unslowed" not in scenarios:
        scenarios.insert(0, "unslowed")  # the others' baseline
    data = args.data_dir or (common.RUNS.parent / "stragglers-data")
    files = common.readable_dataset(data, args.files, args.events)
    size = sum(f.stat().st_size for f in files)
    print(f"data: {args.files} files x {args.events:,} events (zstd), {size / 1e6:.0f} MB; box: "
          f"2 racks x 2 hosts, {WORKERS} 1-core workers; speculation "
          f"{'supported' if supported else 'unsupported'}", flush=True)
    workdir = Path(tempfile.mkdtemp(prefix="datavine-stragglers-"))
    workdir.chmod(0o755)
    try:
        single_core_s, reference = plain_loop(files, args.events, workdir)
        shard_mbit = 0.0
        if "slow-shard" in scenarios and args.shard_mbit:
            shard_mbit = args.shard_mbit
            print(f"slow shard: {SLOW_SHARD_HOST}'s cable at {shard_mbit:g} Mbit/s both ways "
                  "(--shard-mbit)")
        elif "slow-shard" in scenarios:
            rate = shard_read_mbytes(data, files, workdir)
            shard_mbit = rate * 8 / args.shard_slowdown
            print(f"shard xcache-A unshaped: {rate:.0f} MB/s warm (xrdcp from "
                  f"{SLOW_WORKER_HOST}); slow shard: {SLOW_SHARD_HOST}'s cable at "
                  f"{shard_mbit:.0f} Mbit/s both ways [load {os.getloadavg()[0]:.2f}]",
                  flush=True)
        runs = run_rounds(args, modes, scenarios, data, files, reference, shard_mbit, workdir)
    finally:
        shutil.rmtree(workdir, ignore_errors=True)
    return summarise(runs, modes, scenarios, single_core_s, supported)


def plain_loop(files: list[Path], events: int, workdir: Path) -> tuple[float, Path]:
    """The plain loop over the local files: its seconds on one core (the best of 3: the
    work, on a shared machine) and its result, pickled for the runs to compare with."""
    from datavine.apps.analysis.agc import make_chunks, run_plain_loop

    chunks = make_chunks(files, events)
    times = []
    for _ in range(3):
        t0 = time.monotonic()
        plain = run_plain_loop(chunks)
        times.append(time.monotonic() - t0)
    reference = workdir / "reference.pkl"
    reference.write_bytes(pickle.dumps(plain))
    print(f"plain loop (one core, local files): {min(times):.2f} s (best of 3), "
          f"{plain.events:,} events [load {os.getloadavg()[0]:.2f}]", flush=True)
    return min(times), reference


def run_rounds(args: argparse.Namespace, modes: tuple[str, ...], scenarios: list[str],
               data: Path, files: list[Path], reference: Path, shard_mbit: float,
               workdir: Path) -> list[Run]:
    """Every scenario with every mode, ``--rounds`` times, which mode first alternating."""
    runs: list[Run] = []
    for k in range(args.rounds):
        for scenario in scenarios:
            for mode in (modes if k % 2 == 0 else tuple(reversed(modes))):
                run = run_once(args, scenario, mode, data, files, reference, shard_mbit,
                               workdir)
                runs.append(run)
                wrong = f" ({', '.join(run.differences)} differ)" if run.differences else ""
                shown = (f"{run.seconds:6.2f} s correct={run.correct}{wrong} every worker's first "
                         f"result by {fmt(run.first_result_s, '.1f')} s backups "
                         f"{run.backups or '-'} bundles {run.hosts}" if not run.error
                         else f"FAILED {run.error}")
                if run.throttled is not None:
                    shown += f" throttled {run.throttled} periods"
                for said in run.slow_shards:
                    shown += f"\n    {said}"
                print(f"[{k + 1}/{args.rounds}] {scenario:11} speculation {mode:7} {shown}  "
                      f"[load {run.load:.2f}]", flush=True)
    return runs


def summarise(runs: list[Run], modes: tuple[str, ...], scenarios: list[str],
              single_core_s: float, supported: bool) -> int:
    """The table (medians) and the key=value line. Both modes' ratios are taken against the
    same unslowed time, the faster of the two modes' medians: what the box can do is no
    property of the mode, and speculation's own cost shows in ``unslowed_on_over_off``."""
    import common

    cores = len(os.sched_getaffinity(0))
    capacity = min(WORKERS, cores) / min(WORKERS - 1 + 0.25, cores)
    bases = [b for b in (median(runs, "unslowed", m) for m in modes) if b is not None]
    base = min(bases) if bases else None
    print(f"\nunslowed (the faster mode's median): {fmt(base, '.2f')} s; slow worker's ideal: "
          f"that x {capacity:.3f} (worker cores {WORKERS} -> {WORKERS - 0.75:g}, on {cores} "
          f"cores); the issue's: plain loop {single_core_s:.2f} s / 3.25 = "
          f"{single_core_s / 3.25:.2f} s")
    print("| scenario | speculation | seconds: median (runs) | ratio | backups started (queued"
          "+late) / won / cancelled | correct | load |")
    print("|---|---|---|---|---|---|---|")
    pairs: dict[str, Any] = {}
    for scenario in scenarios:
        for mode in modes:
            mine = [r for r in runs if r.scenario == scenario and r.mode == mode]
            m = median(runs, scenario, mode)
            ratio = (div(m, base * capacity if base else None) if scenario == "slow-worker"
                     else div(m, base))

            def total(key: str, mine: list[Run] = mine) -> int:
                return sum(r.backups.get(key, 0) for r in mine)

            each = ", ".join(fmt(r.seconds, ".2f") if not r.error else "failed" for r in mine)
            ok = all(r.correct for r in mine) and bool(mine)
            loads = ", ".join(f"{r.load:.1f}" for r in mine)
            print(f"| {scenario} | {mode} | {fmt(m, '.2f')} ({each}) | {fmt(ratio)} | "
                  f"{total('started')} ({total('queued')}+{total('late')}) / {total('won')} / "
                  f"{total('cancelled')} | {ok} | {loads} |")
            if scenario != "unslowed":
                pairs[f"{scenario.replace('-', '_')}_ratio_{mode}"] = fmt(ratio)
            if scenario == "slow-worker":
                pairs[f"slow_worker_literal_{mode}"] = fmt(div(m, single_core_s / 3.25))
    pairs["unslowed_s"] = fmt(base, ".2f")
    if supported:
        pairs["unslowed_on_over_off"] = fmt(div(median(runs, "unslowed", "on"),
                                                median(runs, "unslowed", "off")))
        pairs["backups_started"] = sum(r.backups.get("started", 0) for r in runs)
        pairs["backups_won"] = sum(r.backups.get("won", 0) for r in runs)
    else:
        pairs["speculation"] = "unsupported"
    pairs["single_core_s"] = fmt(single_core_s, ".2f")
    pairs["cores"] = cores
    pairs["all_correct"] = int(bool(runs) and all(r.correct and not r.error for r in runs))
    print(f"(load at the end: {' '.join(f'{x:.2f}' for x in os.getloadavg())})")
    print(common.kv_line(pairs))
    return 0 if pairs["all_correct"] else 1


if __name__ == "__main__":
    sys.exit(main())
