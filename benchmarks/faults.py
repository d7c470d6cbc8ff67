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
outcome) and one line ``faults=N injected=N recovered=N leftovers=N max_recover_s=S``:
a fault whose target was not there (or that was due after the run ended) is "not injected"
and never counts as recovered; ``max_recover_s`` is the largest time a fault added to the
run (for a signalled client: its time to exit).

Then exactly once under faults (:mod:`datavine.apps.event_faults`): the AGC analysis and a
coffea ``Runner`` (coffea's NanoAOD samples) each with the worker keeping the first value
delivered SIGKILLed, and SIGSTOPped (declared lost after 15 s), on 2 local workers, against
the same run without a fault. Prints for each whether the events equal the dataset's
entries, the histograms (cutflow, sums) equal the fault-free run's, what the progress and
the run summary counted, and last ``exactly_once=N injected=N events_equal=N
histograms_equal=N counted_once=N``.
Goal: every fault recovered or reported correctly, 0 leftovers, max_recover_s <= 30; every
event exactly once.
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

# python puts this script's folder first on sys.path, where benchmarks/coffea.py would
# shadow the coffea package (the exactly-once coffea runs import it): take it out.
HERE = Path(__file__).resolve().parent
sys.path[:] = [p for p in sys.path if Path(p or ".").resolve() != HERE]

from datavine.apps import box_faults, event_faults, faults  # noqa: E402
from datavine.apps.event_faults import EventCheck  # noqa: E402
from datavine.apps.faults import FaultResult  # noqa: E402
from datavine.errors import RunTimeoutError, TaskTimeLimitError  # noqa: E402

ROOT = HERE.parent
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


def event_scenarios(data: Path) -> dict[str, Callable[[], EventCheck]]:
    """Exactly once under faults: each run with each fault (the coffea runs are skipped,
    saying why, without coffea)."""
    out: dict[str, Callable[[], EventCheck]] = {}
    for app in event_faults.APPS:
        for fault in event_faults.FAULTS:
            name = f"exactly once: {app}, worker {fault}"
            out[name] = lambda app=app, fault=fault: event_check(app, fault, data)
    return out


def event_check(app: str, fault: str, data: Path) -> EventCheck:
    if app == "agc":
        return event_faults.check(event_faults.agc_workload(data), fault)
    try:
        workload = event_faults.coffea_workload()
    except ImportError as exc:
        return EventCheck(app, fault, 0, error=f"NOT RUN: {exc}")
    return event_faults.check(workload, fault)


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
    parser.add_argument("--json", type=Path, help="write the results as JSON: {\"faults\": [...], "
                        "\"exactly_once\": [...]}")
    parser.add_argument("--data", type=Path, default=ROOT / "runs" / "faults-data",
                        help="generated data for the datavine run clients (reused)")
    parser.add_argument("--event-data", type=Path, default=event_faults.default_data(),
                        help="generated data for the exactly-once AGC runs (reused)")
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
        checks = []
        for name, scenario in event_scenarios(args.event_data).items():
            if args.only and not any(word in name for word in args.only):
                continue
            check = scenario()
            checks.append(check)
            print(f"  {name}: {describe(check)}", flush=True)
    finally:
        shutil.rmtree(scratch, ignore_errors=True)
    print_table(results, baseline.seconds)
    faulted = [r for r in results[1:] if r.fault != box_faults.BASELINE]
    added = [added_s(r, baseline.seconds) for r in faulted]
    print(f"faults={len(faulted)} injected={sum(r.injected is not False for r in faulted)} "
          f"recovered={sum(r.recovered for r in faulted)} "
          f"leftovers={sum(r.leftovers for r in results)} "
          f"max_recover_s={max(added, default=0.0):.1f} baseline_s={baseline.seconds:.1f}")
    if checks:
        print(f"\n{event_faults.TABLE_HEAD}")
        for check in checks:
            print(check.line())
        print()
        print(f"exactly_once={len(checks)} injected={sum(c.injected for c in checks)} "
              f"events_equal={sum(c.events == c.dataset_events for c in checks)} "
              f"histograms_equal={sum(c.same_as_fault_free for c in checks)} "
              f"counted_once={sum(counted_once(c) for c in checks)} "
              f"ok={sum(c.ok for c in checks)}")
    if args.json:
        args.json.write_text(json.dumps({"faults": [asdict(r) for r in results],
                                         "exactly_once": [asdict(c) for c in checks]},
                                        indent=1))
    return 0 if all(r.recovered for r in results) and all(c.ok for c in checks) else 1


def counted_once(check: EventCheck) -> bool:
    """The progress (coffea) and the run summary counted each event and task once."""
    return (check.counted_events in (None, check.dataset_events)
            and check.tasks_counted == check.graph_tasks)


def describe(check: EventCheck) -> str:
    """One exactly-once check in words."""
    if check.error:
        return f"NOT ok: {check.error}"
    progress = ("" if check.counted_events is None else
                f"; progress {check.counted_events:,} events")
    return (f"events {check.events:,} {'=' if check.events == check.dataset_events else '!='} "
            f"dataset {check.dataset_events:,}; histograms "
            f"{'=' if check.same_as_fault_free else '!='} fault-free{progress}; tasks counted "
            f"{check.tasks_counted} of {check.graph_tasks} ({check.deliveries} deliveries, "
            f"{check.remade} made again); {check.seconds:.1f} s (fault-free "
            f"{check.fault_free_s:.1f} s); {'ok' if check.ok else 'NOT ok'}")


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
