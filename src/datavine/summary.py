"""What a run did: counts and times gathered by the runtime, shown at the end of a run."""

from __future__ import annotations

from collections import defaultdict
from dataclasses import asdict, dataclass, field
from typing import Any


@dataclass
class CategoryStats:
    """Per task category: how many ran, their time, and the memory seen."""

    tasks: int = 0
    seconds: float = 0.0
    peak_mb: float = 0.0
    cap_mb: float | None = None
    overruns: int = 0


@dataclass
class RunSummary:
    """Figures for one ``get`` call."""

    tasks: int = 0
    bundles: int = 0
    retries: int = 0
    failures: list[str] = field(default_factory=list)
    wall_s: float = 0.0
    workers: int = 0
    categories: dict[str, CategoryStats] = field(default_factory=lambda: defaultdict(CategoryStats))
    hosts: dict[str, int] = field(default_factory=lambda: defaultdict(int))

    @property
    def tasks_per_s(self) -> float:
        return self.tasks / self.wall_s if self.wall_s > 0 else 0.0

    def to_dict(self) -> dict[str, Any]:
        data = asdict(self)
        data["categories"] = {k: asdict(v) for k, v in self.categories.items()}
        data["hosts"] = dict(self.hosts)
        data["tasks_per_s"] = self.tasks_per_s
        return data

    def lines(self) -> list[str]:
        out = [
            f"datavine: {self.tasks} tasks in {self.bundles} bundles on {self.workers} workers, "
            f"{self.wall_s:.2f} s ({self.tasks_per_s:,.0f} tasks/s), {self.retries} retries"
        ]
        for name, cat in sorted(self.categories.items(), key=lambda kv: -kv[1].seconds)[:8]:
            cap = f", cap {cat.cap_mb:.0f} MB" if cat.cap_mb else ""
            over = f", {cat.overruns} over cap" if cat.overruns else ""
            out.append(f"  {name:<32} {cat.tasks:>7} tasks {cat.seconds:8.2f} s "
                       f"peak {cat.peak_mb:6.0f} MB{cap}{over}")
        out.extend(f"  failure: {f}" for f in self.failures[:10])
        return out
