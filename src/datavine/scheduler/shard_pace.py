"""Pure decisions: which XCache shard is slow enough that its files are better read through
the next shard in line.

A shard can serve every read and still be the run's straggler: a saturated or throttled
link, a failing disk. Backup copies (:mod:`datavine.scheduler.speculation`) rescue a call
that runs late, but a slow shard makes *every* call reading its files slow, and the expected
time of their category is learned from those same slow calls. So shards are compared with
each other, two ways:

- their read rate, as the workers clocked it (:mod:`datavine.io.source.timed`: seconds a
  read of the file was outstanding, for the bytes asked of the server): a shard is slow when
  its reads took, in the median, ``factor`` times or more the other shards' seconds per byte,
  and ``min_read_excess_s`` more than those bytes would have taken at the others' rate (each
  side at least ``min_read_samples`` reads of ``min_read_bytes`` or more: the first reads of a
  slow shard end late, and a run of a few minutes cannot wait for many). A bundle's run time
  mixes the reads with decompression and the analysis, which a slow shard does not slow: a
  shard serving at a tenth of the others' rate can make its bundles only twice as long;
- their bundles' run time, for calls that have no clocked reads (the workers of an older
  datavine, files opened by other means) and for calls still running: the bundles of one
  category that read through a shard took, in the median, ``factor`` times or more what the
  same category's bundles took through the other shards, and ``min_excess_s`` more at
  least. A call still running through a shard counts once it has run longer than that: the
  slow shard's calls end last, and waiting for them would notice it only at the run's end.

A read is clocked only when it ends: the first reads through a slow shard end late, and
until then its calls just run on. So a third way looks at those: calls running through a
shard ``stuck_factor`` times the run time of the same category's bundles through the other
shards, and ``min_stuck_excess_s`` more, on ``min_stuck_workers`` workers or more at once
(one slow worker is not a slow shard; its calls get backup copies).

A cold cache against a warm one, or reads of milliseconds, are no straggler (the excess
bounds). A shard found slow is read around for ``hold_s`` seconds (the caller marks it in
:class:`datavine.io.shards.ShardHealth`, so placement and the workers' reads go to the next
shard in line, as for a failed shard), then tried again. No clock, no I/O.
"""

from __future__ import annotations

import statistics
from collections import defaultdict, deque
from collections.abc import Iterable
from dataclasses import dataclass, field

__all__ = ["ShardPace", "SlowShard"]


READS = "reads"  # a SlowShard's category when its read rate gave it away
MB = 1_000_000


@dataclass(frozen=True, slots=True)
class SlowShard:
    """A shard found slow: how much slower than the others, in which category (or in its
    reads: :data:`READS`), and the medians compared (seconds a bundle, or per MB read)."""

    shard: str
    category: str
    ratio: float
    median_s: float
    others_s: float
    running: bool = False  # judged on calls still running through it

    def describe(self) -> str:
        if self.running:
            what = (f"for {self.category!r} (calls running {self.median_s:.2f} s through it, "
                    f"against {self.others_s:.2f} s a bundle through the others)")
        elif self.category == READS:
            measure = (f"reads at {1 / self.median_s:.1f} MB/s against "
                       f"{1 / self.others_s:.1f} MB/s"
                       if self.median_s > 0 and self.others_s > 0 else "reads")
            what = f"in its reads ({measure})"
        else:
            what = (f"for {self.category!r} ({self.median_s:.2f} s a bundle against "
                    f"{self.others_s:.2f} s)")
        return (f"shard {self.shard} is {self.ratio:.1f}x slower than the other shards {what}"
                ": its files are read through the next shard in line")


@dataclass
class ShardPace:
    """The recent bundle times per category and shard, and the judgement on them."""

    factor: float = 3.0
    min_samples: int = 3
    min_excess_s: float = 0.5
    min_read_excess_s: float = 0.25
    min_read_bytes: int = 256 * 1024
    min_read_samples: int = 2  # a rate is steadier than a bundle's time: 2 reads each side
    stuck_factor: float = 5.0
    min_stuck_excess_s: float = 1.0
    min_stuck_workers: int = 2
    hold_s: float = 60.0
    keep: int = 32  # the most recent bundle times (reads) kept per category and shard
    _times: dict[str, dict[str, deque[float]]] = field(
        default_factory=lambda: defaultdict(dict), init=False, repr=False)
    _reads: dict[str, deque[tuple[float, int]]] = field(default_factory=dict, init=False,
                                                         repr=False)
    _walls: dict[str, dict[str, deque[float]]] = field(
        default_factory=lambda: defaultdict(dict), init=False, repr=False)

    def observe(self, category: str, shard: str, seconds: float) -> None:
        """A bundle of ``category`` that read only through ``shard`` took ``seconds``."""
        self._keep(self._times, category, shard, seconds)

    def observe_wall(self, category: str, shard: str, seconds: float) -> None:
        """A bundle of ``category`` that read only through ``shard`` took ``seconds``,
        clocked reads or not: what calls still running elsewhere are compared with."""
        self._keep(self._walls, category, shard, seconds)

    def _keep(self, store: dict[str, dict[str, deque[float]]], category: str, shard: str,
              seconds: float) -> None:
        by_shard = store[category]
        if shard not in by_shard:
            by_shard[shard] = deque(maxlen=self.keep)
        by_shard[shard].append(seconds)

    def observe_read(self, shard: str, seconds: float, nbytes: int) -> None:
        """A read through ``shard`` of ``nbytes`` bytes was outstanding ``seconds`` (reads
        under ``min_read_bytes``, or not clocked, say nothing of the shard's rate)."""
        if nbytes < self.min_read_bytes or seconds <= 0:
            return
        if shard not in self._reads:
            self._reads[shard] = deque(maxlen=self.keep)
        self._reads[shard].append((seconds, nbytes))

    def judge(self, running: Iterable[tuple[str, str, float]] = (),
              skip: Iterable[str] = (),
              stuck: Iterable[tuple[str, str, float, str]] = ()) -> list[SlowShard]:
        """The shards slow now, given the calls still ``running`` as (category, shard,
        seconds so far) and, of those, the ones known to run on a worker as (category,
        shard, seconds running, worker) in ``stuck``; shards in ``skip`` (already read
        around) are not judged."""
        skipped = set(skip)
        found = self._judge_reads(skipped)
        for shard, slow in self._judge_bundles(running, skipped).items():
            found.setdefault(shard, slow)
        for shard, slow in self._judge_stuck(stuck, skipped).items():
            found.setdefault(shard, slow)
        return [found[s] for s in sorted(found)]

    def _judge_stuck(self, stuck: Iterable[tuple[str, str, float, str]],
                     skipped: set[str]) -> dict[str, SlowShard]:
        """The shards whose calls run far past the same category's bundles through the
        other shards, on several workers at once."""
        by_call: dict[tuple[str, str], list[tuple[float, str]]] = defaultdict(list)
        for category, shard, elapsed, worker in stuck:
            if shard not in skipped:
                by_call[category, shard].append((elapsed, worker))
        found: dict[str, SlowShard] = {}
        for (category, shard), calls in sorted(by_call.items()):
            others = [t for s, ts in self._walls.get(category, {}).items() if s != shard
                      for t in ts]
            if len(others) < self.min_samples:
                continue
            others_s = statistics.median(others)
            bar = max(self.stuck_factor * others_s, others_s + self.min_stuck_excess_s)
            late = [elapsed for elapsed, _ in calls if elapsed > bar]
            if others_s <= 0 or len({w for e, w in calls if e > bar}) < self.min_stuck_workers:
                continue
            median_s = statistics.median(late)
            slow = SlowShard(shard, category, median_s / others_s, median_s, others_s,
                             running=True)
            if shard not in found or slow.ratio > found[shard].ratio:
                found[shard] = slow
        return found

    def _judge_reads(self, skipped: set[str]) -> dict[str, SlowShard]:
        """The shards whose clocked reads are slow against the others' (seconds per MB)."""
        found: dict[str, SlowShard] = {}
        for shard in sorted(set(self._reads) - skipped):
            others = [s / b for o, rs in self._reads.items() if o != shard for s, b in rs]
            mine = self._reads[shard]
            if len(others) < self.min_read_samples or len(mine) < self.min_read_samples:
                continue
            others_spb = statistics.median(others)
            mine_spb = statistics.median(s / b for s, b in mine)
            excess_s = statistics.median(s - b * others_spb for s, b in mine)
            if (others_spb > 0 and mine_spb >= self.factor * others_spb
                    and excess_s >= self.min_read_excess_s):
                found[shard] = SlowShard(shard, READS, mine_spb / others_spb, mine_spb * MB,
                                         others_spb * MB)
        return found

    def _judge_bundles(self, running: Iterable[tuple[str, str, float]],
                       skipped: set[str]) -> dict[str, SlowShard]:
        """The shards whose bundles are slow against the same category's elsewhere."""
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
        return found

    def forget(self, shard: str) -> None:
        """``shard`` is read around: its old times would judge it again when it comes back."""
        for by_shard in (*self._times.values(), *self._walls.values()):
            by_shard.pop(shard, None)
        self._reads.pop(shard, None)
