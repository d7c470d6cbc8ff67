"""Benchmark: ship the packed Python environment to 4, then 8 empty local workers.

For each round a fresh manager and fresh workers (empty caches) run one task per worker
inside the environment. Manager egress comes from the manager's ``bytes_sent`` and from its
transaction log (TRANSFER lines: the manager's own sends; CACHE_UPDATE lines: when each
worker held the tarball and the unpacked tree). The last line printed is one line of
key=value pairs; the goal is ``egress_ratio`` (manager egress / tarball size) <= 1.2.

    .venv/bin/python benchmarks/environment.py [--full] [--compression zstd]
        [--workers 4 8] [--taskvine-defaults] [--tune worker-source-max-transfers=2 ...]

By default the manager gets ``environment.MANAGER_TUNES`` (what datavine's runtime applies);
``--taskvine-defaults`` leaves TaskVine's own settings.
"""

from __future__ import annotations

import argparse
import shutil
import time
from pathlib import Path
from typing import Any

import common  # this script's folder is on sys.path when it runs
import ndcctools.taskvine as vine
import psutil

from datavine.config import LocalWorkersConfig
from datavine.environment import (
    MANAGER_TUNES,
    EnvSpec,
    PackedEnv,
    declare_environment,
    pack_environment,
    use_environment,
)
from datavine.local_workers import LocalWorkers

REPO = Path(__file__).resolve().parents[1]
SLIM = ("datavine", "numpy", "cloudpickle", "awkward", "uproot", "dask")
PROBE = "python -c 'import sys, numpy, awkward, uproot; print(sys.prefix)'"


def transactions(run_info: Path) -> list[list[str]]:
    log = next(run_info.glob("*/vine-logs/transactions"))
    return [line.split() for line in log.read_text().splitlines() if not line.startswith("#")]


def ship(packed: PackedEnv, workers: int, run_dir: Path, tunes: dict[str, float]
         ) -> dict[str, Any]:
    """One round: a fresh manager and ``workers`` empty workers each run one task in the env."""
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
        for i in range(workers):
            task = vine.Task(PROBE)
            task.set_cores(1)
            task.add_feature(f"w{i}")  # one task per worker: every worker needs the env
            use_environment(task, env)
            manager.submit(task)
        done = 0
        while done < workers:
            if time.time() - started > 600:
                raise TimeoutError(f"{done} of {workers} tasks done after 600 s")
            task = manager.wait(1)
            if task is None:
                continue
            if not (task.successful() and task.output.startswith(str(run_dir))):
                raise RuntimeError(f"task failed or ran outside the env: {task.result} "
                                   f"{task.output!r}")
            done += 1
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
    return {"workers": workers, "egress_mb": bytes_sent / 2**20,
            "egress_ratio": bytes_sent / packed.size, "wall_s": wall,
            **arrivals(transactions(run_dir / "vine-run-info"), packed, workers, started)}


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
    return {"manager_copies": len(sends), "peer_copies": len(set(held) - from_manager),
            "reach_all_s": max(held.values()), "ready_all_s": max(untarred.values())}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--full", action="store_true", help="ship every installed package")
    parser.add_argument("--compression", default="gzip", choices=("gzip", "zstd", "none"))
    parser.add_argument("--workers", type=int, nargs="+", default=[4, 8])
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
    results = []
    for n in args.workers:
        r = ship(packed, n, REPO / "build" / "bench-env-run" / f"w{n}", tunes)
        results.append(r)
        print(f"workers={n}: manager sent {r['egress_mb']:.1f} MB = {r['egress_ratio']:.2f} x "
              f"the tarball ({r['manager_copies']} copies from the manager, "
              f"{r['peer_copies']} from peers); tarball on all workers after "
              f"{r['reach_all_s']:.2f} s, unpacked on all after {r['ready_all_s']:.2f} s, "
              f"tasks done after {r['wall_s']:.2f} s")
    last = results[-1]
    fields = {"workers": last["workers"], "egress_ratio": f"{last['egress_ratio']:.3f}",
              "manager_copies": last["manager_copies"], "peer_copies": last["peer_copies"],
              "tarball_mb": f"{packed.size / 2**20:.1f}",
              "reach_all_s": f"{last['reach_all_s']:.2f}",
              "ready_all_s": f"{last['ready_all_s']:.2f}", "wall_s": f"{last['wall_s']:.2f}"}
    for r in results[:-1]:
        fields[f"workers{r['workers']}_egress_ratio"] = f"{r['egress_ratio']:.3f}"
        fields[f"workers{r['workers']}_reach_all_s"] = f"{r['reach_all_s']:.2f}"
    fields.update({"env": "full" if args.full else "slim", "compression": args.compression,
                   "pack_s": f"{packed.pack_s:.1f}", "files": packed.files,
                   "tunes": ",".join(f"{k}={v:g}" for k, v in tunes.items()) or "none"})
    print(" ".join(f"{k}={v}" for k, v in fields.items()))


if __name__ == "__main__":
    main()
