"""Memory caps per task category: the pure policy (no I/O, no clocks, no processes).

A task category is a dask key's function name or a label the user gives. Each category
starts with a cap (``MemoryPolicy.per_category``, else ``default_mb``). Peaks measured on
workers (:mod:`datavine.worker.memcap`) teach :class:`MemoryState` a better cap::

    cap = max(peaks seen) x headroom, rounded up to step_mb, within [floor_mb, ceiling_mb]

Until ``min_samples`` peaks are known the learned cap may raise the initial cap but not
lower it. A task killed for exceeding its cap is retried with a larger one (``growth`` x
the failed cap, or the peak it reached x ``headroom``, whichever is larger); once the cap
was already at the ceiling, or the task is known to need more than the ceiling, the
decision is to give up. Every retry at least multiplies the cap by ``growth``, so a task is
retried at most ``ceil(log(ceiling / floor) / log(growth))`` times.

Caps are the resident memory (MB of 2**20 bytes) of the whole process tree that runs the
task. For bundles run in the library's long-lived child (:mod:`datavine.worker.capped_child`)
that includes the pages the child holds between bundles: those it inherits from the
library (100-300 MB with numpy, awkward and uproot imported) and what its allocator kept,
so ``floor_mb`` should sit above the library's own size.

This module is the only place that decides caps; ``runtime`` asks it and applies the answer.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from types import MappingProxyType

from datavine.errors import ConfigError

AT_CEILING = 1e-9  # relative: a cap this close to the ceiling is at the ceiling


@dataclass(frozen=True)
class MemoryPolicy:
    """Bounds and factors of the memory policy (all sizes in MB).

    Attributes:
        default_mb: initial cap of a category without an entry in ``per_category``.
        ceiling_mb: no cap is ever above this; a task that needs more fails.
        floor_mb: no cap is ever below this (learning from tiny peaks stops here).
        headroom: learned cap = largest peak seen x headroom (>= 1).
        growth: after an overrun the next cap is at least the failed cap x growth (> 1).
        per_category: initial caps given by the user, by category.
        step_mb: caps are rounded up to a multiple of this.
        min_samples: peaks needed before learning may lower a category's cap.
    """

    default_mb: float = 2048.0
    ceiling_mb: float = 8192.0
    floor_mb: float = 512.0
    headroom: float = 1.25
    growth: float = 2.0
    per_category: Mapping[str, float] = field(default_factory=dict)
    step_mb: float = 64.0
    min_samples: int = 3

    def __post_init__(self) -> None:
        # A read-only copy: the caller's dict may change later without changing the policy.
        object.__setattr__(self, "per_category", MappingProxyType(dict(self.per_category)))
        if not 0 < self.floor_mb <= self.ceiling_mb:
            raise ConfigError(f"MemoryPolicy needs 0 < floor_mb <= ceiling_mb, got "
                              f"floor_mb={self.floor_mb}, ceiling_mb={self.ceiling_mb}")
        caps = {"default_mb": self.default_mb} | {
            f"per_category[{name!r}]": mb for name, mb in self.per_category.items()}
        for name, mb in caps.items():
            if not self.floor_mb <= mb <= self.ceiling_mb:
                raise ConfigError(f"MemoryPolicy.{name}={mb} is outside [floor_mb, ceiling_mb] "
                                  f"= [{self.floor_mb}, {self.ceiling_mb}]")
        if not self.headroom >= 1:
            raise ConfigError(f"MemoryPolicy.headroom must be >= 1, got {self.headroom}")
        if not self.growth > 1:
            raise ConfigError(f"MemoryPolicy.growth must be > 1, got {self.growth}")
        if not self.step_mb > 0:
            raise ConfigError(f"MemoryPolicy.step_mb must be > 0, got {self.step_mb}")
        if self.min_samples < 1:
            raise ConfigError(f"MemoryPolicy.min_samples must be >= 1, got {self.min_samples}")

    def clamp(self, mb: float) -> float:
        """Round ``mb`` up to a multiple of ``step_mb`` and bring it within the bounds."""
        rounded = math.ceil(mb / self.step_mb - 1e-9) * self.step_mb
        return min(self.ceiling_mb, max(self.floor_mb, rounded))

    def initial_cap(self, category: str) -> float:
        return self.per_category.get(category, self.default_mb)

    @property
    def max_retries(self) -> int:
        """Most retries one task can get: each multiplies its cap by at least ``growth``."""
        ratio = self.ceiling_mb * (1 - AT_CEILING) / self.floor_mb
        return 0 if ratio <= 1 else math.ceil(math.log(ratio, self.growth))

    def at_ceiling(self, cap_mb: float) -> bool:
        """Whether ``cap_mb`` is the ceiling (up to rounding: a retry there gains nothing)."""
        return cap_mb >= self.ceiling_mb * (1 - AT_CEILING)


@dataclass(frozen=True)
class Retry:
    """Run the task again under ``cap_mb``."""

    cap_mb: float


@dataclass(frozen=True)
class GiveUp:
    """The task cannot run within the ceiling; ``reason`` says why, naming the setting."""

    reason: str


Decision = Retry | GiveUp


@dataclass
class CategoryMemory:
    """What the state has learned about one category."""

    samples: int = 0
    max_peak_mb: float = 0.0
    overruns: int = 0


@dataclass
class MemoryState:
    """Learned peaks per category, and the caps and decisions that follow from them."""

    policy: MemoryPolicy = field(default_factory=MemoryPolicy)
    categories: dict[str, CategoryMemory] = field(default_factory=dict)
    # the workers' column caches (RunConfig.column_cache_share / column_cache_mb, set by each
    # run): a learned cap leaves them their room on top of what the bundles themselves need
    cache_share: float = 0.0
    cache_mb: float | None = None

    def cap_for(self, category: str) -> float:
        """The cap to run the next task of ``category`` under: learned, the largest peak a
        bundle needed for itself (its column cache left out) x ``headroom``, and the column
        cache's room on top: its share of the cap (``cache_share``; the cap is then the need
        / (1 - share)), or ``cache_mb`` where that bounds it. A cap learned from peaks that
        held the cache would squeeze it: caps settle where bundles and cache just fit, and
        each run's cache fills less."""
        return self._cap(category, cache=True)

    def _cap(self, category: str, *, cache: bool) -> float:
        initial = self.policy.clamp(self.policy.initial_cap(category))
        known = self.categories.get(category)
        if known is None or known.samples == 0:
            return initial
        need = known.max_peak_mb * self.policy.headroom
        learned = self.policy.clamp(need + (self.cache_room(need) if cache else 0.0))
        return learned if known.samples >= self.policy.min_samples else max(initial, learned)

    def cache_room(self, need_mb: float) -> float:
        """The column cache's room (MB) above a bundle's own ``need_mb``."""
        if not 0 < self.cache_share < 1:
            return 0.0
        share = need_mb * self.cache_share / (1 - self.cache_share)
        return share if self.cache_mb is None else min(share, self.cache_mb)

    def dominant_category(self, categories: Iterable[str]) -> str:
        """The category with the largest cap: a bundle of tasks runs under its cap, and
        the bundle's peak and overruns are recorded against it."""
        names = set(categories)
        if len(names) == 1:  # most bundles: one category
            return names.pop()
        if not names:
            raise ValueError("dominant_category needs at least one category")
        return max(sorted(names), key=self.cap_for)

    def record_peak(self, category: str, peak_mb: float, cache_mb: float = 0.0) -> None:
        """Learn from a task of ``category`` that finished with this peak, of which
        ``cache_mb`` was its process's column cache (not the task's own need)."""
        own = _check_mb("peak_mb", peak_mb) - _check_mb("cache_mb", cache_mb)
        self._observe(category, max(own, 0.0))

    def after_overrun(self, category: str, cap_mb: float, peak_mb: float) -> Decision:
        """A task of ``category`` was killed under ``cap_mb`` having reached ``peak_mb``."""
        cap_mb = _check_mb("cap_mb", cap_mb)
        needed = max(cap_mb, _check_mb("peak_mb", peak_mb))  # it needed at least this much
        self._observe(category, needed)
        self.categories[category].overruns += 1
        policy = self.policy
        if needed > policy.ceiling_mb:
            return GiveUp(f"a task of category {category!r} reached {needed:.0f} MB, over the "
                          f"ceiling of {policy.ceiling_mb:.0f} MB (MemoryPolicy.ceiling_mb)")
        if policy.at_ceiling(cap_mb):
            return GiveUp(f"a task of category {category!r} exceeded a cap of {cap_mb:.0f} MB, "
                          f"already at the ceiling (MemoryPolicy.ceiling_mb)")
        # the retry runs in a fresh process, its cache empty: no room for one on top
        wanted = max(cap_mb * policy.growth, needed * policy.headroom,
                     self._cap(category, cache=False))
        return Retry(policy.clamp(wanted))

    def as_dict(self) -> dict[str, dict[str, float]]:
        """Per category: samples, largest peak, overruns and the current cap (for reports)."""
        return {name: {"samples": c.samples, "max_peak_mb": c.max_peak_mb,
                       "overruns": c.overruns, "cap_mb": self.cap_for(name)}
                for name, c in sorted(self.categories.items())}

    def _observe(self, category: str, peak_mb: float) -> None:
        known = self.categories.setdefault(category, CategoryMemory())
        known.samples += 1
        known.max_peak_mb = max(known.max_peak_mb, peak_mb)


def _check_mb(name: str, mb: float) -> float:
    if not (math.isfinite(mb) and mb >= 0):
        raise ValueError(f"{name} must be a finite number of MB >= 0, got {mb!r}")
    return float(mb)
