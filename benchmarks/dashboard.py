"""What the live view costs a run: the same run with the view open against without.

Three arms, interleaved, ``--repeats`` times each, every run on a fresh
``datavine.LocalCluster(workers=--workers)`` whose workers are connected before the clock:

- ``off``: ``dashboard=False`` (no events written, no server);
- ``served``: the view's server runs and the run writes its events, no page open;
- ``open``: as ``served``, with a headless Chromium page (Debian's, driven by Playwright in a
  process of its own) showing the view and reading its bundles-done count every second.

The run (``--workload``): ``tasks``, ``--tasks`` independent tasks that each spin for
``--task-ms`` then a sum, one task per bundle (``max_bundle_tasks=1``): the most bundles per
second, where the per-bundle records cost most; or ``scaletest``, the scale test's
processing graph over its ``--quick`` dataset (``--passes`` times). Throughput is units
(tasks or events) per second of the run; each arm's median counts. Beside it, what does
not depend on other load: the CPU seconds the view took (its server and the page's
processes) against those the run took (the manager and the workers), and the records' cost
in the manager alone (``sink_us_per_bundle``). The last line: ``dashboard_overhead`` =
1 - open / off (goal <= 0.02), with the other figures.

``--screenshot PNG`` instead runs ``datavine scale-test --quick`` (``--passes``, ``--xcache``)
with the view open and saves the page as it shows the run (benchmarks/figures/dashboard.png).

    .venv/bin/python benchmarks/dashboard.py [--repeats 3] [--workload tasks|scaletest]
    .venv/bin/python benchmarks/dashboard.py --screenshot benchmarks/figures/dashboard.png
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))
from common import RUNS, kv_line, machine_info

CHROMIUM = "/usr/bin/chromium"
ARGS = ["--no-sandbox", "--headless", "--disable-gpu", "--disable-background-networking",
        "--disable-component-update", "--disable-sync", "--no-first-run"]
ARMS = ("off", "served", "open")
SETTLE_S = 3.0


def spin(i: int, ms: float) -> int:
    import time

    end = time.perf_counter() + ms / 1000
    while time.perf_counter() < end:
        pass
    return i


def total(*values: int) -> int:
    return sum(values)


# --- the page (a process of its own: Manager.wait holds the run's GIL) -----------------------
def watch(url: str, limit_s: float) -> int:
    """Keep a page on ``url`` open, reading its count every second, until killed or
    ``limit_s``; prints how many reads saw the count change."""
    from playwright.sync_api import sync_playwright

    changes, last = 0, None
    with sync_playwright() as p:
        browser = p.chromium.launch(executable_path=CHROMIUM, args=ARGS)
        page = browser.new_page(viewport={"width": 1500, "height": 1300})
        page.goto(url, timeout=60_000)
        page.wait_for_function("() => window.Bokeh && Bokeh.documents.length > 0",
                               timeout=60_000)
        print("open", flush=True)
        deadline = time.monotonic() + limit_s
        while time.monotonic() < deadline:
            page.wait_for_timeout(1000)
            shown = page.locator('[data-figure="bundles-done"]')
            value = shown.first.inner_text() if shown.count() else None
            if value != last:
                changes, last = changes + 1, value
                print(f"changes {changes}", flush=True)
        browser.close()
    return 0


def open_page(url: str) -> subprocess.Popen[str]:
    proc = subprocess.Popen([sys.executable, __file__, "--watch", url], stdout=subprocess.PIPE,
                            text=True)
    assert proc.stdout is not None
    line = proc.stdout.readline()  # bounded by the page's own timeouts
    if line.strip() != "open":
        proc.kill()
        raise RuntimeError(f"the page did not open: {line!r}")
    time.sleep(SETTLE_S)  # its first render done: the run's clock sees the page as it stays
    return proc


# --- the runs --------------------------------------------------------------------------------
def tasks_run(args: argparse.Namespace) -> tuple[dict[Any, Any], Any, int]:
    dsk: dict[Any, Any] = {("spin", i): (spin, i, args.task_ms) for i in range(args.tasks)}
    dsk["total"] = (total, *list(dsk))
    return dsk, "total", args.tasks


@dataclass
class Measured:
    """One run: units per second, the manager's CPU per bundle, the CPU seconds the run
    took (manager and workers) and those the view took (its server and the page)."""

    rate: float
    manager_ms_per_bundle: float
    run_cpu_s: float
    view_cpu_s: float
    note: str


def tree_cpu(pid: int | None) -> float:
    """CPU seconds of ``pid`` and its descendants alive now."""
    import psutil

    if pid is None:
        return 0.0
    try:
        root = psutil.Process(pid)
        procs = [root, *root.children(recursive=True)]
    except psutil.Error:
        return 0.0
    total_s = 0.0
    for proc in procs:
        try:
            times = proc.cpu_times()
            total_s += times.user + times.system
        except psutil.Error:
            continue
    return total_s


def one_run(arm: str, args: argparse.Namespace, data: Any) -> Measured:
    """One run in ``arm`` on a fresh cluster."""
    import datavine

    options: dict[str, Any] = {"memory": None} if args.workload == "tasks" else {}
    if args.workload == "tasks":
        options["max_bundle_tasks"] = 1
    run = datavine.RunConfig(shardmap=data.get("shardmap"), **options)
    page = None
    with datavine.LocalCluster(workers=args.workers, run=run,
                               dashboard=arm != "off") as cluster:
        if arm != "off" and cluster.dashboard_url is None:
            raise RuntimeError(f"no dashboard: {cluster.dashboard_error}")
        if arm == "open":
            page = open_page(cluster.dashboard_url)
        workers = [p.pid for p in cluster.workers.procs] if cluster.workers else []
        server = cluster.dashboard.proc.pid if cluster.dashboard and cluster.dashboard.proc \
            else None
        viewers = [server, page.pid if page is not None else None]
        try:
            before = (sum(map(tree_cpu, workers)), sum(map(tree_cpu, viewers)))
            started, cpu = time.perf_counter(), time.process_time()
            if args.workload == "tasks":
                dsk, key, units = tasks_run(args)
                (value,) = cluster.get(dsk, [key])
                assert value == sum(range(args.tasks)), value
            else:
                from datavine.apps.scaletest.run import process_chunks

                tally = process_chunks(cluster, data["chunks"], data["config"])
                units = tally.result.events
                assert units == data["events"], (units, data["events"])
            seconds, cpu = time.perf_counter() - started, time.process_time() - cpu
            workers_s = sum(map(tree_cpu, workers)) - before[0]
            view_s = sum(map(tree_cpu, viewers)) - before[1]
            bundles = cluster.last_summary.bundles
        finally:
            note = ""
            if page is not None:
                page.kill()
                out = page.communicate(timeout=30)[0]
                changes = [ln for ln in out.splitlines() if ln.startswith("changes")]
                note = f"; the page saw the count change {len(changes)} times"
    return Measured(units / seconds, 1000 * cpu / bundles, cpu + workers_s, view_s,
                    f"{bundles} bundles, {seconds:.2f} s{note}")


def sink_cost_us(n: int = 20_000) -> float:
    """Microseconds the manager spends per bundle on its records (sent and back, a read
    each), written to a file: the part of the view's cost that runs in the run's process."""
    import tempfile

    from datavine.dashboard.events import EventSink
    from datavine.manager.port import Finished
    from datavine.scheduler.bundling import Bundle
    from datavine.scheduler.run_messages import Submit
    from datavine.scheduler.run_state import Inflight
    from datavine.scheduler.topology import Target

    spec = {"nodes": [(("chunk", 0), None)]}
    entry = Inflight(Bundle(1, [("chunk", 0)], set(), set(),
                            files=("root://a1.box:1094//store/f1.root",)),
                     Target(), "chunk", 512.0, None)  # type: ignore[arg-type]
    result = {"status": "ok", "worker": "a1-0", "host": "a1.box", "rack": "A", "wall_s": 0.5,
              "peak_mb": 180.0, "cap_mb": 512.0,
              "reads": [{"lfn": "/store/f1.root", "server": "xcache-0", "rack": "A",
                         "bytes": 9_100_000, "errors": ()}]}
    with tempfile.TemporaryDirectory() as tmp:
        sink = EventSink(Path(tmp) / "events.jsonl")
        started = time.perf_counter()
        for call in range(n):
            sink.sent(Submit(call, spec, 512.0, (), None, Target(), {}, {}), entry)
            sink.done(call, Finished(call, result, "198.18.11.11:9123"))
        seconds = time.perf_counter() - started
        sink.close()
    return 1e6 * seconds / n


def scaletest_data(args: argparse.Namespace) -> dict[str, Any]:
    """The scale test's quick dataset and its chunks (read once, before the arms)."""
    import datavine
    from datavine.apps.scaletest.cli import QUICK
    from datavine.apps.scaletest.run import (
        ScaleTestConfig,
        dataset_files,
        make_chunks,
        read_file_infos,
    )

    config = ScaleTestConfig(files=QUICK.files, events_per_file=QUICK.events_per_file,
                             passes=args.passes, data_dir=RUNS / "scaletest-data")
    files = dataset_files(config)
    with datavine.LocalCluster(workers=args.workers, dashboard=False) as cluster:
        infos = read_file_infos(cluster, files, config.tree)
    chunks = make_chunks(infos, config.chunk_events) * config.passes
    return {"config": config, "chunks": chunks, "events": sum(c[2] - c[1] for c in chunks)}


def overhead(args: argparse.Namespace) -> int:
    print(f"# {machine_info()}", flush=True)
    sink_us = sink_cost_us()
    print(f"the run's records: {sink_us:.1f} us per bundle in the manager's process", flush=True)
    data = scaletest_data(args) if args.workload == "scaletest" else {}
    runs: dict[str, list[Measured]] = {arm: [] for arm in ARMS}
    unit = "tasks" if args.workload == "tasks" else "events"
    print(f"| repeat | arm | {unit}/s | manager CPU ms/bundle | run CPU s | view CPU s | note |"
          "\n|---:|---|---:|---:|---:|---:|---|", flush=True)
    for repeat in range(args.repeats):
        order = ARMS if repeat % 2 == 0 else ARMS[::-1]  # no arm always first
        for arm in order:
            m = one_run(arm, args, data)
            runs[arm].append(m)
            print(f"| {repeat + 1} | {arm} | {m.rate:,.1f} | {m.manager_ms_per_bundle:.3f} | "
                  f"{m.run_cpu_s:.2f} | {m.view_cpu_s:.2f} | {m.note} |", flush=True)
    rates = {arm: [m.rate for m in v] for arm, v in runs.items()}
    median = {arm: statistics.median(v) for arm, v in rates.items()}
    cpu = {arm: statistics.median(m.manager_ms_per_bundle for m in v) for arm, v in runs.items()}
    share = {arm: statistics.median(m.view_cpu_s / m.run_cpu_s for m in v)
             for arm, v in runs.items()}
    # each repeat's three runs are neighbours in time: their ratio sees the same load
    paired = statistics.median(o / f for o, f in zip(rates["open"], rates["off"], strict=True))
    print("\nmedians: " + ", ".join(f"{a} {median[a]:,.1f} {unit}/s, {cpu[a]:.3f} ms CPU per "
                                    "bundle" for a in ARMS))
    pairs = {"workload": args.workload, "workers": args.workers, "repeats": args.repeats,
             **{f"{a}_{unit}_per_s": f"{median[a]:.1f}" for a in ARMS},
             **{f"{a}_cpu_ms_per_bundle": f"{cpu[a]:.3f}" for a in ARMS},
             "off_spread": f"{(max(rates['off']) - min(rates['off'])) / median['off']:.3f}",
             "sink_us_per_bundle": f"{sink_us:.1f}",
             "sink_share_of_manager_cpu": f"{sink_us / 1000 / cpu['off']:.4f}",
             "served_view_cpu_share": f"{share['served']:.4f}",
             "open_view_cpu_share": f"{share['open']:.4f}",
             "served_overhead": f"{1 - median['served'] / median['off']:.4f}",
             "paired_overhead": f"{1 - paired:.4f}",
             "dashboard_overhead": f"{1 - median['open'] / median['off']:.4f}"}
    print(kv_line(pairs))
    return 0


# --- the screenshot -------------------------------------------------------------------------
def screenshot(args: argparse.Namespace) -> int:
    """``datavine scale-test --quick`` with the view open; the page saved as a PNG."""
    from playwright.sync_api import sync_playwright

    out = RUNS / "dashboard-screenshot"
    cmd = [str(Path(sys.executable).parent / "datavine"), "scale-test", "--quick",
           "--passes", str(args.passes), "--out", str(out), "--workers", str(args.workers)]
    if args.xcache:
        cmd += ["--xcache", str(args.xcache)]
    print("# " + " ".join(cmd), flush=True)
    run = subprocess.Popen(cmd, stdout=subprocess.PIPE, text=True)
    assert run.stdout is not None
    url = None
    for line in run.stdout:  # ends when the command does
        print(line, end="", flush=True)
        if "dashboard: http" in line:
            url = line.split("dashboard: ", 1)[1].split()[0]
            break
    if url is None:
        run.wait(timeout=600)
        raise SystemExit("the scale test printed no dashboard address")
    with sync_playwright() as p:
        browser = p.chromium.launch(executable_path=CHROMIUM, args=ARGS)
        page = browser.new_page(viewport={"width": 1500, "height": 1250})
        page.goto(url, timeout=60_000)
        # the processing run (the second: the first reads the files' entry counts), shot
        # once it shows most of its tasks done (or finished), while it still runs
        page.wait_for_function(
            """() => {
                const m = Bokeh.documents.length &&
                    Bokeh.documents[0].get_model_by_name('progress');
                if (!m || !m.text.includes('data-figure="run">2<')) return false;
                const n = (name) => parseInt((m.text.match(
                    new RegExp('data-figure="' + name + '">([0-9,]+)<')) || [0, '0'])[1]
                    .replace(/,/g, ''));
                return n("tasks-done") >= 0.4 * n("tasks") || m.text.includes(" finished,");
            }""", timeout=600_000, polling=200)
        page.wait_for_timeout(300)  # the figures' redraw
        page.screenshot(path=str(args.screenshot), full_page=True)
        browser.close()
    for line in run.stdout:
        print(line, end="", flush=True)
    run.wait(timeout=600)
    print(f"screenshot: {args.screenshot}")
    print(json.dumps({"command": " ".join(cmd[1:]), "url": url}))
    return 0


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--workload", choices=("tasks", "scaletest"), default="tasks")
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument("--tasks", type=int, default=2000)
    parser.add_argument("--task-ms", type=float, default=2.0)
    parser.add_argument("--passes", type=int, default=16, help="scale test passes")
    parser.add_argument("--xcache", type=int, default=2, help="screenshot: XCache shards")
    parser.add_argument("--screenshot", type=Path, help="save the page of a scale test here")
    parser.add_argument("--watch", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.watch:
        return watch(args.watch, 600)
    if args.screenshot:
        return screenshot(args)
    return overhead(args)


if __name__ == "__main__":
    sys.exit(main())
