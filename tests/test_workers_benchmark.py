"""``benchmarks/workers.py``: where the clusters' folders go (``--workspaces``), that
the benchmark says so, and that its folder on the memory filesystem is gone after the run,
with datavine's and DaskVine's clusters in it; and the CPU it reads beside the manager's
(the workers' sessions', the host's) from /proc (no timing asserted: the figures are the
host's)."""

from __future__ import annotations

import subprocess
import sys
import tempfile
import time
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "benchmarks"))

import common  # noqa: E402  (the benchmarks' shared module, from their folder)


def test_the_filesystem_of_a_path_is_its_longest_mount() -> None:
    assert common.filesystem_of(Path("/proc")) == "proc"
    assert common.filesystem_of(Path("/proc/self/status")) == "proc"  # below a mount point
    assert common.filesystem_of(Path("/")) != ""


def test_memory_scratch_is_a_tmpfs_or_none() -> None:
    scratch = common.memory_scratch()
    tmpfs = common.filesystem_of(common.MEMORY_SCRATCH) == "tmpfs"
    assert scratch == (common.MEMORY_SCRATCH if tmpfs else None)


def _leftovers(root: Path) -> set[str]:
    return {p.name for p in root.glob("workers-bench-*")}


@pytest.mark.parametrize("where", ["memory", "disk"])
def test_the_benchmark_names_its_workspaces_and_leaves_no_folder(where: str) -> None:
    """``memory`` is the default: that case passes no ``--workspaces``."""
    scratch = common.memory_scratch()
    if where == "memory" and scratch is None:
        pytest.skip(f"{common.MEMORY_SCRATCH} is not a writable tmpfs here")
    before = _leftovers(scratch) if scratch is not None else set()
    done = subprocess.run(
        [sys.executable, str(ROOT / "benchmarks" / "workers.py"), "--counts", "2", "--sleep",
         "0.2", "--waves", "1", "--repeat", "1", "--daskvine-max", "2", "--distributed-max",
         "0", *(["--workspaces", where] if where != "memory" else [])],
        capture_output=True, text=True, timeout=240, cwd=ROOT)
    assert done.returncode == 0, done.stderr[-3000:]
    named = [line for line in done.stdout.splitlines() if line.startswith("# workspaces: ")]
    assert len(named) == 1
    if where == "memory":
        assert named[0] == f"# workspaces: {scratch} (tmpfs)"
    else:  # the system's temporary folder, as this process sees it
        assert named[0].startswith(f"# workspaces: {tempfile.gettempdir()} (")
    pairs = dict(item.split("=") for item in done.stdout.strip().splitlines()[-1].split())
    assert pairs["largest"] == "2" and pairs["workers_lost"] == "0"
    assert "daskvine_fc_concurrency_ratio_2" in pairs  # the peer ran in the same folder
    assert "Could not open" not in done.stderr  # its manager's last log found its folder
    # the CPU beside the manager's, for the one count
    assert float(pairs["workers_cpu_ms_per_bundle_2"]) >= 0.0
    assert 0.0 < float(pairs["host_busy_2"]) <= 1.0
    if scratch is not None:  # the run's folder there (memory) is removed; none is made (disk)
        assert _leftovers(scratch) == before


def test_the_workers_cpu_is_that_of_their_sessions_only() -> None:
    """A process that burns CPU in a session of its own is counted under that session (its
    reaped child as well), and not under another: the workers' CPU beside the manager's."""
    import workers

    burn = ("import os, time\n"
            "def spin(s):\n"
            "    end = time.process_time() + s\n"
            "    while time.process_time() < end: pass\n"
            "if os.fork() == 0:\n"
            "    spin(0.3); os._exit(0)\n"
            "os.wait(); spin(0.3); print('done', flush=True); time.sleep(30)\n")
    proc = subprocess.Popen([sys.executable, "-c", burn], stdout=subprocess.PIPE, text=True,
                            start_new_session=True)
    try:
        assert proc.stdout is not None and proc.stdout.readline().strip() == "done"
        counted = workers.sessions_cpu_s({proc.pid})
        assert 0.5 <= counted < 5.0  # its own 0.3 s and its reaped child's 0.3 s
        assert workers.sessions_cpu_s({proc.pid + 10**7}) == 0.0  # no such session
    finally:
        proc.kill()
        proc.wait()


def test_the_hosts_busy_ticks_grow_with_work_and_stay_within_all() -> None:
    busy0, all0 = common.host_cpu()
    end = time.process_time() + 0.2
    while time.process_time() < end:
        pass
    busy1, all1 = common.host_cpu()
    assert busy1 - busy0 >= 10  # 0.2 s of this process at 100 ticks a second, at least half
    assert 0 < busy1 - busy0 <= all1 - all0
