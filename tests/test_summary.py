"""The run summary's text: what a user reads at the end of a run (pure)."""

from __future__ import annotations

from datavine.scheduler.summary import CategoryStats, RunSummary


def test_category_lines_fit_a_terminal_and_show_peak_and_cap() -> None:
    summary = RunSummary(tasks=120_000, bundles=9_000, retries=2, wall_s=1234.5, workers=400)
    summary.categories["agc-chunk-0123456789abcdef"] = CategoryStats(
        tasks=100_000, seconds=98_765.4, peak_mb=2_345, cap_mb=3_072, overruns=0)
    summary.categories["agc-merge"] = CategoryStats(tasks=20_000, seconds=12.3, peak_mb=180,
                                                    cap_mb=2_048, overruns=1)
    lines = summary.lines()
    assert lines[0].startswith("datavine: 120000 tasks in 9000 bundles on 400 workers")
    chunk, merge = lines[1], lines[2]
    assert chunk.endswith("peak  2345 / cap 3072 MB") and "100000 tasks" in chunk
    assert merge.endswith("peak   180 / cap 2048 MB, 1 over cap")
    summary.categories["agc-merge"].cap_mb = None  # memory caps off: the peak alone
    assert summary.lines()[2].endswith("12.3 s peak   180 MB, 1 over cap")
    assert all(len(line) <= 80 for line in (chunk, merge)), [len(x) for x in (chunk, merge)]


def test_placement_counts_every_tier_best_first() -> None:
    summary = RunSummary(tasks=16, bundles=16, wall_s=2.0, workers=4)
    summary.placement.update({"rack": 5, "cached": 2, "host": 8, "anywhere": 1})
    (line,) = [x for x in summary.lines() if "placement" in x]
    assert line == "  placement: 16 bundles: cached 2, host 8, rack 5, anywhere 1"
    summary.placement.clear()
    summary.placement["host"] = 3
    assert "placement: 3 bundles: cached 0, host 3, rack 0, anywhere 0" in "\n".join(
        summary.lines())
    assert summary.to_dict()["placement"] == {"host": 3}
