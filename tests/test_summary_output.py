"""The run summary as printed where stdout/stderr is not a terminal (a pipe, a CI log, a
file): each line of ``RunSummary.lines()`` comes out whole and as written.

rich's console is 80 columns wide when it does not write to a terminal, and wrapped a
longer summary line (``... 0.0 MB worker to`` / ``worker``); it also read ``[...]`` in a
note as markup and dropped it.
"""

from __future__ import annotations

import io
import os
import subprocess
import sys
import textwrap

from rich.console import Console

from datavine.manager.progress import RunProgress
from datavine.scheduler.summary import CategoryStats, RunSummary


def long_summary() -> RunSummary:
    """A summary whose lines run past 80 columns: traffic, reads, backups, a note with
    brackets, a failure."""
    summary = RunSummary(tasks=1_234, bundles=321, retries=2, wall_s=12.5, workers=64,
                         recomputed=3)
    summary.categories["agc-chunk"] = CategoryStats(tasks=1_000, seconds=812.4, peak_mb=612,
                                                    cap_mb=2_048)
    summary.traffic.manager_out, summary.traffic.kept, summary.traffic.peer = 12_345, 9 << 20, 0
    summary.reads.opens, summary.reads.near_bytes, summary.reads.far_bytes = 16, 3 << 30, 1 << 20
    summary.backups.started, summary.backups.late, summary.backups.won = 4, 4, 3
    summary.notes.append("a dead worker's [transfer server] held the manager's connection; "
                         "its processes were stopped by the watch thread")
    summary.failures.append("agc-chunk-7 on worker w-3: MemoryCapError over 2048 MB "
                            "(category agc-chunk, ceiling reached)")
    return summary


def test_the_summary_is_printed_unwrapped_into_a_file() -> None:
    summary = long_summary()
    expected = summary.lines()
    assert max(len(line) for line in expected) > 80  # else this test proves nothing
    assert any(line.endswith("MB worker to worker") for line in expected)
    out = io.StringIO()
    console = Console(file=out, width=80)  # what rich picks for a pipe
    assert not console.is_terminal
    RunProgress(1, enabled=False, console=console).print_summary(summary)
    assert out.getvalue().splitlines() == expected


def test_the_summary_is_printed_unwrapped_into_a_pipe() -> None:
    """The default console (stderr, as ``datavine run`` prints it) into a real pipe."""
    script = textwrap.dedent("""
        import sys
        sys.path.insert(0, sys.argv[1])
        from test_summary_output import long_summary
        from datavine.manager.progress import RunProgress
        RunProgress(1, enabled=False).print_summary(long_summary())
    """)
    env = {k: v for k, v in os.environ.items() if k not in ("COLUMNS", "FORCE_COLOR")}
    done = subprocess.run([sys.executable, "-c", script, os.path.dirname(__file__)],
                          capture_output=True, text=True, timeout=60, env=env, check=False)
    assert done.returncode == 0, done.stderr
    assert done.stderr.splitlines() == long_summary().lines()
