"""Benchmark: what clients that connect and say nothing cost a run (issue 28, goal 2).

A facility's port scanners connect to the manager's port and say nothing; before patch
0013 each held the manager's wait loop for its ``short-timeout`` (5 s), with TLS for good.
Here a ``datavine.LocalCluster`` runs ``--tasks`` small tasks (each sleeps ``--task-ms``)
on ``--workers`` workers, three ways, each ``--repeat`` times, best run counted:

- ``quiet``: nobody else connects (the reference);
- ``silent``: ``--clients`` TCP connections are opened during the run (from 0.2 s after
  its start) and say nothing; the manager keeps its default deadline (5 s), so a run longer
  than that also sees them dropped;
- ``halfway``: as ``silent``, but each sends the first line of the password exchange and
  stops there.

``--tls`` runs the three on a manager with TLS (a self-signed certificate made here,
workers pinned to its fingerprint). The goal: ``silent`` and ``halfway`` cost <= 5% of
``quiet``'s time. Every run's result is checked. The last line printed is
``key=value``: the overheads, the clients dropped, and ``goal_met``.

    .venv/bin/python benchmarks/silent_clients.py [--clients 100] [--tasks 400]
        [--task-ms 10] [--workers 2] [--repeat 3] [--tls]
"""

from __future__ import annotations

import argparse
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path

import common  # this script's folder is on sys.path when it runs
from dask import delayed

import datavine

GOAL = 0.05
START_AFTER_S = 0.2
HALFWAY_LINE = b"auth password hmac-sha256 v2\n"


def nap(i: int, ms: float) -> int:
    time.sleep(ms / 1000)
    return i


def graph(tasks: int, ms: float) -> object:
    return delayed(sum)([delayed(nap)(i, ms) for i in range(tasks)])


class Intruders:
    """``n`` connections opened on a thread once started; each says ``line`` (if any)."""

    def __init__(self, port: int, n: int, line: bytes) -> None:
        self.port, self.n, self.line = port, n, line
        self.opened: list[socket.socket] = []
        self.failed = 0
        self.thread = threading.Thread(target=self._open, daemon=True)

    def _open(self) -> None:
        for _ in range(self.n):
            try:
                sock = socket.create_connection(("127.0.0.1", self.port), timeout=30)
            except OSError:
                self.failed += 1
                continue
            if self.line:
                sock.sendall(self.line)
            self.opened.append(sock)

    def dropped(self) -> int:
        """How many the manager has closed by now."""
        n = 0
        for sock in self.opened:
            sock.setblocking(False)
            try:
                if sock.recv(1, socket.MSG_PEEK) == b"":
                    n += 1
            except BlockingIOError:
                pass
            except OSError:
                n += 1
        return n

    def close(self) -> None:
        self.thread.join(60)
        for sock in self.opened:
            sock.close()


def one_run(cluster: datavine.LocalCluster, tasks: int, ms: float, clients: int,
            line: bytes | None) -> tuple[float, int, int]:
    """(seconds, connections opened, of those dropped by the run's end) for one run."""
    expected = sum(range(tasks))
    intruders = Intruders(cluster.port, clients, line or b"") if line is not None else None
    timer = threading.Timer(START_AFTER_S, intruders.thread.start) if intruders else None
    t0 = time.perf_counter()
    if timer is not None:
        timer.start()  # the clients arrive during the run, not before it
    value = graph(tasks, ms).compute(scheduler=cluster.get)  # type: ignore[attr-defined]
    seconds = time.perf_counter() - t0
    if value != expected:
        raise SystemExit(f"wrong result: {value} != {expected}")
    if intruders is None:
        return seconds, 0, 0
    intruders.thread.join(60)
    opened, dropped = len(intruders.opened), intruders.dropped()
    intruders.close()
    return seconds, opened, dropped


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
    with datavine.LocalCluster(workers=args.workers, manager=cfg, dashboard=False) as cluster:
        graph(4, 0).compute(scheduler=cluster.get)  # type: ignore[attr-defined]  # warm
        for rep in range(args.repeat):
            for kind, line in kinds.items():
                seconds, opened, dropped = one_run(cluster, args.tasks, args.task_ms,
                                                   args.clients, line)
                print(f"  run {rep + 1} {kind:8s} {seconds:7.3f} s  connections opened "
                      f"{opened}, dropped by the run's end {dropped}", flush=True)
                best[kind] = min(best.get(kind, seconds), seconds)
                time.sleep(6 if line is not None else 0)  # let this run's clients expire
    print(f"{'run':10s} {'best s':>8s} {'vs quiet':>9s}")
    for kind in kinds:
        print(f"{kind:10s} {best[kind]:8.3f} {best[kind] / best['quiet']:9.3f}")
    over_silent = best["silent"] / best["quiet"] - 1
    over_halfway = best["halfway"] / best["quiet"] - 1
    print(common.kv_line({
        "clients": args.clients, "tls": int(args.tls), "tasks": args.tasks,
        "quiet_s": f"{best['quiet']:.3f}", "silent_s": f"{best['silent']:.3f}",
        "halfway_s": f"{best['halfway']:.3f}",
        "overhead_silent": f"{over_silent:.3f}", "overhead_halfway": f"{over_halfway:.3f}",
        "goal_met": int(max(over_silent, over_halfway) <= GOAL),
    }))
    sys.stdout.flush()


if __name__ == "__main__":
    main()
