"""Pure decisions: which XCache shard is slow enough that its files are better read through
the next shard in line.

A shard can serve every read and still be the run's straggler: a saturated or throttled
link, a failing disk. Backup copies (:mod:`datavine.scheduler.speculation`) rescue a call
that runs late, but a slow shard makes *every* call reading its files slow, and the expected
time of their category is learned from those same slow calls. So the pace is compared
between shards, within a category: the bundles of one category that read through a shard
took, in the median, ``factor`` times or more what the same category's bundles took through
the other shards, and ``min_excess_s`` more at least (each side at least ``min_samples``
bundles): a cold cache against a warm one, or bundles of milliseconds, are no straggler. A
call still running through a shard counts once it has run longer than that: the slow
shard's calls end last, and waiting for them would notice it only at the run's end.

A shard found slow is read around for ``hold_s`` seconds (the caller marks it in
:class:`datavine.io.shards.ShardHealth`, so placement and the workers' reads go to the next
shard in line, as for a failed shard), then tried again. No clock, no I/O.
"""

from __future__ import annotations

import statistics
from collections import defaultdict, deque
from collections.abc import Iterable
from dataclasses import dataclass, field

__all__ = ["ShardPace", "SlowShard"]


@dataclass(frozen=True, slots=True)
class SlowShard:
    """A shard found slow: how much slower than the others, in which category."""

    shard: str
    category: str
    ratio: float
    median_s: float
    others_s: float

    def describe(self) -> str:
        return (f"shard {self.shard} is {self.ratio:.1f}x slower than the other shards for "
                f"{self.category!r} ({self.median_s:.2f} s a bundle against "
                f"{self.others_s:.2f} s): its files are read through the next shard in line")


@dataclass
class ShardPace:
    """The recent bundle times per category and shard, and the judgement on them."""

    factor: float = 3.0
    min_samples: int = 3
    min_excess_s: float = 0.5
    hold_s: float = 60.0
    keep: int = 32  # the most recent bundle times kept per category and shard
    _times: dict[str, dict[str, deque[float]]] = field(
        default_factory=lambda: defaultdict(dict), init=False, repr=False)

    def observe(self, category: str, shard: str, seconds: float) -> None:
        """A bundle of ``category`` that read only through ``shard`` took ``seconds``."""
        by_shard = self._times[category]
        if shard not in by_shard:
            by_shard[shard] = deque(maxlen=self.keep)
        by_shard[shard].append(seconds)

    def judge(self, running: Iterable[tuple[str, str, float]] = (),
              skip: Iterable[str] = ()) -> list[SlowShard]:
        """The shards slow now, given the calls still ``running`` as (category, shard,
        seconds so far); shards in ``skip`` (already read around) are not judged."""
        skipped = set(skip)
        ongoing: dict[tuple[str, str], list[float]] = defaultdict(list)
        for category, shard, elapsed in running:
            ongoing[category, shard].append(elapsed)
        found: dict[str, SlowShard] = {}
        for category, by_shard in self._times.items():
            shards = set(by_shard) | {s for c, s in ongoing if c == category}
            if len(shards) < 2:
                continue
            for shard in sorted(shards - skipped):
                others = [t for s, ts in by_shard.items() if s != shard for t in ts]
                if len(others) < self.min_samples:
                    continue
                others_s = statistics.median(others)
                bar = max(self.factor * others_s, others_s + self.min_excess_s)
                mine = list(by_shard.get(shard, ()))
                mine += [t for t in ongoing.get((category, shard), ()) if t > bar]
                if len(mine) < self.min_samples:
                    continue
                median_s = statistics.median(mine)
                if others_s > 0 and median_s >= bar:
                    slow = SlowShard(shard, category, median_s / others_s, median_s, others_s)
                    if shard not in found or slow.ratio > found[shard].ratio:
                        found[shard] = slow
        return [found[s] for s in sorted(found)]

    def forget(self, shard: str) -> None:
        """``shard`` is read around: its old times would judge it again when it comes back."""
        for by_shard in self._times.values():
            by_shard.pop(shard, None)
