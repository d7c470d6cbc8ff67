"""What a run did: counts, times, memory, placement and bytes read, gathered by the runtime.

Shown at the end of a run (``lines``) and kept as ``Runtime.last_summary`` for reports
(``to_dict`` is JSON-ready).
"""

from __future__ import annotations

from collections import Counter, defaultdict
from collections.abc import Hashable, Iterable, Mapping
from dataclasses import asdict, dataclass, field
from typing import Any

# How near the bundles that read files were placed, best first (datavine.scheduler.placement):
# on a worker that read their file, on their shard's host, in its rack, anywhere.
PLACEMENT_TIERS = ("cached", "host", "rack", "anywhere")


@dataclass
class CategoryStats:
    """Per task category: how many ran, their time, and the memory seen."""

    tasks: int = 0
    seconds: float = 0.0
    peak_mb: float = 0.0
    cap_mb: float | None = None
    overruns: int = 0


@dataclass
class ReadStats:
    """Bytes tasks read through :func:`datavine.io.reading.open_input`, by nearness: over
    the network (near or far), or from the worker's own disk (``disk_bytes``: the input-bytes
    cache, :mod:`datavine.io.disk_cache`)."""

    near_bytes: int = 0  # from a shard in the worker's rack, or a file on the worker
    far_bytes: int = 0  # from another rack's shard or the origin
    disk_bytes: int = 0  # from the worker's disk cache instead of a server
    # of near and far, those read ahead while the bundle before computed (worker/prefetch.py)
    prefetched_bytes: int = 0
    prefetched_opens: int = 0  # opens that took ranges read ahead
    by_server: Counter[str] = field(default_factory=Counter)
    opens: int = 0
    failovers: int = 0
    failover_errors: list[str] = field(default_factory=list)
    slow_shards: list[str] = field(default_factory=list)  # read around (shard_pace.py)

    @property
    def near_fraction(self) -> float:
        total = self.near_bytes + self.far_bytes
        return self.near_bytes / total if total else 0.0


@dataclass
class Traffic:
    """Bytes of values and calls: through the manager (its file bytes out and in: call
    arguments, results, inline values), made and kept on workers, and fetched by a call on
    another worker than the one holding them (peer to peer)."""

    manager_out: int = 0
    manager_in: int = 0
    kept: int = 0
    peer: int = 0

    @property
    def manager(self) -> int:
        return self.manager_out + self.manager_in


@dataclass
class Backups:
    """Backup copies (:mod:`datavine.scheduler.speculation`): copies sent (of calls that
    waited behind another, of late ones, of calls on a slow worker that an idle one would
    outrun, and of calls sent through a shard found slow since), copies whose result came
    first, copies cancelled because the first copy came first (or failed), copies that
    failed. ``unmeasured``: calls stopped while they ran (a copy, or a first copy whose copy
    came first), whose reads no result reports (the worker drops a cancelled call's
    sandbox, and its process with it): the bytes they read are in no figure of the run's
    reads; ``unmeasured_bytes`` bounds them: what the winning copy of each read (a stopped
    call read part of the same chunks, or all of them)."""

    started: int = 0
    queued: int = 0
    late: int = 0
    outrun: int = 0
    slow_shard: int = 0
    won: int = 0
    cancelled: int = 0
    failed: int = 0
    unmeasured: int = 0
    unmeasured_bytes: int = 0


@dataclass
class CacheUse:
    """The workers' column caches in a run (:mod:`datavine.io.column_cache`): decoded bytes
    served from them (``hit_bytes``) and decoded from files (``miss_bytes``); files whose
    columns all left a worker's cache (``dropped``)."""

    hit_bytes: int = 0
    miss_bytes: int = 0
    dropped: int = 0

    @property
    def hit_fraction(self) -> float:
        """The share of the decoded bytes the run read that came from the caches."""
        total = self.hit_bytes + self.miss_bytes
        return self.hit_bytes / total if total else 0.0


@dataclass
class RunSummary:
    """Figures for one ``get`` call.

    ``tasks`` (and each category's ``tasks``): the graph's tasks that finished, each counted
    once even when it was made again after a worker holding its value was lost (those runs
    are ``recomputed``; their time is in the categories' ``seconds``, their host in
    ``hosts``: where tasks ran);
    ``samples``: (seconds since start, workers, cores) about once a second;
    ``completions``: (seconds since start, key, worker) for every task run that finished
    (a task made again appears again);
    ``failures``: why each retry or overrun happened, in order; ``lost_workers``: workers
    (names or addresses) that left or were declared lost during the run; ``timeouts``: tasks
    stopped at their time limit; ``abandoned``: calls still running when the run ended (it
    failed), stopped by restarting the library; ``recomputed``: tasks run again because
    values kept on a lost worker were needed; ``traffic``: where the values' bytes went;
    ``placement``: bundles that read files, by how near they were placed
    (:data:`PLACEMENT_TIERS`); ``backups``: backup copies (:class:`Backups`); ``cache``:
    the workers' column caches (:class:`CacheUse`).
    """

    tasks: int = 0
    bundles: int = 0
    retries: int = 0
    failures: list[str] = field(default_factory=list)
    lost_workers: list[str] = field(default_factory=list)
    timeouts: int = 0
    abandoned: int = 0
    recomputed: int = 0
    traffic: Traffic = field(default_factory=Traffic)
    wall_s: float = 0.0
    workers: int = 0
    categories: dict[str, CategoryStats] = field(default_factory=lambda: defaultdict(CategoryStats))
    hosts: dict[str, int] = field(default_factory=lambda: defaultdict(int))
    worker_peak_mb: dict[str, float] = field(default_factory=dict)
    placement: Counter[str] = field(default_factory=Counter)
    reads: ReadStats = field(default_factory=ReadStats)
    memory: dict[str, dict[str, float]] = field(default_factory=dict)
    samples: list[tuple[float, int, int]] = field(default_factory=list)
    completions: list[tuple[float, Hashable, str]] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)  # e.g. why placement could not act
    # network faults and what was done: worker, host, failed, done, at_s (scheduler/network.py)
    network: list[dict[str, Any]] = field(default_factory=list)
    # every bundle's phases and steps (scheduler/lifecycle.py: Lifecycle.to_dict)
    lifecycle: dict[str, Any] = field(default_factory=dict)
    backups: Backups = field(default_factory=Backups)
    cache: CacheUse = field(default_factory=CacheUse)

    @property
    def tasks_per_s(self) -> float:
        return self.tasks / self.wall_s if self.wall_s > 0 else 0.0

    def add_reads(self, reads: Iterable[Mapping[str, Any]], worker_rack: str | None) -> None:
        """Account a bundle's read records (see :class:`datavine.io.reading.ReadRecord`)."""
        stats, cache = self.reads, self.cache
        for r in reads:
            cache.hit_bytes += int(r.get("cached", 0))
            cache.miss_bytes += int(r.get("decoded", 0))
            if r.get("server") == "memory":  # the column cache alone: no file was opened
                # a file's marker (datavine.io.column_cache.marker_name): its last piece left
                cache.dropped += bool(r.get("dropped")) and str(r.get("lfn")).endswith("@*")
                continue
            nbytes = int(r.get("bytes", 0))
            stats.disk_bytes += int(r.get("disk", 0))
            stats.prefetched_bytes += int(r.get("prefetched", 0))
            stats.prefetched_opens += bool(r.get("prefetched"))
            near = r.get("server") == "local" or (
                worker_rack is not None and r.get("rack") == worker_rack)
            if near:
                stats.near_bytes += nbytes
            else:
                stats.far_bytes += nbytes
            stats.by_server[str(r.get("server"))] += nbytes
            stats.opens += 1
            errors = r.get("errors", ())
            stats.failovers += len(errors)
            stats.failover_errors.extend(f"{r.get('lfn')}: {s}: {e}" for s, e in errors)

    def served(self) -> dict[str, int]:
        """Where the run's bytes came from: decoded bytes from the workers' memory (the
        column cache), input bytes from their disk (the input-bytes cache), from a shard in
        the worker's rack, from a file on the worker, and from afar (another rack's shard,
        the origin, a direct URL)."""
        local = self.reads.by_server.get("local", 0)
        return {"memory": self.cache.hit_bytes, "disk": self.reads.disk_bytes,
                "rack": self.reads.near_bytes - local, "local": local,
                "far": self.reads.far_bytes}

    def served_line(self) -> str:
        """:meth:`served` in words (MB)."""
        mb, s = 2**20, self.served()
        local = f"{s['local'] / mb:,.1f} MB from files on them, " if s["local"] else ""
        return (f"bytes: {s['memory'] / mb:,.1f} MB from workers' memory (decoded), "
                f"{s['disk'] / mb:,.1f} MB from their disk, {local}"
                f"{s['rack'] / mb:,.1f} MB from the rack's shards, {s['far'] / mb:,.1f} MB far")

    def placement_line(self) -> str:
        """Bundles per placement tier, best first (every tier, zeros too)."""
        tiers = [*PLACEMENT_TIERS, *sorted(set(self.placement) - set(PLACEMENT_TIERS))]
        return (f"{sum(self.placement.values())} bundles: "
                + ", ".join(f"{t} {self.placement.get(t, 0)}" for t in tiers))

    def to_dict(self) -> dict[str, Any]:
        """Plain JSON-ready data (dataclasses.asdict cannot copy the defaultdicts)."""
        reads = self.reads
        return {
            "tasks": self.tasks, "bundles": self.bundles, "retries": self.retries,
            "failures": list(self.failures), "lost_workers": list(self.lost_workers),
            "timeouts": self.timeouts, "abandoned": self.abandoned,
            "recomputed": self.recomputed,
            "traffic": asdict(self.traffic),
            "wall_s": self.wall_s, "workers": self.workers,
            "tasks_per_s": self.tasks_per_s,
            "categories": {k: asdict(v) for k, v in self.categories.items()},
            "hosts": dict(self.hosts), "worker_peak_mb": dict(self.worker_peak_mb),
            "placement": dict(self.placement), "memory": dict(self.memory),
            "reads": {"near_bytes": reads.near_bytes, "far_bytes": reads.far_bytes,
                      "disk_bytes": reads.disk_bytes,
                      "prefetched_bytes": reads.prefetched_bytes,
                      "prefetched_opens": reads.prefetched_opens,
                      "near_fraction": reads.near_fraction, "by_server": dict(reads.by_server),
                      "opens": reads.opens, "failovers": reads.failovers,
                      "failover_errors": list(reads.failover_errors),
                      "slow_shards": list(reads.slow_shards)},
            "samples": [list(s) for s in self.samples],
            "completions": [(t, str(k), w) for t, k, w in self.completions],
            "notes": list(self.notes),
            "network": [dict(n) for n in self.network],
            "lifecycle": self.lifecycle,
            "backups": asdict(self.backups),
            "cache": {**asdict(self.cache), "hit_fraction": self.cache.hit_fraction},
            "served": self.served(),
        }

    def lines(self) -> list[str]:
        out = [
            f"datavine: {self.tasks} tasks in {self.bundles} bundles on {self.workers} workers, "
            f"{self.wall_s:.2f} s ({self.tasks_per_s:,.0f} tasks/s), {self.retries} retries"
            + (f", {self.recomputed} tasks made again" if self.recomputed else "")
        ]
        for name, cat in sorted(self.categories.items(), key=lambda kv: -kv[1].seconds)[:8]:
            memory = f"peak {cat.peak_mb:5.0f}" + (f" / cap {cat.cap_mb:.0f}" if cat.cap_mb else "")
            over = f", {cat.overruns} over cap" if cat.overruns else ""
            out.append(f"  {name:<18} {cat.tasks:>6} tasks {cat.seconds:6.1f} s "
                       f"{memory} MB{over}")  # fits 80 columns
        if self.placement:
            out.append("  placement: " + self.placement_line())
        out.extend(f"  note: {n}" for n in self.notes)
        out.extend(f"  network: {network_line(n)}" for n in self.network)
        r = self.reads
        if r.opens:
            mb = 2**20
            out.append(f"  reads: {r.opens} opens, {r.near_bytes / mb:,.1f} MB near, "
                       f"{r.far_bytes / mb:,.1f} MB far ({r.near_fraction:.1%} near), "
                       f"{r.failovers} failovers")
            out.extend(f"    failover: {e}" for e in r.failover_errors[:5])
            out.extend(f"    slow: {e}" for e in r.slow_shards)
            if r.prefetched_opens:
                out.append(f"  prefetch: {r.prefetched_bytes / mb:,.1f} MB read ahead while "
                           f"the bundle before computed, in {r.prefetched_opens} of "
                           f"{r.opens} opens")
        if r.opens or self.cache.hit_bytes:
            out.append(f"  {self.served_line()}")
        c = self.cache
        if c.hit_bytes or c.miss_bytes:
            mb = 2**20
            out.append(f"  column cache: {c.hit_bytes / mb:,.1f} MB from workers' memory, "
                       f"{c.miss_bytes / mb:,.1f} MB decoded ({c.hit_fraction:.1%} hits), "
                       f"{c.dropped} files dropped")
        t = self.traffic
        if t.kept or t.manager:
            mb = 2**20
            out.append(f"  data: {t.manager / mb:,.1f} MB through the manager, {t.kept / mb:,.1f} "
                       f"MB kept on workers, {t.peer / mb:,.1f} MB worker to worker")
        b = self.backups
        if b.started:
            out.append(f"  backups: {b.started} copies ({b.queued} of waiting calls, {b.late} "
                       f"of late ones, {b.outrun} of calls on a slower worker, "
                       f"{b.slow_shard} of calls through a slow shard): {b.won} came "
                       f"first, {b.cancelled} cancelled, {b.failed} failed"
                       + (f"; {b.unmeasured} stopped while they ran, their reads not "
                          f"counted above (up to {b.unmeasured_bytes / 2**20:,.1f} MB)"
                          if b.unmeasured else ""))
        if self.lost_workers:
            out.append(f"  lost workers: {', '.join(self.lost_workers[:8])}"
                       + (f" ({len(self.lost_workers)} in all)" if len(self.lost_workers) > 8
                          else ""))
        if self.timeouts or self.abandoned:
            out.append(f"  {self.timeouts} tasks stopped at their time limit, {self.abandoned} "
                       "running calls stopped when the run ended")
        out.extend(f"  failure: {f}" for f in self.failures[:10])
        if len(self.failures) > 10:
            out.append(f"  ... {len(self.failures) - 10} more failures (last_summary.failures)")
        return out


def network_line(finding: Mapping[str, Any]) -> str:
    """One network finding in words: which worker, what failed, what was done, when."""
    worker, host = finding.get("worker", "?"), finding.get("host", "")
    where = f"{worker} ({host})" if host and host != worker else str(worker)
    return (f"{where}: {finding.get('failed', '?')}; {finding.get('done', '?')} "
            f"(at {float(finding.get('at_s', 0.0)):.1f} s)")
