"""Shared pieces of the benchmarks: timing, the peers' clusters, the table and the key=value line.

The peers a datavine benchmark compares against are started here, each with its workers
connected before any clock starts (as pools are pre-started in production):

- :func:`daskvine` -- cctools' ``DaskVine`` manager with local ``vine_worker`` processes that
  authenticate with a fresh TaskVine password, as :class:`datavine.LocalCluster` does;
- :func:`distributed_client` -- a ``distributed.LocalCluster`` of ``workers`` x ``cores``.

:func:`measure` runs one peer, times it and checks its result; a peer that fails is
reported in the table with its error instead of ending the benchmark. The last line a
benchmark prints is :func:`kv_line`'s: one line of ``key=value`` pairs.
"""

from __future__ import annotations

import contextlib
import datetime
import logging
import os
import platform
import signal
import sys
import tempfile
import time
import traceback
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from datavine.worker.alarm import alarm

REPO = Path(__file__).resolve().parents[1]
RUNS = REPO / "runs" / "benchmarks"  # ignored by git


@dataclass
class PeerResult:
    """One peer's measurement: ``units`` (tasks, events) done in ``seconds``."""

    name: str
    units: int
    seconds: float | None = None
    ok: bool | None = None
    note: str = ""

    @property
    def rate(self) -> float | None:
        """Units per second, only for a run that finished with the right result."""
        if not self.ok or not self.seconds:
            return None
        return self.units / self.seconds


class PeerTimeout(Exception):
    """A peer's run went past the benchmark's bound for it."""


def bounded(limit_s: float | None) -> contextlib.AbstractContextManager[None]:
    """Raise :class:`PeerTimeout` in the block after ``limit_s`` (main thread; SIGALRM:
    :func:`datavine.worker.alarm.alarm`, the worker's task time limit)."""
    return alarm(limit_s, lambda: PeerTimeout(f"no result after {limit_s:.0f} s"))


def measure(name: str, units: int, run: Callable[[], Any], check: Callable[[Any], bool],
            note: str = "", limit_s: float | None = None) -> PeerResult:
    """Time ``run()`` once and check its value; errors (and a run past ``limit_s``: a peer
    that hangs) become a failed row, not a crash."""
    print(f"# running {name} ({units} units) ...", file=sys.stderr, flush=True)
    started = time.perf_counter()
    try:
        with bounded(limit_s):
            value = run()
    except Exception as exc:  # a peer's failure is a finding, not the end of the benchmark
        seconds = time.perf_counter() - started
        traceback.print_exc(file=sys.stderr)
        return PeerResult(name, units, seconds, False,
                          f"{note + '; ' if note else ''}FAILED: {type(exc).__name__}: {exc}"[:200])
    seconds = time.perf_counter() - started
    ok = bool(check(value))
    if not ok:
        note = f"{note + '; ' if note else ''}WRONG RESULT"
    result = PeerResult(name, units, seconds, ok, note)
    print(f"#   {name}: {seconds:.2f} s ok={ok}", file=sys.stderr, flush=True)
    return result


def best_of(results: list[PeerResult]) -> PeerResult:
    """The run with the highest rate (failed runs only if all failed)."""
    good = [r for r in results if r.rate is not None]
    return max(good, key=lambda r: r.rate or 0.0) if good else results[-1]


def ratio(a: float | None, b: float | None) -> str:
    """``a / b`` to three digits, or ``nan`` when either is missing."""
    if not a or not b:
        return "nan"
    return f"{a / b:.3g}"


def slug(name: str) -> str:
    """A peer name as a key: ``'DaskVine function-calls'`` -> ``'daskvine_fc'``."""
    short = {"DaskVine function-calls": "daskvine_fc", "DaskVine tasks": "daskvine_tasks",
             "dask threads": "threads", "dask processes": "processes",
             "distributed": "distributed", "plain loop": "plain_loop"}
    return short.get(name, name.lower().replace(" ", "_").replace("-", "_"))


def table(results: list[PeerResult], unit: str) -> str:
    """A Markdown table of the results, fastest first."""
    rows = sorted(results, key=lambda r: -(r.rate or -1.0))
    lines = [f"| peer | {unit} | seconds | {unit}/s | correct | note |",
             "|---|---:|---:|---:|---|---|"]
    for r in rows:
        rate = f"{r.rate:,.0f}" if r.rate is not None else "-"
        secs = f"{r.seconds:.2f}" if r.seconds is not None else "-"
        lines.append(f"| {r.name} | {r.units:,} | {secs} | {rate} | "
                     f"{'yes' if r.ok else 'NO'} | {r.note} |")
    return "\n".join(lines)


def kv_line(pairs: dict[str, Any]) -> str:
    """One line of ``key=value`` pairs, in the given order."""
    return " ".join(f"{k}={v}" for k, v in pairs.items())


def machine_info() -> str:
    """Host, usable cores, load and versions, for the record."""
    import dask

    cores = len(os.sched_getaffinity(0))
    load = " ".join(f"{x:.2f}" for x in os.getloadavg())
    now = datetime.datetime.now(datetime.UTC).strftime("%Y-%m-%d %H:%M UTC")
    return (f"{now} host={platform.node()} usable_cores={cores} of {os.cpu_count()} "
            f"load=[{load}] python={platform.python_version()} dask={dask.__version__}")


def host_cpu() -> tuple[int, int]:
    """(busy, all) clock ticks of this host's CPUs since boot (/proc/stat: all but idle and
    iowait is busy)."""
    with open("/proc/stat") as f:
        fields = [int(x) for x in f.readline().split()[1:]]
    return sum(fields) - fields[3] - fields[4], sum(fields)


def quiesce(idle: float = 0.9, window_s: float = 0.5, max_s: float = 15.0) -> float:
    """Wait until this machine's CPUs are at least ``idle`` idle over a ``window_s`` window
    (the run before may still be writing its caches out, or its servers settling), at most
    ``max_s``; returns the seconds waited. Then the next run's clock does not pay for the
    last one's tail, whichever ran first."""
    started = time.perf_counter()
    while time.perf_counter() - started < max_s:
        busy0, total0 = host_cpu()
        time.sleep(window_s)
        busy1, total1 = host_cpu()
        if total1 > total0 and 1 - (busy1 - busy0) / (total1 - total0) >= idle:
            break
    return time.perf_counter() - started


def run_dir(prefix: str, root: Path | None = None) -> Path:
    """A fresh directory for one peer's manager and worker files under ``root`` (None:
    runs/benchmarks)."""
    root = root or RUNS
    root.mkdir(parents=True, exist_ok=True)
    return Path(tempfile.mkdtemp(prefix=f"{prefix}-", dir=root))


MEMORY_SCRATCH = Path("/dev/shm")


def filesystem_of(path: Path) -> str:
    """The type of the filesystem ``path`` is on (``tmpfs``, ``ext4``, ...; '' when
    /proc/mounts does not say): the mount point that is the longest prefix of it."""
    target, best, kind = path.resolve(), -1, ""
    try:
        with open("/proc/mounts") as f:
            mounts = [line.split()[1:3] for line in f if len(line.split()) >= 3]
    except OSError:
        return ""
    for point, fstype in mounts:
        mount = Path(point.replace("\\040", " "))
        if (target == mount or mount in target.parents) and len(mount.parts) > best:
            best, kind = len(mount.parts), fstype
    return kind


def memory_scratch() -> Path | None:
    """:data:`MEMORY_SCRATCH` when it is a tmpfs this process may write to, else None: where
    a benchmark's local workers may keep their workspaces off the disk."""
    if (MEMORY_SCRATCH.is_dir() and os.access(MEMORY_SCRATCH, os.W_OK)
            and filesystem_of(MEMORY_SCRATCH) == "tmpfs"):
        return MEMORY_SCRATCH
    return None


def readable_dataset(data: Path, n_files: int, events: int) -> list[Path]:
    """Generated ZSTD files in ``data`` (kept from an earlier run when the same), readable
    by the xrootd user of the box's servers (the folders above it searchable)."""
    from datavine.io.datagen import generate_dataset

    data.mkdir(parents=True, exist_ok=True)
    return make_readable(data, generate_dataset(data, n_files, events, "zstd"))


def make_readable(data: Path, files: list[Path]) -> list[Path]:
    """``files`` in ``data`` made readable by the xrootd user of the box's servers (the
    folders above ``data`` searchable); returns ``files``."""
    for p in [data, *files]:
        p.chmod(0o755 if p.is_dir() else 0o644)
    for parent in data.resolve().parents:  # the xrootd user must reach the files
        if parent != Path("/"):
            parent.chmod(parent.stat().st_mode | 0o011)
    return files


def box_chunks(plan: dict[str, Any]) -> tuple[Any, Any, list[Any]]:
    """On the box's manager host: a drive plan's facility (its ``facility`` file), the shard
    map, and the chunks of its ``files`` (``chunk_events`` each) as the origin's URLs."""
    from datavine.apps.analysis.agc import make_chunks
    from datavine.apps.analysis.sources import to_origin
    from datavine.deploy.facility import load_facility

    facility = load_facility(Path(plan["facility"]))
    shards = facility.shards
    assert shards is not None and shards.origin is not None and facility.export_root
    chunks = to_origin(make_chunks(plan["files"], plan["chunk_events"]), facility.export_root,
                       shards.origin.url)
    return facility, shards, chunks


def setup() -> None:
    """Silence the peers' chatty loggers (distributed's INFO lines), and turn SIGTERM (as
    ``timeout`` sends) into an exit that runs the ``finally`` blocks stopping the workers."""
    for name in ("distributed", "bokeh", "tornado"):
        logging.getLogger(name).setLevel(logging.ERROR)
    signal.signal(signal.SIGTERM, _exit_on_term)


def _exit_on_term(signum: int, frame: Any) -> None:
    raise SystemExit(128 + signum)


# --- peers -------------------------------------------------------------------------------
@contextlib.contextmanager
def daskvine(workers: int, cores: int, *, timeout_s: float = 60.0,
             root: Path | None = None) -> Iterator[Any]:
    """A cctools ``DaskVine`` manager with ``workers`` local ``vine_worker``s connected.

    The workers get a fresh password file (a worker without it is rejected) and run this
    interpreter, as datavine's own local workers do. The manager's and the workers' files
    go in a fresh folder under ``root`` (:func:`run_dir`), kept.
    """
    from ndcctools.taskvine import DaskVine

    from datavine.config import LocalWorkersConfig
    from datavine.deploy.local_workers import LocalWorkers
    from datavine.manager.cluster import make_password_file

    where = run_dir("daskvine", root)
    password = make_password_file(where)
    manager = DaskVine(port=0, run_info_path=str(where / "vine-run-info"),
                       staging_path=str(where))
    manager.set_password_file(str(password))
    pool = LocalWorkers(LocalWorkersConfig(workers=workers, cores=cores), manager.port,
                        where / "workers", password_file=password)
    pool.start()
    try:
        deadline = time.monotonic() + timeout_s
        while manager.stats.workers_connected < workers:
            if time.monotonic() > deadline:
                raise TimeoutError(
                    f"only {manager.stats.workers_connected} of {workers} vine_workers connected "
                    f"to DaskVine on port {manager.port} within {timeout_s:.0f} s; "
                    f"see {where / 'workers'}")
            manager.wait(1)
        yield manager
    finally:
        pool.stop()
        # ended now, as its __del__ would (idempotent): it writes its last log into ``where``
        # here, not whenever the collector finds it (at exit, after a caller removed that)
        manager._free()
        del manager


def daskvine_get(manager: Any, mode: str, workers_cores: int = 1) -> Callable[..., Any]:
    """``DaskVine.get`` with a dict graph (it fails on dask >= 2025.4 expressions), in
    ``mode`` 'function-calls' (one library per worker, a slot per core) or 'tasks'."""
    options: dict[str, Any] = {"task_mode": mode, "progress_disable": True}
    if mode == "function-calls":
        options["lib_resources"] = {"cores": workers_cores, "slots": workers_cores}
    else:
        options["resources"] = {"cores": 1}

    def get(dsk: Any, keys: Any) -> Any:
        return manager.get(dict(dsk), keys, **options)

    return get


@contextlib.contextmanager
def distributed_client(workers: int, cores: int) -> Iterator[Any]:
    """A ``distributed.LocalCluster`` of ``workers`` processes x ``cores`` threads, connected."""
    from distributed import Client, LocalCluster

    with LocalCluster(n_workers=workers, threads_per_worker=cores, processes=True,
                      dashboard_address=None, silence_logs=logging.ERROR) as cluster, \
            Client(cluster) as client:
        client.wait_for_workers(workers, timeout=60)
        yield client
