"""The scale test's timeline as a PNG: workers, data rate (Gbps), event rate (kHz) and the
column cache.

Four panels over the processing time: as the 200 Gbps challenge plotted its runs, workers
connected (and busy), data rate read (Gbps) and event rate (kHz), with the run's averages
as dashed lines; then the decoded bytes per second served from the workers' column caches
and decoded from the files (stacked), with each pass's hit fraction (passes overlap: a
chunk's next read starts when its previous one is done). matplotlib runs with the Agg
backend (no display needed).
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING

from datavine.apps.scaletest.report import ScaleReport

if TYPE_CHECKING:
    from matplotlib.axes import Axes

MAX_PASSES_SHOWN = 12


def plot_timeline(report: ScaleReport, path: str | Path, title: str | None = None) -> Path:
    """Write the timeline of ``report`` to ``path`` (PNG); returns the path."""
    try:
        import matplotlib
    except ImportError as exc:
        raise RuntimeError("the timeline PNG needs matplotlib: .venv/bin/pip install "
                           "'datavine[analysis]'") from exc
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    tl = report.timeline
    edges = [*tl.t, (tl.t[-1] if tl.t else 0.0) + tl.dt]
    fig, axes = plt.subplots(4, 1, figsize=(9, 9.5), sharex=True, constrained_layout=True)
    workers, data, events, columns = axes
    workers.stairs(tl.workers, edges, color="tab:gray", label="connected")
    workers.stairs(tl.busy_workers, edges, color="tab:blue", fill=True, alpha=0.35,
                   label="busy (average over the bin)")
    workers.set_ylabel("workers")
    workers.set_ylim(0, max([*tl.workers, *tl.busy_workers, 1]) * 1.2)
    workers.legend(loc="lower right", fontsize=8)
    _rate(data, edges, tl.gbps, report.gbps, "data rate [Gbps]", "tab:orange", "Gbps")
    _rate(events, edges, tl.khz, report.khz, "event rate [kHz]", "tab:green", "kHz")
    _cache(columns, edges, report)
    columns.set_xlabel("time since processing started [s]")
    columns.set_xlim(0, max(report.wall_s, tl.dt))
    fig.suptitle(title or _title(report), fontsize=10)
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path


def _rate(ax: Axes, edges: list[float], values: list[float], mean: float, label: str,
          color: str, unit: str) -> None:
    ax.stairs(values, edges, color=color, fill=True, alpha=0.35)
    ax.stairs(values, edges, color=color)
    shown = f"{mean:,.0f}" if mean >= 100 else f"{mean:.3g}"
    ax.axhline(mean, color=color, linestyle="--", linewidth=1, label=f"mean {shown} {unit}")
    ax.set_ylabel(label)
    ax.set_ylim(bottom=0)
    ax.legend(loc="lower right", fontsize=8)


def _cache(ax: Axes, edges: list[float], report: ScaleReport) -> None:
    """Decoded GB/s from the workers' memory (below) and from the files (above it)."""
    tl = report.timeline
    total = [c + d for c, d in zip(tl.cached_gbs, tl.decoded_gbs, strict=True)]
    ax.stairs(total, edges, color="tab:red", fill=True, alpha=0.3, label="decoded from files")
    ax.stairs(tl.cached_gbs, edges, color="tab:purple", fill=True, alpha=0.5,
              label="from workers' memory")
    ax.set_ylabel("decoded columns [GB/s]")
    ax.set_ylim(0, max([*total, 1e-3]) * 1.3)
    shown = [f"{p.hit_fraction:.0%}" for p in report.passes[:MAX_PASSES_SHOWN]]
    more = ", ..." if len(report.passes) > MAX_PASSES_SHOWN else ""
    ax.text(0.01, 0.95, f"from memory, by pass: {', '.join(shown)}{more}",
            transform=ax.transAxes, fontsize=8, va="top")
    ax.legend(loc="lower right", fontsize=8)


def _title(report: ScaleReport) -> str:
    return (f"{report.events:,} events, {report.files_processed}/{report.files} files, "
            f"{report.wall_s:.1f} s on {report.workers} workers ({report.cores} cores): "
            f"{report.gbps:.3f} Gbps, {report.khz:,.0f} kHz "
            f"({report.khz_per_core:,.0f} kHz/core), peak {report.peak_memory_mb:,.0f} MB\n"
            f"{report.hit_fraction:.0%} of the decoded columns from the workers' memory")
