"""Benchmark: what clients that connect and say nothing cost a run (issue 28, goal 2).

A facility's port scanners connect to the manager's port and say nothing; before patch
0013 each held the manager's wait loop for its ``short-timeout`` (5 s), with TLS for good.
Here a ``datavine.LocalCluster`` runs ``--tasks`` small tasks (each sleeps ``--task-ms``)
on ``--workers`` workers, three ways, each ``--repeat`` times in turn (the medians are
compared; the best runs are shown too):

- ``quiet``: nobody connects (the reference); the same other process is started, opening
  no connection, so its own start's CPU is in every run alike;
- ``silent``: another process (a port scanner) opens ``--clients`` TCP connections during
  the run (from 0.5 s after its start) and says nothing on them; the manager keeps its
  default deadline (5 s), so a run longer than that also sees them dropped;
- ``halfway``: as ``silent``, but each sends the first line of the password exchange and
  stops there.

``--tls`` runs the three on a manager with TLS (a self-signed certificate made here,
workers pinned to its fingerprint). The goal: ``silent`` and ``halfway`` cost <= 5% of
``quiet``'s time, with all ``--clients`` opened (``opened_in_run``: the fewest in any run)
and none dropped before the run's end (the deadline is 5 s). Every run's result is
checked. The last line printed is
``key=value``: the overheads, the clients dropped, and ``goal_met``.

    .venv/bin/python benchmarks/silent_clients.py [--clients 100] [--tasks 400]
        [--task-ms 10] [--workers 2] [--repeat 3] [--tls]
"""

from __future__ import annotations

import argparse
import statistics
import subprocess
import sys
import time
from pathlib import Path

import common  # this script's folder is on sys.path when it runs
from dask import delayed

import datavine

GOAL = 0.05
START_AFTER_S = 0.5  # a new Python's start (~50 ms) included
HALFWAY_LINE = b"auth password hmac-sha256 v2\n"


def nap(i: int, ms: float) -> int:
    time.sleep(ms / 1000)
    return i


def graph(tasks: int, ms: float) -> object:
    return delayed(sum)([delayed(nap)(i, ms) for i in range(tasks)])


INTRUDER = r"""
import socket, sys, time
port, n, line, delay = int(sys.argv[1]), int(sys.argv[2]), sys.argv[3], float(sys.argv[4])
time.sleep(delay)
opened = []
for _ in range(n):
    try:
        sock = socket.create_connection(("127.0.0.1", port), timeout=5)
    except OSError:
        continue
    if line:
        sock.sendall(line.encode() + b"\n")
    opened.append(sock)
print(len(opened), flush=True)
sys.stdin.read()  # holds them until told
dropped = 0
for sock in opened:
    sock.setblocking(False)
    try:
        while sock.recv(4096):  # the manager's ident line, then the end if it closed
            pass
        dropped += 1
    except BlockingIOError:
        pass
    except OSError:
        dropped += 1
print(dropped, flush=True)
"""


class Intruders:
    """``n`` connections opened by another process (as a port scanner's would be), from
    ``delay_s`` after ``start``; each says ``line`` (if any), then nothing."""

    def __init__(self, port: int, n: int, line: bytes, delay_s: float) -> None:
        self.proc = subprocess.Popen(
            [sys.executable, "-c", INTRUDER, str(port), str(n), line.decode().strip(),
             str(delay_s)],
            stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)

    def opened(self) -> int:
        """How many connections it opened (waits until it has tried them all)."""
        assert self.proc.stdout is not None
        return int(self.proc.stdout.readline())

    def close(self) -> int:
        """Ends it; how many of its connections the manager had closed by then."""
        out, _ = self.proc.communicate("", timeout=60)
        return int(out.split()[0])


def one_run(cluster: datavine.LocalCluster, tasks: int, ms: float, clients: int,
            line: bytes | None) -> tuple[float, int, int]:
    """(seconds, connections opened, of those dropped by the run's end) for one run."""
    expected = sum(range(tasks))
    intruders = Intruders(cluster.port, clients if line is not None else 0, line or b"",
                          START_AFTER_S)
    t0 = time.perf_counter()  # the intruders start connecting START_AFTER_S from about now
    value = graph(tasks, ms).compute(scheduler=cluster.get)  # type: ignore[attr-defined]
    seconds = time.perf_counter() - t0
    if value != expected:
        raise SystemExit(f"wrong result: {value} != {expected}")
    opened = intruders.opened()
    return seconds, opened, intruders.close()


def certificate(folder: Path) -> tuple[Path, Path]:
    key, cert = folder / "key.pem", folder / "cert.pem"
    subprocess.run(["openssl", "req", "-x509", "-newkey", "rsa:2048", "-nodes", "-keyout",
                    str(key), "-out", str(cert), "-days", "1", "-subj", "/CN=localhost",
                    "-addext", "subjectAltName=IP:127.0.0.1"], check=True, capture_output=True)
    return key, cert


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--clients", type=int, default=100)
    ap.add_argument("--tasks", type=int, default=400)
    ap.add_argument("--task-ms", type=float, default=10.0)
    ap.add_argument("--workers", type=int, default=2)
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument("--tls", action="store_true", help="the manager and workers use TLS")
    args = ap.parse_args()
    common.setup()
    print(common.machine_info())
    folder = common.run_dir("silent-clients-")
    cfg = datavine.ManagerConfig(run_dir=folder / "manager")
    if args.tls:
        key, cert = certificate(folder)
        cfg = datavine.ManagerConfig(run_dir=folder / "manager", ssl_key=key, ssl_cert=cert)
    kinds = {"quiet": None, "silent": b"", "halfway": HALFWAY_LINE}
    best: dict[str, float] = {}
    fewest_opened: dict[str, int] = {}
    times: dict[str, list[float]] = {}
    with datavine.LocalCluster(workers=args.workers, manager=cfg, dashboard=False) as cluster:
        graph(4, 0).compute(scheduler=cluster.get)  # type: ignore[attr-defined]  # warm
        for rep in range(args.repeat):
            for kind, line in kinds.items():
                seconds, opened, dropped = one_run(cluster, args.tasks, args.task_ms,
                                                   args.clients, line)
                print(f"  run {rep + 1} {kind:8s} {seconds:7.3f} s  connections opened "
                      f"{opened}, dropped by the run's end {dropped}", flush=True)
                best[kind] = min(best.get(kind, seconds), seconds)
                times.setdefault(kind, []).append(seconds)
                fewest_opened[kind] = min(fewest_opened.get(kind, opened), opened)
                time.sleep(6 if line is not None else 0)  # let this run's clients expire
    print(f"{'run':10s} {'best s':>8s} {'vs quiet':>9s} {'median s':>9s} {'vs quiet':>9s}")
    median = {kind: statistics.median(times[kind]) for kind in kinds}
    for kind in kinds:
        print(f"{kind:10s} {best[kind]:8.3f} {best[kind] / best['quiet']:9.3f} "
              f"{median[kind]:9.3f} {median[kind] / median['quiet']:9.3f}")
    over_silent = median["silent"] / median["quiet"] - 1
    over_halfway = median["halfway"] / median["quiet"] - 1
    print(common.kv_line({
        "clients": args.clients, "tls": int(args.tls), "tasks": args.tasks,
        "quiet_s": f"{median['quiet']:.3f}", "silent_s": f"{median['silent']:.3f}",
        "halfway_s": f"{median['halfway']:.3f}",
        "overhead_silent": f"{over_silent:.3f}", "overhead_halfway": f"{over_halfway:.3f}",
        "opened_in_run": min(fewest_opened["silent"], fewest_opened["halfway"]),
        "goal_met": int(max(over_silent, over_halfway) <= GOAL
                        and min(fewest_opened["silent"], fewest_opened["halfway"]) == args.clients),
    }))
    sys.stdout.flush()


if __name__ == "__main__":
    main()
