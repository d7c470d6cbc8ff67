"""Where the manager's time goes: py-spy (native frames) and TaskVine's own counters, per
number of workers.

For each count N (default 8, 64, 256): ``datavine.LocalCluster(workers=N, cores=1,
run=RunConfig(memory=None))``, libraries warm before the clock, and the graph of
``benchmarks/workers.py`` (``--waves`` x N tasks that sleep ``--sleep`` s, each naming a
``.root`` path so it is placed as a file-reading bundle, then one task collecting them).
During the ``get``, py-spy samples this process (``--native``: C frames of TaskVine's manager
as well as Python's) and only the thread that runs the manager's loop is kept. Each sample is
charged to the innermost frame that is TaskVine's C code (``vine_*.c``, ``link.c``, ...) or
datavine's Python code, so the table says which of TaskVine's functions and which of
datavine's take the manager's CPU; samples in ``poll``/``select`` with nothing to do are
counted apart as idle (py-spy sees a thread blocked in a system call as running).

TaskVine's own accounting (its performance log, one row a second: ``time_polling``,
``time_status_msgs``, ``time_send``, ``time_receive``, ``time_internal``,
``time_scheduling``, ``time_application``, cumulative microseconds) is read over the run,
per bundle.

    .venv/bin/python benchmarks/profile_manager.py [--counts 8 64 256] [--sleep 10]
        [--waves 3] [--rate 250] [--top 12] [--perf]

Needs py-spy (``.venv/bin/py-spy``, installed with the ``bench`` extra) and ptrace (root).

``--perf``: Linux ``perf record`` on the manager's thread instead of py-spy: samples of CPU
time only (a thread blocked in a system call is not sampled, so a wait that spins shows and
one that sleeps does not), kernel frames included (the socket writes, ``poll``), Python
frames as the interpreter's. The tables are then each C function's share of the thread's
CPU (its callees included) in microseconds per bundle, and each library's own share. This
is how the watched-file round trips with every worker, the per-result performance-log row
and the poll over every worker were found (patches 0007-0010). Needs ``perf`` (the
``linux-perf`` package) and root or ``kernel.perf_event_paranoid`` <= 1.
Last line: ``cpu_ms_per_bundle_<N>=... busy_samples_per_bundle_<N>=...`` per count.
"""

from __future__ import annotations

import argparse
import collections
import os
import re
import shutil
import signal
import subprocess
import sys
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path

import common
import dask
from workers import make_graph

PY_SPY = Path(sys.executable).with_name("py-spy")
IDLE_LEAVES = ("poll", "epoll_wait", "select", "__poll", "__select", "nanosleep")
TASKVINE_SOURCES = ("vine_", "link.c", "hash_table.c", "itable.c", "list.c", "priority_queue",
                    "buffer.c", "set.c", "jx", "debug.c", "timestamp.c", "rmsummary")
STATS = ("time_polling", "time_status_msgs", "time_send", "time_receive", "time_internal",
         "time_scheduling", "time_application")


@dataclass
class Profile:
    """One count's samples of the manager thread, charged to TaskVine's and datavine's code."""

    workers: int
    bundles: int = 0
    cpu_s: float = 0.0
    wall_s: float = 0.0
    samples: int = 0
    idle: int = 0
    taskvine: collections.Counter[str] = field(default_factory=collections.Counter)
    datavine: collections.Counter[str] = field(default_factory=collections.Counter)
    other: collections.Counter[str] = field(default_factory=collections.Counter)
    stats: dict[str, float] = field(default_factory=dict)
    # --perf: share of the thread's CPU by function (callees included) and by library (own)
    functions: dict[str, float] = field(default_factory=dict)
    libraries: dict[str, float] = field(default_factory=dict)

    @property
    def busy(self) -> int:
        return self.samples - self.idle


def frame_name(frame: str) -> tuple[str, str]:
    """``function (file:line)`` -> (function, file)."""
    name, _, where = frame.rpartition(" (")
    return name or frame, where.rstrip(")").rsplit(":", 1)[0]


def charge(frames: list[str]) -> tuple[str, str]:
    """Who a sample (root first) is charged to: ("idle", leaf) when the leaf waits in a
    system call under TaskVine's poll; ("taskvine", fn) for the innermost TaskVine C frame;
    ("datavine", fn) for the innermost datavine frame; else ("other", the leaf)."""
    leaf, _ = frame_name(frames[-1])
    polling = any(frame_name(f)[0] in ("link_poll", "poll_active_workers") for f in frames[-4:])
    if (leaf in IDLE_LEAVES or leaf.startswith("0x")) and polling:
        return "idle", leaf
    for frame in reversed(frames):
        name, where = frame_name(frame)
        base = os.path.basename(where)
        if base.endswith(".c") and base.startswith(TASKVINE_SOURCES):
            return "taskvine", name
        if "datavine/" in where:
            return "datavine", f"{name} ({where.split('datavine/', 1)[1]})"
    return "other", leaf


def read_raw(path: Path, profile: Profile) -> None:
    """py-spy's raw format with ``--threads``: ``thread (0x..);frame;...;frame count``. The
    manager's thread is the one whose samples pass through ``Cluster.get``."""
    by_thread: dict[str, list[tuple[list[str], int]]] = collections.defaultdict(list)
    for line in path.read_text().splitlines():
        stack, _, count = line.rpartition(" ")
        frames = stack.split(";")
        by_thread[frames[0]].append((frames[1:], int(count)))
    manager = [t for t, rows in by_thread.items()
               if any("Cluster.get" in f for frames, _ in rows for f in frames)]
    for thread in manager:
        for frames, count in by_thread[thread]:
            profile.samples += count
            kind, name = charge(frames)
            if kind == "idle":
                profile.idle += count
            else:
                getattr(profile, kind)[name] += count


def perf_rows(cluster: object) -> list[dict[str, float]]:
    """TaskVine's performance log (``vine-logs/performance``, one row a second with
    ``perf-log-interval`` 1): its cumulative counters, timestamps in microseconds."""
    path = Path(cluster.runtime.info_dir) / "vine-logs" / "performance"  # type: ignore[attr-defined]
    lines = path.read_text().splitlines()
    header = lines[0].lstrip("#").split()
    return [dict(zip(header, map(float, line.split()), strict=False))
            for line in lines[1:] if line and not line.startswith("#")]


def stats_between(rows: list[dict[str, float]], t0_us: float, t1_us: float) -> dict[str, float]:
    """The counters' growth from the last row at or before ``t0_us`` to the first row at or
    after ``t1_us`` (rows are a second apart: the window is at most ~2 s wider than the
    run)."""
    first = max((r for r in rows if r["timestamp"] <= t0_us), key=lambda r: r["timestamp"],
                default=rows[0])
    last = min((r for r in rows if r["timestamp"] >= t1_us), key=lambda r: r["timestamp"],
               default=rows[-1])
    return {k: last[k] - first[k] for k in STATS}


PERF_ROW = re.compile(r"\s*([\d.]+)%\s+(?:([\d.]+)%\s+)?(?:\[(.)\]\s+)?(\S+)")


def perf_shares(data: Path, sort: str) -> dict[str, float]:
    """``perf report`` of ``data`` as {name: share of the samples}: by ``sym`` with callees
    included (user-space functions with a name), or by ``dso`` (each library's own)."""
    children = ["--children"] if sort == "sym" else ["--no-children"]
    out = subprocess.run(["perf", "report", "-i", str(data), *children, "--sort", sort,
                          "-g", "none", "--stdio"],
                         capture_output=True, text=True, timeout=300, check=False).stdout
    shares: dict[str, float] = {}
    for line in out.splitlines():
        m = PERF_ROW.match(line)
        if m is None or line.lstrip().startswith("#"):
            continue
        name = m.group(4)
        if sort == "sym" and (m.group(3) != "." or name.startswith("0x") or name.isdigit()):
            continue
        shares[name] = float(m.group(1)) / 100
    return shares


def start_profiler(perf: bool, rate: int, out: Path,
                   n: int) -> tuple[subprocess.Popen[bytes], Path]:
    """py-spy on this process, or perf on this thread (the one that will run ``get``)."""
    if perf:
        data = out / f"manager-{n}.perf.data"
        cmd = ["perf", "record", "-q", "-t", str(threading.get_native_id()), "-F", str(rate),
               "-g", "-o", str(data)]
    else:
        data = out / f"manager-{n}.txt"
        cmd = [str(PY_SPY), "record", "--pid", str(os.getpid()), "--native", "--threads",
               "--rate", str(rate), "--format", "raw", "--output", str(data)]
    return subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE), data


def profile_count(n: int, sleep: float, waves: int, rate: int, out: Path,
                  perf: bool = False) -> Profile:
    import datavine
    from datavine.config import RunConfig

    profile = Profile(n)
    run = RunConfig(memory=None, no_worker_timeout_s=300, progress=False,
                    pickle_by_value=("workers",))  # the tasks are defined in workers.py
    with datavine.LocalCluster(workers=n, cores=1, run=run, connect_timeout_s=900) as cluster:
        graph = make_graph(waves * n, sleep, run=n)
        spy, raw = start_profiler(perf, rate, out, n)
        cluster.runtime.manager.tune("perf-log-interval", 1)
        time.sleep(1.0)  # the profiler attaches
        cpu0, t0, wall0 = time.thread_time(), time.perf_counter(), time.time()
        dask.compute(graph, scheduler=cluster.get)
        profile.cpu_s, profile.wall_s = time.thread_time() - cpu0, time.perf_counter() - t0
        cluster.runtime.manager.wait(1)  # one more row of the performance log
        spy.send_signal(signal.SIGINT)
        _, err = spy.communicate(timeout=120)
        if spy.returncode not in (0, -signal.SIGINT) and not raw.exists():
            raise RuntimeError(f"the profiler failed (exit {spy.returncode}): "
                               f"{err.decode()[-500:]}")
        profile.bundles = cluster.last_summary.bundles
        grown = stats_between(perf_rows(cluster), wall0 * 1e6, (wall0 + profile.wall_s) * 1e6)
        profile.stats = {k: v / profile.bundles for k, v in grown.items()}
    if perf:
        profile.functions = perf_shares(raw, "sym")
        profile.libraries = perf_shares(raw, "dso")
    else:
        read_raw(raw, profile)
    return profile


def report_perf(profiles: list[Profile], top: int) -> None:
    """--perf: microseconds of the manager thread's CPU per bundle, by function (callees
    included) and by library (own)."""
    header = " | ".join(str(p.workers) for p in profiles)
    for title, attr, label in (("by function, callees included", "functions", "function"),
                               ("by library, its own code", "libraries", "library")):
        print(f"\nManager CPU, microseconds per bundle {title} (top {top}):")
        print(f"| {label} | {header} |")
        print("|---|" + "---:|" * len(profiles))
        names = collections.Counter[str]()
        for p in profiles:
            names.update(getattr(p, attr))
        for name, _ in names.most_common(top):
            cells = " | ".join(f"{1e6 * getattr(p, attr).get(name, 0.0) * p.cpu_s / p.bundles:.0f}"
                               for p in profiles)
            print(f"| `{name}` | {cells} |")


def report(profiles: list[Profile], top: int) -> None:
    if any(p.functions for p in profiles):  # --perf: no py-spy samples to count
        print("| workers | bundles | manager CPU ms / bundle |\n|---|---:|---:|")
        for p in profiles:
            print(f"| {p.workers} | {p.bundles} | {1e3 * p.cpu_s / p.bundles:.2f} |")
        report_perf(profiles, top)
        return
    print("| workers | bundles | manager CPU ms / bundle | busy samples / bundle | idle share "
          "| TaskVine's share of busy | datavine's | other |")
    print("|---|---:|---:|---:|---:|---:|---:|---:|")
    for p in profiles:
        busy = max(p.busy, 1)
        print(f"| {p.workers} | {p.bundles} | {1e3 * p.cpu_s / p.bundles:.2f} | "
              f"{p.busy / p.bundles:.2f} | {p.idle / max(p.samples, 1):.2f} | "
              f"{sum(p.taskvine.values()) / busy:.2f} | {sum(p.datavine.values()) / busy:.2f} | "
              f"{sum(p.other.values()) / busy:.2f} |")
    print("\nTaskVine's own accounting, microseconds per bundle:")
    print("| workers | " + " | ".join(STATS) + " |")
    print("|---|" + "---:|" * len(STATS))
    for p in profiles:
        print(f"| {p.workers} | " + " | ".join(f"{p.stats[k]:.0f}" for k in STATS) + " |")
    for kind in ("taskvine", "datavine", "other"):
        print(f"\nBusy samples per bundle charged to {kind}'s functions (top {top}):")
        names = collections.Counter[str]()
        for p in profiles:
            names.update(getattr(p, kind))
        header = " | ".join(str(p.workers) for p in profiles)
        print(f"| function | {header} |")
        print("|---|" + "---:|" * len(profiles))
        for name, _ in names.most_common(top):
            cells = " | ".join(f"{getattr(p, kind)[name] / p.bundles:.3f}" for p in profiles)
            print(f"| `{name}` | {cells} |")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--counts", type=int, nargs="+", default=[8, 64, 256])
    parser.add_argument("--sleep", type=float, default=10.0)
    parser.add_argument("--waves", type=int, default=3)
    parser.add_argument("--rate", type=int, default=250, help="samples per second")
    parser.add_argument("--top", type=int, default=12)
    parser.add_argument("--perf", action="store_true",
                        help="perf record (CPU samples, kernel included) instead of py-spy")
    args = parser.parse_args()
    common.setup()
    if args.perf and shutil.which("perf") is None:
        sys.exit("profile_manager: --perf needs perf on the PATH (apt-get install linux-perf)")
    if not args.perf and not PY_SPY.exists():
        sys.exit(f"profile_manager: no py-spy at {PY_SPY} (pip install py-spy)")
    print(common.machine_info())
    out = common.run_dir("profile-manager")
    profiles = [profile_count(n, args.sleep, args.waves, args.rate, out, args.perf)
                for n in args.counts]
    report(profiles, args.top)
    print(f"\nraw samples: {out}")
    print(common.kv_line({
        **{f"cpu_ms_per_bundle_{p.workers}": f"{1e3 * p.cpu_s / p.bundles:.2f}" for p in profiles},
        **{f"busy_samples_per_bundle_{p.workers}": f"{p.busy / p.bundles:.2f}"
           for p in profiles if not p.functions}}))


if __name__ == "__main__":
    main()
