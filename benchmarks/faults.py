"""Every injected fault against real processes: recovered? how long? anything left behind?

    .venv/bin/python benchmarks/faults.py [--only NAME ...] [--json FILE]

Runs a fault-free baseline of the workload (30 tasks of 0.3 s on 3 local workers, see
:mod:`datavine.apps.faults`), then each fault on a fresh cluster: a worker SIGKILLed alone (its
transfer server keeps the manager's connection) and with its whole session, a frozen worker
(SIGSTOP), its library and its capped child SIGKILLed, an XCache shard stopped mid-run, a
runaway task under a time limit, a run that times out (is the cluster usable at once?), a
busy port, a missing and a corrupt input file, and a client (``datavine run`` on the loopback
XCache, a script holding a LocalCluster) sent SIGTERM, SIGHUP and SIGKILL, and a worker's
job removed from the personal HTCondor pool (``condor_rm``, as a preemption), and across the
network on a fresh box each (:mod:`datavine.apps.box_faults`: a rack cut from the manager
mid-run, a shard's host unreachable, the inter-rack link slowed 10x). Prints a table
(fault, injected, recovered, seconds, seconds over the baseline, processes and files left,
outcome) and last one line ``faults=N injected=N recovered=N leftovers=N max_recover_s=S``:
a fault whose target was not there (or that was due after the run ended) is "not injected"
and never counts as recovered; ``max_recover_s`` is the largest time a fault added to the
run (for a signalled client: its time to exit).
Goal: every fault recovered or reported correctly, 0 leftovers, max_recover_s <= 30.
"""

from __future__ import annotations

import argparse
import json
import shutil
import signal
import sys
import tempfile
from collections.abc import Callable
from dataclasses import asdict
from pathlib import Path
from typing import Any

from datavine.apps import box_faults, faults
from datavine.apps.faults import FaultResult
from datavine.errors import RunTimeoutError, TaskTimeLimitError

ROOT = Path(__file__).resolve().parents[1]
BOX_FILES, BOX_EVENTS = 8, 100_000  # the box faults' data: runs of a few seconds


def scenarios(data: Path, scratch: Path) -> dict[str, Callable[[], FaultResult]]:
    spin_graph = faults.nap_graph(6, faults.NAP_S, faults.spin)
    run_cmd = faults.datavine_run_command(data)
    return {
        "worker SIGKILL alone": lambda: faults.in_cluster(
            "worker SIGKILL alone", faults.kill_worker_alone),
        "worker SIGKILL with its session": lambda: faults.in_cluster(
            "worker SIGKILL with its session", faults.kill_worker_session),
        "worker SIGSTOP": lambda: faults.in_cluster("worker SIGSTOP", faults.freeze_worker),
        "library SIGKILL": lambda: faults.in_cluster("library SIGKILL", faults.kill_library),
        "capped child SIGKILL (OOM)": lambda: faults.in_cluster(
            "capped child SIGKILL (OOM)", faults.kill_capped_child),
        "XCache shard stopped": lambda: shard_scenario(scratch),
        "runaway task (2 s limit)": lambda: faults.in_cluster(
            "runaway task (2 s limit)", None, expect=TaskTimeLimitError, graph=spin_graph,
            time_limits={"fault-spin": 2.0}, after=faults.next_run_check),
        "run timeout, calls abandoned": lambda: faults.in_cluster(
            "run timeout, calls abandoned", None, expect=RunTimeoutError,
            graph=faults.nap_graph(6, 20.0), timeout_s=2, after=faults.next_run_check),
        "busy port": faults.busy_port,
        "missing file": lambda: faults.bad_file("missing", scratch),
        "corrupt file": lambda: faults.bad_file("corrupt", scratch),
        "datavine run SIGTERM": lambda: faults.client_signal(
            "datavine run SIGTERM", signal.SIGTERM, run_cmd, 6),
        "LocalCluster script SIGHUP": lambda: faults.client_signal(
            "LocalCluster script SIGHUP", signal.SIGHUP, faults.cluster_client_command(), 3),
        "Ctrl-C while a worker is frozen": lambda: faults.client_signal(
            "Ctrl-C while a worker is frozen", signal.SIGINT, faults.cluster_client_command(),
            3, before=faults.freeze_one_worker),
        "datavine run SIGKILL": lambda: faults.client_signal(
            "datavine run SIGKILL", signal.SIGKILL, run_cmd, 6),
        "HTCondor worker job removed": lambda: condor_scenario(scratch),
        **{name: (lambda name=name, inject=inject: box_scenario(name, inject, data))
           for name, inject in box_faults.FAULTS.items()},
    }


def box_scenario(name: str, inject: Callable[[Any], str] | None, data: Path) -> FaultResult:
    """On a fresh box (2 racks x 1 host): skipped, saying why, where none can be made."""
    from datavine.deploy.box.net import box_missing
    from datavine.io.datagen import generate_dataset

    why = box_missing()
    if why:
        return FaultResult(name, False, 0.0, f"NOT RUN: {why}", injected=False)
    files = generate_dataset(data, BOX_FILES, BOX_EVENTS, "zstd")
    for p in [data, *files]:
        p.chmod(0o755 if p.is_dir() else 0o644)
    return box_faults.run_with_fault(name, inject, data, files=BOX_FILES, events=BOX_EVENTS)


def condor_scenario(scratch: Path) -> FaultResult:
    """On the personal HTCondor pool (started for the scenario when it is not running)."""
    import secrets
    import subprocess

    from datavine.deploy.pools.condor import pool_missing, scripts_dir

    started = False
    if pool_missing():
        subprocess.run(["bash", str(scripts_dir() / "start_pool.sh")], check=True,
                       timeout=180, capture_output=True)
        started = True
    password = scratch / "condor.password"
    password.write_text(secrets.token_hex(32))
    password.chmod(0o600)
    try:
        return faults.condor_worker_removed(password)
    finally:
        if started:
            subprocess.run(["bash", str(scripts_dir() / "stop_pool.sh")], timeout=180,
                           capture_output=True)


def shard_scenario(scratch: Path) -> FaultResult:
    """A shard stopped mid-run, on a testbed of its own over the tests' small files."""
    from datavine.apps.testbed import SMALL_EVENTS, write_small_files
    from datavine.io.xcache.testbed import XCacheTestbed

    data = scratch / "xcache-data"
    lfns = write_small_files(data)
    with XCacheTestbed(data, n_shards=4, racks=["A", "A", "B", "B"]) as testbed:
        return faults.shard_stopped(testbed, lfns, SMALL_EVENTS * len(lfns))


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--only", nargs="*", help="run only faults whose name contains these")
    parser.add_argument("--json", type=Path, help="write the results as JSON")
    parser.add_argument("--data", type=Path, default=ROOT / "runs" / "faults-data",
                        help="generated data for the datavine run clients (reused)")
    args = parser.parse_args()
    scratch = Path(tempfile.mkdtemp(prefix="datavine-faults-bench-"))
    scratch.chmod(0o755)
    try:
        baseline = faults.in_cluster("baseline (no fault)", None)
        print(f"baseline: {baseline.seconds:.2f} s, {baseline.outcome}", flush=True)
        results = [baseline]
        for name, scenario in scenarios(args.data, scratch).items():
            if args.only and not any(word in name for word in args.only):
                continue
            result = scenario()
            results.append(result)
            if name == box_faults.BASELINE and result.recovered:
                BOX_BASELINE_S["s"] = result.seconds
            print(f"  {result.fault}: {'recovered' if result.recovered else 'NOT recovered'} "
                  f"in {result.seconds:.1f} s ({result.outcome})", flush=True)
    finally:
        shutil.rmtree(scratch, ignore_errors=True)
    print_table(results, baseline.seconds)
    faulted = [r for r in results[1:] if r.fault != box_faults.BASELINE]
    added = [added_s(r, baseline.seconds) for r in faulted]
    print(f"faults={len(faulted)} injected={sum(r.injected is not False for r in faulted)} "
          f"recovered={sum(r.recovered for r in faulted)} "
          f"leftovers={sum(r.leftovers for r in results)} "
          f"max_recover_s={max(added, default=0.0):.1f} baseline_s={baseline.seconds:.1f}")
    if args.json:
        args.json.write_text(json.dumps([asdict(r) for r in results], indent=1))
    return 0 if all(r.recovered for r in results) else 1


BOX_BASELINE_S: dict[str, float] = {}  # the box's own run without a fault, once measured


def added_s(result: FaultResult, baseline_s: float) -> float:
    """Seconds a fault added: over the baseline for a run (the box's own for a box fault),
    to exit for a client, the time to the error for a fault that must end the run."""
    if result.fault.startswith(("datavine run", "LocalCluster script", "busy port",
                                "missing", "corrupt")):
        return result.seconds
    if result.fault.startswith("box:"):
        baseline_s = BOX_BASELINE_S.get("s", baseline_s)
    return max(0.0, result.seconds - baseline_s)


def print_table(results: list[FaultResult], baseline_s: float) -> None:
    print("\n| fault | injected | recovered | s | s added | processes left | files left | "
          "outcome |\n|---|---|---|---|---|---|---|---|")
    for r in results:
        injected = {True: "yes", False: "NO", None: "-"}[r.injected]
        print(f"| {r.fault} | {injected} | {'yes' if r.recovered else 'NO'} | {r.seconds:.1f} | "
              f"{added_s(r, baseline_s):.1f} | {r.processes_left} | {r.files_left} | "
              f"{r.outcome} |")
    print()


if __name__ == "__main__":
    sys.exit(main())
