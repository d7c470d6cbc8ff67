"""Memory caps on real workers: real allocations (numpy ones: every page touched), real kills.

One local 1-core worker serves every run of this module, so "the worker keeps serving" is
checked on the very worker and library process that ran the over-cap tasks: each task
returns ``os.getppid()``, the PID of the library that forked it. A forked bundle starts
with the library's resident pages (~30 MB here; more when the library has imported numpy
and friends), so the caps below sit well above that.
"""

from __future__ import annotations

import itertools
import os
import re
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import dask
import numpy as np
import pytest
from dask import delayed

import datavine
from datavine.scheduler.memory import MemoryPolicy

pytestmark = pytest.mark.taskvine

MB = 2**20
POLICY = MemoryPolicy(default_mb=1024, floor_mb=128, ceiling_mb=1536,
                      per_category={"hog": 600, "glutton": 1024})
HOG_MB = 1100  # ~2x its category's 600 MB cap: killed once, then runs under a larger cap
GLUTTON_MB = 3000  # twice the ceiling: killed under every cap, up to the ceiling
MEDIUM_MB = 100


def hog(mb: int) -> tuple[int, int]:
    """Allocate and touch ``mb`` MB; (MB counted back from the data, the library's PID)."""
    block = np.ones(mb * MB // 8)
    return int(block.sum()) * 8 // MB, os.getppid()


def glutton(mb: int) -> tuple[int, int]:
    return hog(mb)


def medium(mb: int) -> tuple[int, int]:
    return hog(mb)


def small(i: int) -> tuple[int, int]:
    return i * i, os.getppid()


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[datavine.LocalCluster]:
    # One task per bundle: every task is its own sample of its category's peak.
    run = datavine.RunConfig(memory=POLICY, max_bundle_tasks=1, no_worker_timeout_s=30,
                             timeout_s=120)
    manager = datavine.ManagerConfig(run_dir=Path(tmp_path_factory.mktemp("memory-caps")))
    with datavine.LocalCluster(workers=1, cores=1, manager=manager, run=run) as c:
        yield c


def whoami(i: int) -> tuple[int, int]:
    return os.getpid(), os.getppid()


def smalls(n: int) -> list[Any]:
    return [delayed(small)(i) for i in range(n)]


def library_pids(results: list[tuple[int, int]]) -> set[int]:
    return {pid for _, pid in results}


def assert_still_serving(cluster: datavine.LocalCluster, pids: set[int]) -> None:
    """The worker and the library forking the bundles are those of the earlier runs."""
    (got,) = dask.compute(smalls(4), scheduler=cluster.get)
    assert [v for v, _ in got] == [0, 1, 4, 9]
    assert library_pids(got) == pids, "the library process was replaced"
    assert cluster.workers is not None and cluster.workers.alive() == 1
    assert cluster.runtime is not None and cluster.runtime.connected_workers() == 1
    assert cluster.runtime.library_failures() == []


def test_capped_bundles_share_one_warm_child_of_the_library(
        cluster: datavine.LocalCluster) -> None:
    """Bundles run one after another in one long-lived child (its heap stays warm), not in
    the library itself and not in a new process each."""
    (got,) = dask.compute([delayed(whoami)(i) for i in range(12)], scheduler=cluster.get)
    assert cluster.last_summary.bundles == 12  # max_bundle_tasks=1: one call per task
    assert len(set(got)) == 1
    ((child, library),) = set(got)
    assert child != library


@dataclass
class Escalated:
    hog: tuple[int, int]
    others: list[tuple[int, int]]
    summary: Any
    before_pids: set[int]


@pytest.fixture(scope="module")
def escalated(cluster: datavine.LocalCluster) -> Escalated:
    """A run of one hog (~2x its cap) among small tasks, after a run of small tasks alone."""
    (before,) = dask.compute(smalls(2), scheduler=cluster.get)
    got_hog, others = dask.compute(delayed(hog)(HOG_MB), smalls(6), scheduler=cluster.get)
    return Escalated(got_hog, others, cluster.last_summary, library_pids(before))


def failed_caps(summary: Any, category: str) -> list[float]:
    """Caps of the overruns the summary lists for ``category``, in order."""
    found = re.findall(rf"tasks '{category}-[^']*' went over their (\d+) MB cap",
                       "\n".join(summary.failures))
    return [float(c) for c in found]


def test_a_task_over_its_cap_is_retried_under_a_larger_cap_and_succeeds(
        escalated: Escalated) -> None:
    assert escalated.hog[0] == HOG_MB  # the right result, computed from the touched pages
    stats = escalated.summary.categories["hog"]
    first_cap = POLICY.clamp(POLICY.per_category["hog"])
    assert stats.overruns >= 1 and escalated.summary.retries >= stats.overruns
    assert failed_caps(escalated.summary, "hog")[0] == first_cap
    assert stats.cap_mb > first_cap and stats.cap_mb <= POLICY.ceiling_mb
    assert stats.tasks == 1  # counted once: for the attempt that succeeded


def test_each_retry_runs_under_the_policys_escalated_cap(escalated: Escalated) -> None:
    stats = escalated.summary.categories["hog"]
    caps = [*failed_caps(escalated.summary, "hog"), stats.cap_mb]
    for failed, next_cap in itertools.pairwise(caps):
        assert next_cap >= min(POLICY.ceiling_mb, POLICY.growth * failed), caps
    assert stats.overruns == 1, caps  # 2 x 640 MB is enough for 1100 MB


def test_other_tasks_complete_and_the_worker_keeps_serving(cluster: datavine.LocalCluster,
                                                           escalated: Escalated) -> None:
    assert [v for v, _ in escalated.others] == [i * i for i in range(6)]
    # the hog's successful attempt and the small tasks ran in the one library of the worker
    assert library_pids([escalated.hog, *escalated.others]) == escalated.before_pids
    assert_still_serving(cluster, escalated.before_pids)


def test_peaks_per_category_are_measured_and_reported(escalated: Escalated) -> None:
    summary = escalated.summary
    hog_stats, small_stats = summary.categories["hog"], summary.categories["small"]
    assert HOG_MB <= hog_stats.peak_mb <= hog_stats.cap_mb
    assert 0 < small_stats.peak_mb < 300 and small_stats.tasks == 6
    assert summary.worker_peak_mb["local-0"] == pytest.approx(hog_stats.peak_mb)
    learned = summary.memory["hog"]
    assert learned["max_peak_mb"] == pytest.approx(hog_stats.peak_mb)
    assert learned["overruns"] == hog_stats.overruns
    text = "\n".join(summary.lines())
    hog_line = next(line for line in summary.lines() if line.split()[:1] == ["hog"])
    assert f"peak {hog_stats.peak_mb:5.0f} / cap {hog_stats.cap_mb:.0f} MB" in hog_line
    assert f"{hog_stats.overruns} over cap" in hog_line
    assert re.search(r"small\s+6 tasks .* peak\s+\d+ / cap \d+ MB", text), text


@pytest.fixture(scope="module")
def gave_up(cluster: datavine.LocalCluster, escalated: Escalated
            ) -> tuple[datavine.MemoryCapError, str]:
    """A task that exceeds the ceiling whatever its cap: the run fails."""
    over = delayed(glutton)(GLUTTON_MB)
    with pytest.raises(datavine.MemoryCapError) as info:
        dask.compute(over, smalls(3), scheduler=cluster.get)
    return info.value, over.key


def test_a_task_over_the_ceiling_fails_naming_task_peak_and_cap(
        cluster: datavine.LocalCluster,
        gave_up: tuple[datavine.MemoryCapError, str]) -> None:
    err, key = gave_up
    message = str(err)
    assert err.keys == [key] and repr(key) in message
    assert err.category == "glutton"
    # Given up at the ceiling, or earlier when a kill came late enough to show a peak
    # already over the ceiling (the policy's two reasons; a loaded machine gives the second).
    assert err.cap_mb == POLICY.ceiling_mb or err.peak_mb > POLICY.ceiling_mb
    assert err.cap_mb < err.peak_mb < GLUTTON_MB  # killed over its cap, before the end
    assert f"used {err.peak_mb:.0f} MB" in message and f"cap of {err.cap_mb:.0f} MB" in message
    assert "MemoryPolicy.ceiling_mb" in message
    summary = cluster.last_summary
    assert summary.categories["glutton"].overruns >= 1
    assert failed_caps(summary, "glutton")[0] == POLICY.per_category["glutton"]


def test_after_a_task_gave_up_the_worker_keeps_serving(
        cluster: datavine.LocalCluster, escalated: Escalated,
        gave_up: tuple[datavine.MemoryCapError, str]) -> None:
    assert_still_serving(cluster, escalated.before_pids)


def test_caps_are_learned_from_measured_peaks(cluster: datavine.LocalCluster,
                                              gave_up: Any) -> None:
    memory = cluster.runtime.memory if cluster.runtime is not None else None
    assert memory is not None
    initial = memory.cap_for("medium")
    assert initial == POLICY.default_mb  # nothing known yet
    (first,) = dask.compute([delayed(medium)(MEDIUM_MB) for _ in range(POLICY.min_samples)],
                            scheduler=cluster.get)
    assert [v for v, _ in first] == [MEDIUM_MB] * POLICY.min_samples
    known = memory.categories["medium"]
    assert known.samples == POLICY.min_samples and MEDIUM_MB <= known.max_peak_mb < 400
    learned = memory.cap_for("medium")
    need = known.max_peak_mb * POLICY.headroom  # and the column cache's room on top
    assert memory.cache_share == datavine.RunConfig().column_cache_share
    assert learned == POLICY.clamp(need + memory.cache_room(need)) < initial

    (second,) = dask.compute([delayed(medium)(MEDIUM_MB) for _ in range(3)],
                             scheduler=cluster.get)
    assert [v for v, _ in second] == [MEDIUM_MB] * 3
    stats = cluster.last_summary.categories["medium"]
    # ran under the learned cap (which the new peaks may have moved by a step, not more)
    assert stats.cap_mb in {learned, memory.cap_for("medium")} and stats.cap_mb < initial
    assert stats.overruns == 0 and stats.peak_mb <= stats.cap_mb
