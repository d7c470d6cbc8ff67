"""The facility model's inputs, measured: real datavine runs on loopback, reduced to figures.

:func:`calibrate` runs ``datavine run --json`` (the AGC-style analysis on local TaskVine
workers, read through the loopback XCache testbed, whose caches start cold), once with
``LocalCluster``'s workers (their libraries started before the run's clock) and once with a
local pool's (``datavine pool start --batch local``: the libraries start inside the run, as
on a facility), and keeps what the model needs from the JSON records
(:func:`calibration_from_record`, pure):

- ``cpu_s_per_event``: core-seconds per event: a steady chunk's time (the time the workers
  measured, or the time between two chunks ending on one worker where that is shorter: the
  first chunk of a worker also pays for its imports), times each worker's share of the
  machine's cores (``min(1, host_cores / workers)``). The XRootD servers and the manager
  ran on the same cores, so their share of the work is in it.
- ``bytes_per_event``: bytes the analysis read per event (datavine's own read accounting,
  the figure the box compares with the kernel's); ``file_bytes_per_event``: file size.
- ``manager_s_per_bundle``: wall time between two bundles on one worker beyond the chunk's
  own work (the manager's round trip).
- ``library_start_s``: core-seconds for a worker to connect and start its library (the
  cluster start of the run, ``LocalCluster`` starting its libraries before the clock);
  ``first_call_s``: core-seconds a worker's first bundle takes beyond a steady one (the
  analysis' imports, its first connections); ``library_wait_s``: in the pool run, the rest
  of the time before a worker's first bundle ends (beyond a steady bundle, the library's
  start and the first call's): wall time that uses no core (TaskVine's handshake with a
  starting library; the manager waits in whole seconds). 0 when no pool run was made.
- ``merge_s``, ``peak_mb``: a merge's time and a chunk's memory peak.

Several runs combine by the median of each figure (:func:`combine`). A calibration is saved
as JSON (:func:`save_calibration`, :func:`load_calibration`); the model never measures.
"""

from __future__ import annotations

import json
import os
import secrets
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from collections import defaultdict
from collections.abc import Mapping, Sequence
from dataclasses import MISSING, asdict, dataclass, fields
from pathlib import Path
from typing import Any

CHUNK, MERGE = "agc-chunk", "agc-merge"


class CalibrationError(ValueError):
    """A run record or a calibration file the model cannot use; the message says why."""


@dataclass(frozen=True)
class Calibration:
    """What one kind of run costs on this machine (see the module docstring for each)."""

    compression: str
    events_per_file: int
    cpu_s_per_event: float
    bytes_per_event: float
    file_bytes_per_event: float
    manager_s_per_bundle: float
    library_start_s: float
    first_call_s: float
    library_wait_s: float
    merge_s: float
    peak_mb: float
    host_cores: int
    workers: int
    reading: str  # "xcache-testbed" (reads through XRootD) or "local"
    runs: int = 1
    measured_at: str = ""  # UTC, ISO 8601
    wall_s: float = 0.0  # the calibration run's own time (median)

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> Calibration:
        names = {f.name for f in fields(cls)}
        missing = sorted(f.name for f in fields(cls)
                         if f.name not in data and f.default is MISSING)
        if missing:
            raise CalibrationError(f"calibration lacks {', '.join(missing)}")
        return cls(**{k: v for k, v in data.items() if k in names})


def calibration_from_record(record: Mapping[str, Any], host_cores: int,
                            pool_record: Mapping[str, Any] | None = None) -> Calibration:
    """The calibration that a ``datavine run --json`` record on ``LocalCluster`` workers
    gives, the run having had ``host_cores`` cores, with ``library_wait_s`` from the record
    of the same run on pool workers when there is one (pure)."""
    local = _figures(record, host_cores)
    if pool_record is None:
        return local
    pool = _figures(pool_record, host_cores)
    share = min(1.0, host_cores / pool.workers)
    first = pool.first_call_s / share  # wall, beyond a steady bundle, in the pool run
    busy = (local.library_start_s + local.first_call_s) / share
    return Calibration(**{**local.to_dict(), "library_wait_s": max(first - busy, 0.0)})


def _figures(record: Mapping[str, Any], host_cores: int) -> Calibration:
    """One record's figures (``library_wait_s`` 0)."""
    summary = record.get("summary") or {}
    categories = summary.get("categories") or {}
    chunk = categories.get(CHUNK)
    if not chunk or not chunk.get("tasks"):
        raise CalibrationError(f"the run record has no {CHUNK!r} tasks in its summary")
    data = record.get("data") or {}
    events, chunks = int(record.get("events", 0)), int(chunk["tasks"])
    if events <= 0:
        raise CalibrationError("the run record counts no events")
    if int(data.get("chunk_events", 0)) < int(data.get("events_per_file", 1)):
        raise CalibrationError("the run split files into several chunks: calibrate with "
                               "--chunk-events >= --events (one chunk per file)")
    workers = int(summary.get("workers") or (record.get("cluster") or {}).get("workers") or 1)
    share = min(1.0, host_cores / workers)
    chunk_s = float(chunk["seconds"]) / chunks
    interval, first = _cycles(summary.get("completions") or [])
    cycle = interval or chunk_s  # a steady bundle, end to end, on one worker
    reads = summary.get("reads") or {}
    read = int(reads.get("near_bytes", 0)) + int(reads.get("far_bytes", 0))
    read = read or int(record.get("bytes_read", 0))
    merge = categories.get(MERGE) or {}
    files = int(data.get("files", chunks)) * int(data.get("events_per_file", events // chunks))
    return Calibration(
        compression=str(data.get("compression", "")),
        events_per_file=int(data.get("events_per_file", events // chunks)),
        cpu_s_per_event=min(chunk_s, cycle) * share / (events / chunks),
        bytes_per_event=read / events,
        file_bytes_per_event=int(data.get("bytes", 0)) / max(files, 1),
        manager_s_per_bundle=max(cycle - chunk_s, 0.0),
        library_start_s=float((record.get("setup_s") or {}).get("cluster", 0.0)) * share,
        first_call_s=max(first - cycle, 0.0) * share if first else 0.0,
        library_wait_s=0.0,
        merge_s=float(merge.get("seconds", 0.0)) / max(int(merge.get("tasks", 0)), 1),
        peak_mb=float(chunk.get("peak_mb", 0.0)),
        host_cores=host_cores, workers=workers,
        reading=str((record.get("reading") or {}).get("mode", "unknown")),
        wall_s=float(record.get("wall_s", 0.0)))


def _cycles(completions: Sequence[Sequence[Any]]) -> tuple[float | None, float | None]:
    """(mean time between two chunks ending on one worker, mean time of a worker's first
    chunk ending): from the summary's (seconds since start, key, worker) completions."""
    by_worker: dict[str, list[float]] = defaultdict(list)
    for t, key, worker in completions:
        if str(key).startswith(CHUNK):
            by_worker[str(worker)].append(float(t))
    if not by_worker:
        return None, None
    spans = [(max(ts) - min(ts), len(ts) - 1) for ts in by_worker.values() if len(ts) > 1]
    gaps = sum(n for _, n in spans)
    interval = sum(s for s, _ in spans) / gaps if gaps else None
    first = statistics.fmean(min(ts) for ts in by_worker.values())
    return interval, first


def combine(calibrations: Sequence[Calibration]) -> Calibration:
    """One calibration from several runs of the same kind: the median of each figure."""
    if not calibrations:
        raise CalibrationError("no calibration runs to combine")
    first = calibrations[0]
    kinds = {(c.compression, c.events_per_file, c.host_cores, c.workers, c.reading)
             for c in calibrations}
    if len(kinds) > 1:
        raise CalibrationError(f"calibration runs of different kinds: {sorted(kinds)}")
    out: dict[str, Any] = first.to_dict()
    for f in fields(Calibration):
        if f.type in ("float", float):
            out[f.name] = statistics.median(getattr(c, f.name) for c in calibrations)
    out["runs"] = sum(c.runs for c in calibrations)
    return Calibration(**out)


def save_calibration(calibration: Calibration, path: str | os.PathLike[str]) -> Path:
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(calibration.to_dict(), indent=2) + "\n")
    return path


def load_calibration(path: str | os.PathLike[str]) -> Calibration | None:
    """The calibration saved at ``path``; None when there is none. A file that is not one
    raises :class:`CalibrationError` naming it."""
    path = Path(path)
    if not path.is_file():
        return None
    try:
        return Calibration.from_dict(json.loads(path.read_text()))
    except (ValueError, TypeError) as exc:
        raise CalibrationError(f"{path}: not a facility model calibration: {exc}") from exc


def datavine_command() -> list[str]:
    """The ``datavine`` command of this Python environment."""
    exe = Path(sys.executable).parent / "datavine"
    return [str(exe)] if exe.is_file() else [sys.executable, "-m", "datavine.apps.cli"]


def calibrate(files: int = 16, events: int = 100_000, compression: str = "zstd", *,
              workers: int | None = None, repeats: int = 3, pool: bool = True,
              data: Path | None = None, timeout_s: float = 600.0,
              echo: bool = True) -> Calibration:
    """Run ``datavine run --json`` ``repeats`` times on loopback (the XCache testbed, cold
    caches) on ``LocalCluster`` workers and, with ``pool``, as often on a local pool's, and
    combine the records. ``workers``: 1-core workers (default: one per core here, as
    ``datavine run`` has)."""
    host_cores = os.cpu_count() or 1
    n = workers or host_cores
    runs = []
    with tempfile.TemporaryDirectory(prefix="datavine-calibrate-") as tmp:
        for i in range(repeats):
            argv = ["run", "--files", str(files), "--events", str(events), "--chunk-events",
                    str(events), "--compression", compression, "--no-progress"]
            if data is not None:
                argv += ["--data", str(data)]
            record = _run_record([*argv, "--workers", str(n)], Path(tmp) / f"local-{i}.json",
                                 timeout_s)
            pool_record = (_pool_record(argv, n, Path(tmp), i, timeout_s) if pool else None)
            calibration = calibration_from_record(record, host_cores, pool_record)
            if echo:
                print(f"# calibration {i + 1}/{repeats}: {record['wall_s']:.2f} s on local "
                      f"workers" + (f", {pool_record['wall_s']:.2f} s on a pool's"
                                    if pool_record else "")
                      + f": {calibration.cpu_s_per_event * 1e6:.2f} core-us/event, library "
                      f"{calibration.library_start_s:.2f} core-s + {calibration.library_wait_s:.2f}"
                      f" s, first call {calibration.first_call_s:.2f} core-s, reading "
                      f"{calibration.reading}", file=sys.stderr, flush=True)
            runs.append(calibration)
    combined = combine(runs)
    stamp = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())
    return Calibration(**{**combined.to_dict(), "measured_at": stamp})


def _run_record(argv: list[str], out: Path, timeout_s: float) -> dict[str, Any]:
    """``datavine <argv> --json out``: its record, or CalibrationError with its output."""
    done = subprocess.run([*datavine_command(), *argv, "--json", str(out)], capture_output=True,
                          text=True, timeout=timeout_s, check=False)
    if done.returncode != 0 or not out.is_file():
        raise CalibrationError(f"the calibration run failed (exit {done.returncode}): "
                               f"{(done.stderr or done.stdout).strip()[-800:]}")
    return dict(json.loads(out.read_text()))


def _pool_record(argv: list[str], workers: int, tmp: Path, i: int,
                 timeout_s: float) -> dict[str, Any]:
    """The same run on a local pool of ``workers`` 1-core workers, started after the run's
    manager and stopped after it: the libraries start inside the run."""
    password = tmp / "vine.password"
    password.write_text(secrets.token_hex(32) + "\n")
    password.chmod(0o600)
    with socket.socket() as sock:  # a free port for the manager
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    out, log = tmp / f"pool-{i}.json", tmp / f"pool-{i}.log"
    common = ["--name", f"calibration-{i}", "--pool-dir", str(tmp / "pools")]
    with log.open("w") as sink:
        run = subprocess.Popen([*datavine_command(), *argv, "--json", str(out),
                                "--pool-workers", str(workers), "--port", str(port),
                                "--password", str(password), "--pool-timeout", "120"],
                               stdout=sink, stderr=subprocess.STDOUT)
        try:
            subprocess.run([*datavine_command(), "pool", "start", "--batch", "local",
                            "--workers", str(workers), "--cores", "1", "--manager",
                            f"localhost:{port}", "--password", str(password), *common],
                           capture_output=True, text=True, timeout=120, check=True)
            run.wait(timeout_s)
        except (subprocess.SubprocessError, OSError) as exc:
            raise CalibrationError(f"the calibration run on a local pool failed: {exc}; "
                                   f"{log.read_text()[-800:]}") from exc
        finally:
            subprocess.run([*datavine_command(), "pool", "stop", *common], capture_output=True,
                           timeout=120, check=False)
            if run.poll() is None:
                run.terminate()
                run.wait(30)
    if run.returncode != 0 or not out.is_file():
        raise CalibrationError(f"the calibration run on a local pool failed (exit "
                               f"{run.returncode}): {log.read_text()[-800:]}")
    return dict(json.loads(out.read_text()))
