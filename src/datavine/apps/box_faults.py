"""Faults across the network, injected into real runs on the box (:mod:`datavine.deploy.box`).

Each fault gets a fresh box (2 racks of ``hosts_per_rack`` hosts, a shard per rack, a
``vine_worker`` started by hand on every rack host) and runs ``datavine run --facility`` on
the manager host; ``FAULT_AT_S`` into the run the fault strikes:

- a rack cut from the manager (blackhole both ways): its workers go silent, are declared
  lost within ``worker_timeout_s`` and their bundles run in the other rack;
- a shard's host unreachable (blackhole: connections time out, they are not refused):
  reads fail over to the next shard or the origin;
- the inter-rack link slowed 10x (tc): the run goes on, slower where it reads far.

Recovered: the run exits 0 with every event counted. Every result says whether the fault
was injected at all (a run that ended before the fault struck proves nothing).
"""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable
from pathlib import Path

from datavine.apps.faults import FaultResult
from datavine.deploy.box.facility import bring_up, start_workers, take_down
from datavine.deploy.box.net import Box, existing_namespaces
from datavine.deploy.box.plan import BoxSpec

FAULT_AT_S = 0.5  # into the analysis (8 x 100k events on 2 workers: ~2-3 s)
RUN_BOUND_S = 240.0


def rack_cut_from_manager(box: Box) -> str:
    box.cut_rack_from_manager("A")
    return "rack A cut from the manager host (blackhole)"


def shard_host_unreachable(box: Box) -> str:
    host = box.plan.shard_hosts()[0]
    box.cut_host(host.name)
    return f"{host.fqdn} (shard xcache-{host.rack}) unreachable (blackhole)"


def link_slowed(box: Box) -> str:
    before = box.link_mbit
    box.shape(before / 10)
    return f"inter-rack link {before:g} -> {before / 10:g} Mbit/s"


BASELINE = "box: no fault"
FAULTS: dict[str, Callable[[Box], str] | None] = {
    BASELINE: None,  # what the box's run takes without a fault: the others' baseline
    "box: rack cut from the manager": rack_cut_from_manager,
    "box: shard host unreachable": shard_host_unreachable,
    "box: inter-rack link 10x slower": link_slowed,
}


def run_with_fault(name: str, inject: Callable[[Box], str] | None, data: Path, *,
                   files: int, events: int, hosts_per_rack: int = 1,
                   link_mbit: float = 200.0) -> FaultResult:
    """A fresh box, its workers, ``datavine run`` on the manager host, ``inject`` into it."""
    folder = Path(tempfile.mkdtemp(prefix="datavine-box-fault-"))
    folder.chmod(0o755)
    box = bring_up(BoxSpec(name="fault", racks=2, hosts_per_rack=hosts_per_rack,
                           link_mbit=link_mbit), folder, data=data)
    injected: list[str] = []
    errors: list[str] = []
    record = box.dir / "run.json"
    try:
        start_workers(box)
        argv = [str(Path(sys.executable).parent / "datavine"), "run", "--facility",
                str(box.dir / "facility.toml"), "--data", str(data), "--files", str(files),
                "--events", str(events), "--no-progress", "--json", str(record),
                "--pool-workers", str(2 * hosts_per_rack), "--pool-timeout", "60",
                "--timeout", str(RUN_BOUND_S)]
        proc = subprocess.Popen(box.exec_argv("mgr", argv), stdout=subprocess.PIPE,
                                stderr=subprocess.STDOUT, text=True, start_new_session=True)

        def strike() -> None:
            if proc.poll() is None and inject is not None:
                try:
                    injected.append(inject(box))
                except Exception as exc:  # reported, not raised in a timer thread
                    errors.append(f"{type(exc).__name__}: {exc}")

        # the fault strikes FAULT_AT_S into the analysis: after the command says its
        # cluster is up (its workers connected), not while they are still connecting
        timer = threading.Timer(FAULT_AT_S, strike)
        timer.daemon = True
        lines: list[str] = []
        started: list[float] = []

        def read() -> None:
            assert proc.stdout is not None
            for line in proc.stdout:
                lines.append(line)
                if line.startswith("cluster:") and not started:
                    started.append(time.monotonic())
                    timer.start()

        reader = threading.Thread(target=read, daemon=True)
        reader.start()
        try:
            proc.wait(timeout=RUN_BOUND_S + 60)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
            lines.append(f"(killed after {RUN_BOUND_S + 60:.0f} s)")
        reader.join(timeout=10)
        timer.cancel()
        seconds = time.monotonic() - (started[0] if started else time.monotonic())
        out = "".join(lines)
        expected = files * events
        got = json.loads(record.read_text())["events"] if record.exists() else None
        ok = proc.returncode == 0 and got == expected
        outcome = (f"{got:,} of {expected:,} events" if got is not None else
                   f"exit {proc.returncode}: {out.strip().splitlines()[-1:] or ['']}")
        if record.exists():
            summary = json.loads(record.read_text()).get("summary") or {}
            outcome += (f"; {summary.get('retries', 0)} retries, "
                        f"{len(summary.get('lost_workers') or [])} workers lost, "
                        f"{(summary.get('reads') or {}).get('failovers', 0)} failovers")
            notes = summary.get("notes") or []
            if notes:
                outcome += "; notes: " + " | ".join(str(n) for n in notes)[:300]
        if inject is not None:
            if errors:
                ok, outcome = False, f"fault not injected: {errors[0]}; {outcome}"
            elif not injected:
                ok, outcome = False, f"fault not injected (the run ended first); {outcome}"
            else:
                outcome = f"{injected[0]}: {outcome}"
    finally:
        take_down(box)
        shutil.rmtree(folder, ignore_errors=True)
    left = len(set(box.plan.namespaces) & existing_namespaces())  # namespaces left count
    return FaultResult(name, ok, seconds, outcome, processes_left=left,
                       files_left=int(folder.exists()),
                       injected=bool(injected) if inject is not None else None)
