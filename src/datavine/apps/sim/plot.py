"""One picture of simulated runs side by side: data rate, inter-rack link use, files done."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

from datavine.apps.sim.results import SimResult

COLOURS = ("#c0392b", "#1f77b4", "#2ca02c", "#9467bd")


def plot_runs(runs: Sequence[tuple[str, SimResult]], path: str | Path, title: str,
              goal_gbps: float | None = 200.0, link_gbps: float | None = None) -> Path:
    """Three panels sharing simulated time: Gbps delivered to the cores, the busiest
    inter-rack link's utilisation, and the fraction of files done (the tail shaded)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, (rate, link, done) = plt.subplots(3, 1, figsize=(10, 9), sharex=True,
                                           gridspec_kw={"height_ratios": [3, 2, 2]})
    for (label, r), colour in zip(runs, COLOURS, strict=False):
        rate.plot(r.t, r.gbps, color=colour, lw=1.4,
                  label=f"{label}: {r.gbps_sustained:.0f} Gbps sustained, "
                        f"{100 * r.near_fraction:.0f}% near bytes")
        link.plot(r.t, [100 * u for u in r.link_util], color=colour, lw=1.4,
                  label=f"{label}: {100 * r.link_utilisation:.0f}% mean")
        n = len(r.file_done_s)
        if n:
            frac = [(i + 1) / n for i in range(n)]
            done.plot(r.file_done_s, frac, color=colour, lw=1.4,
                      label=f"{label}: done at {r.wall_s:.0f} s, last 5% took {r.tail_s:.0f} s")
            start = r.file_done_s[max(int(0.95 * n) - 1, 0)]
            done.axvspan(start, r.file_done_s[-1], color=colour, alpha=0.12)
    if goal_gbps:
        rate.axhline(goal_gbps, color="grey", ls="--", lw=1)
        rate.text(0, goal_gbps, f" goal {goal_gbps:.0f} Gbps", va="bottom", color="grey")
    rate.set_ylabel("Gbps read by the cores")
    rate.set_ylim(bottom=0)
    rate.legend(loc="lower center", fontsize=9)
    link.axhline(80, color="grey", ls="--", lw=1)
    link.text(0, 80, " 80%", va="bottom", color="grey")
    link.set_ylabel("inter-rack link, % busy" + (f"\n({link_gbps:.0f} Gbps)" if link_gbps
                                                  else ""))
    link.set_ylim(-3, 105)
    link.legend(loc="center right", fontsize=9)
    done.set_ylabel("files done (fraction)")
    done.set_xlabel("simulated seconds")
    done.set_ylim(0, 1.02)
    done.legend(loc="lower right", fontsize=9)
    for ax in (rate, link, done):
        ax.grid(alpha=0.3)
    fig.suptitle(title, fontsize=11)
    fig.tight_layout()
    out = Path(path)
    out.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(out, dpi=110)
    plt.close(fig)
    return out
