"""Benchmark: ship the packed Python environment to 4, then 8 empty local workers.

Each round starts a fresh manager and fresh workers (empty caches); every worker runs one
task inside the environment. Manager egress comes from the manager's ``bytes_sent`` and
from its transaction log (TRANSFER lines: the manager's own sends; CACHE_UPDATE lines: when
each worker held the tarball and the unpacked tree); failed peer fetches from its debug log.
Which worker fetches from which is a race (see the README), so each worker count runs
``--rounds`` times and the last line reports the worst round's ratio. The last line printed
is one line of key=value pairs; the goal is ``egress_ratio`` (manager egress / tarball
size) <= 1.2.

    .venv/bin/python benchmarks/environment.py [--rounds 3] [--no-stage] [--full]
        [--compression zstd] [--workers 4 8] [--taskvine-defaults] [--tune NAME=VALUE ...]

By default the manager gets ``taskvine_port.MANAGER_TUNES`` (what datavine's runtime applies);
``--taskvine-defaults`` leaves TaskVine's own settings. By default one worker fetches the
tarball alone before the other tasks are submitted, as datavine's runtime does
(``DatavineLibrary._stage_environment``); ``--no-stage`` shows TaskVine's race without it.
"""

from __future__ import annotations

import argparse
import shutil
import statistics
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import common  # this script's folder is on sys.path when it runs
import ndcctools.taskvine as vine
import psutil

from datavine.config import LocalWorkersConfig
from datavine.deploy.local_workers import LocalWorkers
from datavine.manager.environment import (
    EnvSpec,
    PackedEnv,
    declare_environment,
    pack_environment,
    use_environment,
)
from datavine.manager.taskvine_port import MANAGER_TUNES

REPO = Path(__file__).resolve().parents[1]
SLIM = ("datavine", "numpy", "cloudpickle", "awkward", "uproot", "dask")
PROBE = "python -c 'import sys, numpy, awkward, uproot; print(sys.prefix)'"


def transactions(run_info: Path) -> list[list[str]]:
    log = next(run_info.glob("*/vine-logs/transactions"))
    return [line.split() for line in log.read_text().splitlines() if not line.startswith("#")]


def ship(packed: PackedEnv, workers: int, run_dir: Path, tunes: dict[str, float], *,
         stage: bool = False) -> dict[str, Any]:
    """One round: a fresh manager and ``workers`` empty workers each run one task in the env
    (``stage``: after one worker alone fetched the tarball)."""
    shutil.rmtree(run_dir, ignore_errors=True)
    run_dir.mkdir(parents=True)
    manager = vine.Manager(port=0, run_info_path=str(run_dir / "vine-run-info"))
    for name, value in tunes.items():
        manager.tune(name, value)
    env = declare_environment(manager, packed)
    pool = LocalWorkers(LocalWorkersConfig(workers=0, idle_timeout_s=120), manager.port, run_dir,
                        password_file=None)
    try:
        for i in range(workers):
            pool.start(1, features=(f"w{i}",))
        started = time.time()
        if stage:  # the same cached name as the environment's tarball: one replica table
            tarball = manager.declare_file(str(packed.path), cache="worker", peer_transfer=True)
            first = vine.Task("test -s env.tar")
            first.set_cores(1)
            first.add_feature("w0")
            first.add_input(tarball, "env.tar")
            manager.submit(first)
            wait_tasks(manager, pool, 1, started, lambda t: t.successful())
        for i in range(workers):
            task = vine.Task(PROBE)
            task.set_cores(1)
            task.add_feature(f"w{i}")  # one task per worker: every worker needs the env
            use_environment(task, env)
            manager.submit(task)
        wait_tasks(manager, pool, workers, started,
                   lambda t: t.successful() and t.output.startswith(str(run_dir)))
        wall = time.time() - started
        bytes_sent = manager.stats.bytes_sent
    finally:
        libraries = [c for p in pool.procs if psutil.pid_exists(p.pid)
                     for c in psutil.Process(p.pid).children(recursive=True)]
        pool.stop()
        for proc in libraries:
            if proc.is_running():
                proc.kill()
        del manager
    rows = transactions(run_dir / "vine-run-info")
    found = arrivals(rows, packed, workers, started)
    return {"workers": workers, "egress_mb": bytes_sent / 2**20,
            "egress_ratio": bytes_sent / packed.size, "wall_s": wall, **found,
            "peer_failures": failed_fetches(run_dir / "vine-run-info", found["tarball"])}


def wait_tasks(manager: Any, pool: LocalWorkers, count: int, started: float,
               ok: Callable[[Any], bool]) -> None:
    """Wait for ``count`` tasks, each of which must pass ``ok``; at most 600 s in all, and
    not a moment once a worker has exited (every worker has a task to run)."""
    done = 0
    while done < count:
        if time.time() - started > 600:
            raise TimeoutError(f"{done} of {count} tasks done after 600 s")
        if pool.alive() < len(pool.procs):
            raise RuntimeError(f"{len(pool.procs) - pool.alive()} of {len(pool.procs)} workers "
                               f"exited after {time.time() - started:.1f} s, {done} of {count} "
                               f"tasks done; see {pool.run_dir}/worker-*.log")
        task = manager.wait(1)
        if task is None:
            continue
        if not ok(task):
            raise RuntimeError(f"task failed or ran outside the env: {task.result} "
                               f"{task.output!r}")
        done += 1


def failed_fetches(run_info: Path, tarball: str) -> int:
    """Fetches of the tarball a worker reported failed (``cache-invalid``, debug log)."""
    log = next(run_info.glob("*/vine-logs/debug"))
    return sum(f"cache-invalid {tarball} " in line
               for line in log.read_text(errors="replace").splitlines())


def arrivals(rows: list[list[str]], packed: PackedEnv, workers: int, started: float
             ) -> dict[str, Any]:
    """From the transaction log: who got the tarball from the manager (TRANSFER INPUT of
    its size; the log's "size_in_mb" column holds bytes) and who from a peer (CACHE_UPDATE
    of its cached name on a worker the manager did not send it to), and when the last worker
    held it and the unpacked tree (a CACHE_UPDATE of the untar mini-task's ``task-md5-*``).
    Times are seconds since the workers were started."""
    sends = [r for r in rows if r[4:6] == ["TRANSFER", "INPUT"] and int(r[7]) == packed.size]
    if not sends:
        raise RuntimeError(f"no TRANSFER of the tarball ({packed.size} B) in the log")
    tarball = sends[0][6]  # its cached name, file-md5-...
    from_manager = {r[3] for r in sends}
    held = {r[3]: int(r[0]) / 1e6 - started for r in rows if r[4:6] == ["CACHE_UPDATE", tarball]}
    held.update({r[3]: int(r[0]) / 1e6 - started for r in sends})
    untarred = {r[3]: int(r[0]) / 1e6 - started for r in rows
                if r[4] == "CACHE_UPDATE" and r[5].startswith("task-md5-")}
    if len(held) != workers or len(untarred) != workers:
        raise RuntimeError(f"{len(held)} workers got the tarball and {len(untarred)} unpacked "
                           f"it, of {workers}")
    return {"tarball": tarball, "manager_copies": len(sends),
            "peer_copies": len(set(held) - from_manager),
            "reach_all_s": max(held.values()), "ready_all_s": max(untarred.values())}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--full", action="store_true", help="ship every installed package")
    parser.add_argument("--compression", default="gzip", choices=("gzip", "zstd", "none"))
    parser.add_argument("--workers", type=int, nargs="+", default=[4, 8])
    parser.add_argument("--rounds", type=int, default=3, help="rounds per worker count")
    parser.add_argument("--no-stage", dest="stage", action="store_false",
                        help="do not let one worker fetch the tarball before the others start")
    parser.add_argument("--taskvine-defaults", action="store_true",
                        help="do not apply datavine's MANAGER_TUNES")
    parser.add_argument("--tune", action="append", default=[], metavar="NAME=VALUE",
                        help="another manager tune, e.g. worker-source-max-transfers=2")
    args = parser.parse_args()
    common.setup()  # SIGTERM (as `timeout` sends) still stops the workers
    print(f"# {common.machine_info()}", flush=True)
    tunes = {} if args.taskvine_defaults else dict(MANAGER_TUNES)
    tunes.update({k: float(v) for k, v in (t.split("=", 1) for t in args.tune)})
    spec = EnvSpec(include=() if args.full else SLIM, compression=args.compression)
    started = time.perf_counter()
    packed = pack_environment(spec, REPO / "build" / "bench-envs")
    call_s = time.perf_counter() - started
    print(f"pack: {packed.path.name} {packed.size / 2**20:.1f} MB, {packed.files} files, "
          f"packed in {packed.pack_s:.1f} s, this call {call_s:.2f} s (reused={packed.reused})")
    rounds: dict[int, list[dict[str, Any]]] = {}
    for n in args.workers:
        for k in range(args.rounds):
            r = ship(packed, n, REPO / "build" / "bench-env-run" / f"w{n}-{k}", tunes,
                     stage=args.stage)
            rounds.setdefault(n, []).append(r)
            print(f"workers={n} round {k + 1}: manager sent {r['egress_mb']:.1f} MB = "
                  f"{r['egress_ratio']:.2f} x the tarball ({r['manager_copies']} copies from the "
                  f"manager, {r['peer_copies']} from peers, {r['peer_failures']} failed peer "
                  f"fetches); tarball on all workers after {r['reach_all_s']:.2f} s, unpacked on "
                  f"all after {r['ready_all_s']:.2f} s, tasks done after {r['wall_s']:.2f} s",
                  flush=True)
    print(last_line(rounds, packed, args, tunes))


def median(runs: list[dict[str, Any]], name: str) -> float:
    return statistics.median(r[name] for r in runs)


def last_line(rounds: dict[int, list[dict[str, Any]]], packed: PackedEnv,
              args: argparse.Namespace, tunes: dict[str, float]) -> str:
    """The key=value line: the last worker count first, then the others (prefixed)."""
    fields: dict[str, Any] = {}
    counts = list(rounds)
    for n in [counts[-1], *counts[:-1]]:
        runs = rounds[n]
        ratios = [r["egress_ratio"] for r in runs]
        prefix = "" if n == counts[-1] else f"workers{n}_"
        if not prefix:
            fields["workers"] = n
        fields.update({
            f"{prefix}egress_ratio": f"{max(ratios):.3f}",  # the worst round
            f"{prefix}egress_ratio_median": f"{statistics.median(ratios):.3f}",
            f"{prefix}egress_ratios": ",".join(f"{x:.2f}" for x in ratios),
            f"{prefix}manager_copies_max": max(r["manager_copies"] for r in runs),
            f"{prefix}peer_failures": sum(r["peer_failures"] for r in runs),
            f"{prefix}reach_all_s_median": f"{median(runs, 'reach_all_s'):.2f}",
            f"{prefix}ready_all_s_median": f"{median(runs, 'ready_all_s'):.2f}",
        })
    fields.update({"rounds": args.rounds, "stage": int(args.stage),
                   "tarball_mb": f"{packed.size / 2**20:.1f}",
                   "env": "full" if args.full else "slim", "compression": args.compression,
                   "pack_s": f"{packed.pack_s:.1f}", "files": packed.files,
                   "tunes": ",".join(f"{k}={v:g}" for k, v in tunes.items()) or "none"})
    return common.kv_line(fields)


if __name__ == "__main__":
    main()
