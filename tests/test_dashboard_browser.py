"""The live view in a real browser: headless Chromium (Debian's, driven by Playwright through
``executable_path``, no browser downloaded) opens the dashboard of a real LocalCluster while
it runs, sees its two workers and its bundles-done count grow; then opens the saved HTML
with the network refused and finds the figures of the run's JSON summary.

The run's second stage of tasks waits for a file the browser's side creates once it has read
the count (tests/dashboard_page.py), so the count must grow after that read: no timing
assumption, every wait bounded.
"""

from __future__ import annotations

import importlib.util
import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

import datavine
from datavine.scheduler.graph import add_merge_tree

CHROMIUM = os.environ.get("DATAVINE_CHROMIUM", "/usr/bin/chromium")
ROOT = Path(__file__).resolve().parent.parent
PAGE_S = 300  # the browser's side, all its waits included


def browser_missing() -> str | None:
    if not Path(CHROMIUM).exists():
        return f"no Chromium at {CHROMIUM}: scripts/setup.sh --browser (apt-get install chromium)"
    for module in ("playwright", "bokeh"):
        if importlib.util.find_spec(module) is None:
            return f"{module} is not installed: pip install -e '.[dashboard,test]'"
    return None


pytestmark = [pytest.mark.browser, pytest.mark.taskvine,
              pytest.mark.skipif(browser_missing() is not None,
                                 reason=str(browser_missing()))]


def write_root(path: Path, n: int) -> Path:
    import numpy as np
    import uproot

    with uproot.recreate(path) as f:
        f["Events"] = {"x": np.arange(n, dtype=np.float64)}
    return path


def read_file(path: str, i: int) -> float:
    """Stage one: read a file (a bundle seed of its own, placed and counted by file),
    through the worker's column cache (the header shows its figures)."""
    import time

    import numpy as np

    from datavine.io.cached_arrays import read_arrays

    total = float(np.sum(read_arrays(path, ["x"]).arrays["x"]))
    time.sleep(0.3)
    return total + i


def gated(i: int, gate: str, *values: float) -> float:
    """Stage two, after every read: wait (bounded) for the browser's side to have read the
    count."""
    import os
    import time

    deadline = time.monotonic() + 240
    while not os.path.exists(gate):
        if time.monotonic() > deadline:
            raise TimeoutError(f"the browser never opened the gate {gate}")
        time.sleep(0.1)
    return sum(values) if i == 0 else 0.0


def add(*values: float) -> float:
    return sum(values)


def page(*args: str, timeout: float = PAGE_S) -> dict[str, Any]:
    done = subprocess.run([sys.executable, "-m", "tests.dashboard_page", *args], cwd=ROOT,
                          capture_output=True, text=True, timeout=timeout, check=False)
    assert done.returncode == 0, done.stderr[-3000:]
    return json.loads(done.stdout.strip().splitlines()[-1])


def test_live_view_and_saved_report_in_chromium(tmp_path: Path) -> None:
    files = [str(write_root(tmp_path / f"f{i}.root", 1000 * (i + 1))) for i in range(3)]
    gate = tmp_path / "gate"
    dsk: dict[Any, Any] = {}
    for i in range(6):
        dsk[("read", i)] = (read_file, files[i % 3], i)
    for i in range(4):  # each needs every read: none is bundled with one
        dsk[("gated", i)] = (gated, i, str(gate), *[("read", j) for j in range(6)])
    final = add_merge_tree(dsk, [("gated", i) for i in range(4)], 2,
                           key=lambda d, j: ("add", d, j), task=lambda keys: (add, *keys))
    manager = datavine.ManagerConfig(run_dir=tmp_path / "run")
    with datavine.LocalCluster(workers=2, manager=manager, dashboard=True, memory=None,
                               max_bundle_tasks=1, no_worker_timeout_s=60) as cluster:
        url = cluster.dashboard_url
        assert url is not None and url.startswith("http://127.0.0.1:"), cluster.dashboard_error
        assert cluster.dashboard is not None
        cluster.dashboard.expect_events({("read", i): 1000 for i in range(6)})
        browser = subprocess.Popen(
            [sys.executable, "-m", "tests.dashboard_page", "live", url, str(gate), "local-0",
             "local-1"], cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        try:
            (value,) = cluster.get(dsk, [final])
        except Exception as exc:  # the browser's side did not open the gate: say why
            browser.kill()
            exc.add_note(f"the browser's side: {browser.communicate(timeout=30)[1][-3000:]}")
            raise
        out, err = browser.communicate(timeout=PAGE_S)
        assert browser.returncode == 0, err[-3000:]
        live = json.loads(out.strip().splitlines()[-1])
        summary = cluster.last_summary.to_dict()
        report = cluster.save_report(tmp_path / "run.html", title="browser test")
    assert value == pytest.approx(sum(1000 * (i % 3 + 1) * (1000 * (i % 3 + 1) - 1) / 2 + i
                                      for i in range(6)))
    # the live page: both workers by name, and the count grew after the first read
    assert live["workers"] == ["local-0", "local-1"]
    assert 1 <= live["first"] < live["second"] <= summary["bundles"]
    assert not live["errors"]

    record = {"events": 6000, "summary": summary}
    (tmp_path / "run.json").write_text(json.dumps(record))
    assert report is not None and report.exists()
    saved = page("saved", str(report))
    assert not saved["refused"] and not saved["errors"]  # no network asked for
    shown = {k: int(v.replace(",", "")) for k, v in saved["figures"].items()
             if v.replace(",", "").isdigit()}
    assert shown["bundles-sent"] == summary["bundles"] == saved["stream_bars"]
    assert shown["bundles-done"] == saved["bundles_done_shown"] == summary["bundles"]
    assert shown["tasks-done"] == shown["tasks"] == summary["tasks"]
    assert shown["events"] == record["events"]
    assert shown["near-bytes"] == summary["reads"]["near_bytes"] > 0  # local files: near
    assert shown["far-bytes"] == summary["reads"]["far_bytes"] == 0
    assert shown["files-done"] == shown["files"] == 3
    # the column cache: what the workers' memory served and what was decoded, as summed
    assert shown["cache-hit-bytes"] == summary["cache"]["hit_bytes"]
    assert shown["cache-decoded-bytes"] == summary["cache"]["miss_bytes"] > 0
    assert saved["figures"]["cache-hit-percent"] == f"{summary['cache']['hit_fraction']:.1%}"
    assert saved["workers"] == ["local-0", "local-1"]
