"""``benchmarks/manager_loop.py``: datavine's loop on the fake port, back to back and with a
pause before each result, reports each figure and the ratio (no timing asserted: the figures
are the host's)."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def test_the_loop_benchmark_reports_warm_and_paused_runs(tmp_path: Path) -> None:
    done = subprocess.run(
        [sys.executable, str(ROOT / "benchmarks" / "manager_loop.py"), "--tasks", "24",
         "--pause-tasks", "8", "--workers", "4", "--repeat", "2", "--pause-ms", "0", "1"],
        capture_output=True, text=True, timeout=120, cwd=tmp_path)
    assert done.returncode == 0, done.stderr[-3000:]
    lines = done.stdout.strip().splitlines()
    # each pause's runs, in order, each with its bundle count
    assert [re.match(r"pause (\S+) ms before each result, (\d+) tasks", line).groups()
            for line in lines if line.startswith("pause ")] == [("0", "24"), ("1", "8")]
    pairs = dict(item.split("=") for item in lines[-1].split())
    assert set(pairs) == {"us_per_bundle_pause_0", "us_per_bundle_pause_1", "cold_ratio_1"}
    warm, paused = int(pairs["us_per_bundle_pause_0"]), int(pairs["us_per_bundle_pause_1"])
    assert warm > 0 and paused > 0
    assert abs(float(pairs["cold_ratio_1"]) - paused / warm) < 0.02  # of the unrounded bests
    assert not list(tmp_path.iterdir())  # its live view's file went with its scratch folder
