"""The scale test's timeline as a PNG: workers, data rate (Gbps) and event rate (kHz).

Three panels over the processing time, as the 200 Gbps challenge plotted its runs: workers
connected (and busy), data rate read (Gbps) and event rate (kHz), with the run's averages
as dashed lines. matplotlib runs with the Agg backend (no display needed).
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING

from datavine.apps.scaletest.report import ScaleReport

if TYPE_CHECKING:
    from matplotlib.axes import Axes


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
    fig, axes = plt.subplots(3, 1, figsize=(9, 7.5), sharex=True, constrained_layout=True)
    workers, data, events = axes
    workers.stairs(tl.workers, edges, color="tab:gray", label="connected")
    workers.stairs(tl.busy_workers, edges, color="tab:blue", fill=True, alpha=0.35,
                   label="busy (average over the bin)")
    workers.set_ylabel("workers")
    workers.set_ylim(0, max([*tl.workers, *tl.busy_workers, 1]) * 1.2)
    workers.legend(loc="lower right", fontsize=8)
    _rate(data, edges, tl.gbps, report.gbps, "data rate [Gbps]", "tab:orange", "Gbps")
    _rate(events, edges, tl.khz, report.khz, "event rate [kHz]", "tab:green", "kHz")
    events.set_xlabel("time since processing started [s]")
    events.set_xlim(0, max(report.wall_s, tl.dt))
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


def _title(report: ScaleReport) -> str:
    return (f"{report.events:,} events, {report.files_processed}/{report.files} files, "
            f"{report.wall_s:.1f} s on {report.workers} workers ({report.cores} cores): "
            f"{report.gbps:.3f} Gbps, {report.khz:,.0f} kHz "
            f"({report.khz_per_core:,.0f} kHz/core), peak {report.peak_memory_mb:,.0f} MB")
