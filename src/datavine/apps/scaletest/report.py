"""The scale test's record: the figures the 200 Gbps challenge was judged by, and a timeline.

:func:`build_report` is pure: it turns the files' metadata, the chunk records that came back
from the workers (:class:`~datavine.apps.scaletest.tasks.ChunkRecord`) and the runtime's
:class:`~datavine.scheduler.summary.RunSummary` (when there is one) into a :class:`ScaleReport`:

- ``gbps``: compressed bytes read x 8 / processing wall time / 1e9 (every byte the chunks'
  file handles requested, headers and metadata included; ``branch_bytes`` counts only the
  baskets of the branches the analysis reads);
- ``events_per_s``, ``khz`` and ``khz_per_core`` (per worker core connected);
- ``files_processed`` (every chunk succeeded), ``files_failed`` and ``failed_files`` (names,
  stage, error);
- ``peak_memory_mb`` (largest of any worker) and ``peak_memory_mb_per_worker``;
- the workers' column caches (:mod:`datavine.io.column_cache`): ``cached_bytes`` (decoded
  bytes served from the workers' memory), ``decoded_bytes`` (decoded from the files) and
  ``hit_fraction``, for the run and for each pass over the dataset (``passes``, with each
  pass's time, events and rates: a second pass over the same files on the same workers
  reads from memory);
- ``busy_fraction``: the share of cores x (the first chunk's start to the last one's end)
  that chunks ran, and where the rest went: ``idle_between_chunks``, in gaps under
  :data:`HANDOFF_S` between one process's chunks (``gaps``, ``gap_median_ms``: the hand-over
  from one call to the next, or from one chunk to the next in a call), and
  ``idle_waiting`` (longer gaps: no chunk to run, held for another worker's cache, a pass's
  end; and the start and the end);
- ``timeline``: per time bin, connected and busy workers, data rate (Gbps), event rate
  (kHz) and the decoded bytes' rates from memory and from the files, each chunk's events
  and bytes spread over the time it ran.

The summary's fields (``samples``, ``worker_peak_mb``) are read with fallbacks to the chunk
records, so that the report does not depend on one version of the runtime.
"""

from __future__ import annotations

import itertools
import json
import math
import statistics
from collections import defaultdict
from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass, field, fields, is_dataclass
from pathlib import Path
from typing import TYPE_CHECKING, NamedTuple, TypedDict

from datavine.apps.jsondata import JSON
from datavine.apps.scaletest.tasks import ChunkRecord, FileInfo, Tally

if TYPE_CHECKING:
    from datavine.scheduler.summary import RunSummary

MAX_BINS = 120
MIN_BIN_S = 0.25
# a process's gap between two chunks shorter than this is the hand-over from one call to the
# next (traced: ~2.4 ms a call on the 2-core VM), not a wait for work
HANDOFF_S = 0.02


class FailedFile(TypedDict):
    """A file the scale test could not open, or some of whose chunks failed."""

    file: str
    stage: str  # "open" or "process"
    error: str
    chunks_failed: int


@dataclass
class Timeline:
    """Per bin of ``dt`` seconds from the start of processing (``t``: bin starts)."""

    dt: float
    t: list[float] = field(default_factory=list)
    workers: list[float] = field(default_factory=list)
    busy_workers: list[float] = field(default_factory=list)
    gbps: list[float] = field(default_factory=list)
    khz: list[float] = field(default_factory=list)
    # decoded bytes per second (GB/s) served from the workers' column caches, and decoded
    # from the files; their share from memory (0 in a bin that decoded nothing)
    cached_gbs: list[float] = field(default_factory=list)
    decoded_gbs: list[float] = field(default_factory=list)
    hit_fraction: list[float] = field(default_factory=list)


@dataclass
class PassFigures:
    """One pass over the dataset: its chunks from the first one's start to the last one's
    end (seconds since processing started), what they read and where their columns came
    from. Passes overlap in time (a chunk's next read starts once its previous one is done,
    :func:`datavine.apps.scaletest.run.analysis_graph`), so a pass's speed is its events
    over the seconds its chunks ran (``khz_per_core``), not over its window."""

    number: int  # from 1
    chunks: int
    chunks_failed: int
    events: int
    start_s: float
    end_s: float
    bytes_read: int
    cached_bytes: int
    decoded_bytes: int
    busy_s: float = 0.0  # the seconds its chunks ran, summed

    @property
    def wall_s(self) -> float:
        return max(0.0, self.end_s - self.start_s)

    @property
    def hit_fraction(self) -> float:
        return hit_fraction(self.cached_bytes, self.decoded_bytes)

    @property
    def khz_per_core(self) -> float:
        """Events per second of a chunk's run, in kHz: one busy core's rate in this pass."""
        return self.events / self.busy_s / 1e3 if self.busy_s > 0 else 0.0

    def to_dict(self) -> dict[str, JSON]:
        return {**asdict(self), "wall_s": round(self.wall_s, 4),
                "hit_fraction": round(self.hit_fraction, 4),
                "khz_per_core": round(self.khz_per_core, 3)}


@dataclass
class ScaleReport:
    """One scale test's figures; ``to_dict`` is the JSON record."""

    files: int
    files_processed: int
    files_failed: int
    failed_files: list[FailedFile]
    chunks: int
    chunks_failed: int
    events: int
    events_expected: int
    events_selected: int
    bytes_read: int
    branch_bytes: int
    wall_s: float
    gbps: float
    events_per_s: float
    khz: float
    khz_per_core: float
    workers: int
    cores: int
    peak_memory_mb: float
    peak_memory_mb_per_worker: dict[str, float]
    timeline: Timeline
    busy_fraction: float = 0.0  # cores busy from the first chunk's start to the last's end
    idle_between_chunks: float = 0.0  # of the same, in a process's gaps under HANDOFF_S
    idle_waiting: float = 0.0  # the rest: longer gaps, the start and the end
    gaps: int = 0  # a process's gaps under HANDOFF_S between two chunks
    gap_median_ms: float = 0.0  # their median
    cached_bytes: int = 0  # decoded bytes served from the workers' column caches
    decoded_bytes: int = 0  # decoded bytes decoded from the files
    hit_fraction: float = 0.0  # cached / (cached + decoded)
    passes: list[PassFigures] = field(default_factory=list)
    histogram: dict[str, list[float]] = field(default_factory=dict)
    setup_s: dict[str, float] = field(default_factory=dict)
    config: dict[str, JSON] = field(default_factory=dict)
    summary: dict[str, JSON] | None = None
    dashboard_html: str | None = None  # the run's view, saved (datavine.dashboard.report)

    def to_dict(self) -> dict[str, JSON]:
        out: dict[str, JSON] = asdict(self)
        out["passes"] = [p.to_dict() for p in self.passes]
        return out

    def write_json(self, path: str | Path) -> Path:
        path = Path(path)
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(json.dumps(self.to_dict(), indent=2, default=str) + "\n")
        return path

    def lines(self) -> list[str]:
        """The figures as a short text report."""
        out = [
            f"scale test: {self.events:,} events from {self.files_processed} of {self.files} "
            f"files ({self.chunks - self.chunks_failed} of {self.chunks} chunks) in "
            f"{self.wall_s:.2f} s on {self.workers} workers / {self.cores} cores",
            f"  data rate   {self.gbps:.3f} Gbps ({self.bytes_read / 1e6:,.1f} MB compressed "
            "read)",
            f"  event rate  {self.khz:,.1f} kHz, {self.khz_per_core:,.1f} kHz per core",
            f"  cores busy  {self.busy_fraction:.1%} of the time from the first chunk's start "
            "to the last one's end",
            f"  cores idle  {self.idle_between_chunks:.1%} between chunks ({self.gaps:,} gaps "
            f"under {HANDOFF_S * 1e3:.0f} ms, median {self.gap_median_ms:.1f} ms), "
            f"{self.idle_waiting:.1%} waiting (for work, at the start and at the end)",
            f"  memory      peak {self.peak_memory_mb:,.0f} MB per worker (largest)",
            f"  files       {self.files_processed} processed, {self.files_failed} failed",
            f"  column cache {self.hit_fraction:.1%} of the decoded bytes from workers' memory "
            f"({self.cached_bytes / 1e6:,.1f} MB from memory, {self.decoded_bytes / 1e6:,.1f} "
            "MB decoded)",
        ]
        if len(self.passes) > 1:
            out.extend(f"    pass {p.number}: {p.hit_fraction:.1%} from memory "
                       f"({p.cached_bytes / 1e6:,.1f} MB; {p.decoded_bytes / 1e6:,.1f} MB "
                       f"decoded from {p.bytes_read / 1e6:,.1f} MB read), "
                       f"{p.khz_per_core:,.1f} kHz per busy core" for p in self.passes)
        out.extend(f"    failed: {f['file']} ({f['stage']}): {f['error'][:160]}"
                   for f in self.failed_files[:10])
        return out

    def figures_line(self) -> str:
        """The headline figures as one ``key=value`` line."""
        return (f"gbps={self.gbps:.4f} events_per_s={self.events_per_s:.0f} "
                f"khz_per_core={self.khz_per_core:.1f} files_processed={self.files_processed} "
                f"files_failed={self.files_failed} peak_memory_mb={self.peak_memory_mb:.0f} "
                f"workers={self.workers} cores={self.cores} wall_s={self.wall_s:.2f} "
                f"busy_fraction={self.busy_fraction:.3f} "
                f"idle_between_chunks={self.idle_between_chunks:.3f} "
                f"gap_median_ms={self.gap_median_ms:.2f} hit_fraction={self.hit_fraction:.3f} "
                f"hit_fraction_by_pass={','.join(f'{p.hit_fraction:.3f}' for p in self.passes)}")


def build_report(infos: Sequence[FileInfo], tally: Tally, *, wall_s: float, t0: float,
                 workers: int, cores: int, summary: RunSummary | None = None,
                 n_chunks: int | None = None,
                 bin_s: float | None = None, passes: int = 1) -> ScaleReport:
    """The report of a run whose processing started at epoch time ``t0`` and took
    ``wall_s``; ``workers`` and ``cores`` are the pool's size during the run; ``passes``:
    how many times the dataset was read."""
    records = tally.records
    failed_files = _failed_files(infos, records)
    bad = {f["file"] for f in failed_files}
    n_chunks = len(records) if n_chunks is None else n_chunks
    events = tally.result.events
    bytes_read = sum(r.bytes_read for r in records if not r.error)
    rate = events / wall_s if wall_s > 0 else 0.0
    per_worker = _peak_per_worker(records, summary)
    cached = sum(r.cached_bytes for r in records if not r.error)
    decoded = sum(r.decoded_bytes for r in records if not r.error)
    busy = busy_fraction(records, cores)
    idle = idle_time(records, cores)
    return ScaleReport(
        files=len(infos), files_processed=sum(1 for i in infos if i.path not in bad),
        files_failed=len(bad), failed_files=failed_files, chunks=n_chunks,
        chunks_failed=sum(1 for r in records if r.error), events=events,
        events_expected=passes * sum(i.entries for i in infos if i.error is None),
        events_selected=tally.result.events_selected, bytes_read=bytes_read,
        branch_bytes=tally.result.bytes_read,
        wall_s=wall_s, gbps=bytes_read * 8 / wall_s / 1e9 if wall_s > 0 else 0.0,
        events_per_s=rate, khz=rate / 1e3, khz_per_core=rate / 1e3 / max(1, cores),
        workers=workers, cores=cores,
        peak_memory_mb=max(per_worker.values(), default=0.0),
        peak_memory_mb_per_worker=per_worker,
        timeline=build_timeline(records, t0=t0, wall_s=wall_s, summary=summary, bin_s=bin_s,
                                workers=workers),
        busy_fraction=busy, idle_between_chunks=idle.between_chunks,
        idle_waiting=max(0.0, 1.0 - busy - idle.between_chunks) if records else 0.0,
        gaps=idle.gaps, gap_median_ms=idle.gap_median_ms,
        cached_bytes=cached, decoded_bytes=decoded, hit_fraction=hit_fraction(cached, decoded),
        passes=pass_figures(records, t0=t0, passes=passes),
        histogram={"edges": tally.result.edges.tolist(),
                   "counts": tally.result.counts.tolist()},
        summary=_summary_dict(summary))


def hit_fraction(cached: int | float, decoded: int | float) -> float:
    """The share of the decoded bytes that came from the column caches (0 with none)."""
    total = cached + decoded
    return cached / total if total > 0 else 0.0


def pass_figures(records: Sequence[ChunkRecord], *, t0: float,
                 passes: int = 1) -> list[PassFigures]:
    """Each pass's figures from its chunks' records (pure; ``passes`` at least, more when
    the records name more). A chunk's reads count in its passes in the order they ran
    (:func:`passes_in_read_order`)."""
    by_pass: dict[int, list[ChunkRecord]] = defaultdict(list)
    for r, p in zip(records, passes_in_read_order(records), strict=True):
        by_pass[p].append(r)
    out = []
    for i in range(max(passes, max(by_pass, default=-1) + 1)):
        rs = by_pass.get(i, [])
        good = [r for r in rs if not r.error]
        out.append(PassFigures(
            number=i + 1, chunks=len(rs), chunks_failed=len(rs) - len(good),
            events=sum(r.events for r in good),
            start_s=round(min((r.t_start for r in rs), default=t0) - t0, 4),
            end_s=round(max((r.t_end for r in rs), default=t0) - t0, 4),
            bytes_read=sum(r.bytes_read for r in good),
            cached_bytes=sum(r.cached_bytes for r in good),
            decoded_bytes=sum(r.decoded_bytes for r in good),
            busy_s=round(sum(max(0.0, r.t_end - r.t_start) for r in good), 4)))
    return out


def passes_in_read_order(records: Sequence[ChunkRecord]) -> list[int]:
    """The pass each record counts in (pure): a chunk's reads (same file, same entries) take
    the passes they were tasks of in the order they started, the first read the first
    pass. The passes' tasks are all ready from the start, and only their priority orders
    them: a chunk of a pass's end may be held for a worker while the same chunk of the
    next pass runs there first (delay scheduling). Counted as labelled, such a chunk's
    first pass read from memory what its second pass had decoded."""
    reads: dict[tuple[str, int, int], list[int]] = defaultdict(list)
    for i, r in enumerate(records):
        reads[(r.path, r.entry_start, r.entry_stop)].append(i)
    out = [r.pass_index for r in records]
    for same in reads.values():
        if len(same) > 1:
            labels = sorted(records[i].pass_index for i in same)
            by_start = sorted(same, key=lambda i: (records[i].t_start, records[i].pass_index))
            for i, label in zip(by_start, labels, strict=True):
                out[i] = label
    return out


def busy_fraction(records: Sequence[ChunkRecord], cores: int) -> float:
    """The share of ``cores`` x (the first chunk's start to the last chunk's end) that chunks
    ran (pure): 1.0 means no core idled between chunks, nor at a pass's end."""
    spans, window = _spans(records)
    if not spans or cores <= 0:
        return 0.0
    return min(1.0, sum(e - s for _, s, e in spans) / (cores * window)) if window > 0 else 1.0


def _spans(records: Sequence[ChunkRecord]) -> tuple[list[tuple[str, float, float]], float]:
    """Each chunk's (process, start, end), and the window from the first start to the last
    end (0 without chunks)."""
    spans = [(r.worker, r.t_start, r.t_end) for r in records if r.t_end >= r.t_start]
    if not spans:
        return spans, 0.0
    return spans, max(e for _, _, e in spans) - min(s for _, s, _ in spans)


class IdleTime(NamedTuple):
    """The share of cores x the chunks' window spent in short gaps between one process's
    chunks (under :data:`HANDOFF_S`), how many there were and their median (ms)."""

    between_chunks: float
    gaps: int
    gap_median_ms: float


def idle_time(records: Sequence[ChunkRecord], cores: int) -> IdleTime:
    """Where the cores idled between chunks (pure): each process's chunks in the order they
    started, the gaps between one's end and the next one's start that are shorter than
    :data:`HANDOFF_S` (a longer gap is a wait for work). A process is a record's ``worker``
    (host and PID): a capped child replaced in the run is a process of its own."""
    spans, window = _spans(records)
    if not spans or cores <= 0:
        return IdleTime(0.0, 0, 0.0)
    by_process: dict[str, list[tuple[float, float]]] = defaultdict(list)
    for worker, start, end in spans:
        by_process[worker].append((start, end))
    gaps: list[float] = []
    for runs in by_process.values():
        runs.sort()
        gaps.extend(g for (_, end), (start, _) in itertools.pairwise(runs)
                    if 0 <= (g := start - end) < HANDOFF_S)
    share = sum(gaps) / (cores * window) if window > 0 else 0.0
    return IdleTime(min(1.0, share), len(gaps),
                    statistics.median(gaps) * 1e3 if gaps else 0.0)


def build_timeline(records: Sequence[ChunkRecord], *, t0: float, wall_s: float,
                   summary: RunSummary | None = None, bin_s: float | None = None,
                   workers: int | None = None) -> Timeline:
    """Rates per time bin; each record's events and bytes spread evenly over its run time.
    Connected workers come from the runtime's samples, else ``workers`` throughout."""
    dt = bin_s if bin_s else max(MIN_BIN_S, wall_s / MAX_BINS)
    n = max(1, math.ceil(wall_s / dt)) if wall_s > 0 else 1
    events, nbytes, busy = [0.0] * n, [0.0] * n, [0.0] * n
    cached, decoded = [0.0] * n, [0.0] * n
    for r in records:
        start = min(max(r.t_start - t0, 0.0), n * dt)
        end = min(max(r.t_end - t0, start), n * dt)
        for b, overlap, share in _spread(start, end, dt, n):
            if not r.error:
                events[b] += r.events * share
                nbytes[b] += r.bytes_read * share
                cached[b] += r.cached_bytes * share
                decoded[b] += r.decoded_bytes * share
            busy[b] += overlap / dt
    t = [round(b * dt, 4) for b in range(n)]
    connected = _connected_workers(summary, t, dt) or (
        [float(workers)] * n if workers is not None else [round(x, 3) for x in busy])
    return Timeline(dt, t, connected, [round(x, 3) for x in busy],
                    [round(x * 8 / dt / 1e9, 6) for x in nbytes],
                    [round(x / dt / 1e3, 3) for x in events],
                    [round(x / dt / 1e9, 6) for x in cached],
                    [round(x / dt / 1e9, 6) for x in decoded],
                    [round(hit_fraction(c, d), 4) for c, d in zip(cached, decoded, strict=True)])


def _spread(start: float, end: float, dt: float,
            n: int) -> list[tuple[int, float, float]]:
    """(bin, seconds of [start, end] in it, share of the interval in it) for each bin the
    interval touches; an instant goes whole into its bin."""
    first, last = min(n - 1, int(start // dt)), min(n - 1, int(end // dt))
    span = end - start
    if span <= 1e-9:
        return [(first, 0.0, 1.0)]
    out = []
    for b in range(first, last + 1):
        overlap = min(end, (b + 1) * dt) - max(start, b * dt)
        if overlap > 0:
            out.append((b, overlap, overlap / span))
    return out


def _connected_workers(summary: RunSummary | None, t: list[float],
                       dt: float) -> list[float] | None:
    """Workers connected at each bin's middle, from the runtime's samples (seconds since
    the run started, workers, cores), or None when there are none."""
    samples = sorted(getattr(summary, "samples", None) or [])
    if not samples:
        return None
    out, i, current = [], 0, float(samples[0][1])
    for start in t:
        middle = start + dt / 2
        while i < len(samples) and samples[i][0] <= middle:
            current = float(samples[i][1])
            i += 1
        out.append(current)
    return out


def _failed_files(infos: Sequence[FileInfo],
                  records: Sequence[ChunkRecord]) -> list[FailedFile]:
    out: list[FailedFile] = [
        {"file": i.path, "stage": "open", "error": i.error, "chunks_failed": 0}
        for i in infos if i.error is not None]
    by_file: dict[str, list[ChunkRecord]] = defaultdict(list)
    for r in records:
        if r.error:
            by_file[r.path].append(r)
    out.extend({"file": path, "stage": "process", "error": rs[0].error or "",
                "chunks_failed": len(rs)} for path, rs in by_file.items())
    return out


def _peak_per_worker(records: Sequence[ChunkRecord],
                     summary: RunSummary | None) -> dict[str, float]:
    """Peak memory per worker: the runtime's figures when it has them, else the records'."""
    from_runtime = getattr(summary, "worker_peak_mb", None)
    if from_runtime:
        return {str(k): round(float(v), 1) for k, v in from_runtime.items()}
    peaks: dict[str, float] = {}
    for r in records:
        peaks[r.worker] = round(max(peaks.get(r.worker, 0.0), r.peak_mb), 1)
    return peaks


def _summary_dict(summary: RunSummary | None) -> dict[str, JSON] | None:
    """The run summary as JSON-ready data, without the per-task completions (the timeline
    says it better)."""
    if summary is None:
        return None
    data = _jsonable(summary)
    if not isinstance(data, dict):
        return None
    data.pop("completions", None)
    return data


def _jsonable(value: object, depth: int = 0) -> JSON:
    if depth > 6:
        return str(value)
    if is_dataclass(value) and not isinstance(value, type):
        return {f.name: _jsonable(getattr(value, f.name), depth + 1) for f in fields(value)}
    if isinstance(value, Mapping):
        return {str(k): _jsonable(v, depth + 1) for k, v in value.items()}
    if isinstance(value, (list, tuple, set, frozenset)):
        return [_jsonable(v, depth + 1) for v in value]
    if value is None or isinstance(value, (bool, int, float, str)):
        return value
    return str(value)
