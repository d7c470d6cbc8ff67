"""A call cancelled after it ended on its worker (TaskVine patch 0017), on a real manager and
worker.

datavine cancels the other copy of a bundle when the first copy's result arrives, and a copy
often ends about when the other does: its completion message is then already on the wire.
A bundle's result travels as the call's standard output, over 1 KB for most results, which
the worker does not send inline. Stock TaskVine, finding no such task, waited for the whole
output's bytes on the worker's link: the manager stalled for the transfer timeout (60 s)
and swallowed what the worker sent meanwhile. These tests check that the next calls answer
(far within that timeout) and that a call finishing on the same worker meanwhile is not lost.
"""

from __future__ import annotations

import time
from pathlib import Path

from datavine.manager.runtime import Runtime
from tests.test_library_queue import Results, payload, sleep_then_mark

# the bound on an answer: the stall this guards against lasts 60 s, an answer takes < 1 s
ANSWER_S = 20.0


def big_result_after(seconds: float, mark: str) -> str:
    """Sleep, leave ``mark``, return 8 KB (its standard output is not sent inline)."""
    sleep_then_mark(seconds, mark)
    return "x" * 8192


def ended_unseen(rt: Runtime, results: Results, tmp_path: Path) -> tuple[int, int]:
    """A call with an 8 KB result that has ended on the worker, its completion not yet read
    by the manager, and a call queued behind it (still running: 2 s). The first runs 3 s,
    so the manager sees both sent before it ends."""
    ended = rt.submit_bundle(payload(rt, big_result_after, 3.0, str(tmp_path / "ended")),
                             500.0, (), None)
    assert results.until(lambda: rt.call_state(ended) == "RUNNING", 20)
    behind = rt.submit_bundle(payload(rt, sleep_then_mark, 2.0, str(tmp_path / "behind")),
                              500.0, (), None)
    assert results.until(lambda: rt.call_state(behind) == "RUNNING", 20)
    # no wait() from here: the manager reads nothing while ``ended`` ends on the worker
    deadline = time.monotonic() + 20
    while not (tmp_path / "ended").exists():
        assert time.monotonic() < deadline, "the first call did not run"
        time.sleep(0.05)
    time.sleep(0.5)  # its completion message has been sent
    assert rt.call_state(ended) == "RUNNING", "the manager read the completion already"
    return ended, behind


def test_a_call_cancelled_after_it_ended_holds_nothing_up(one_core: Runtime,
                                                          tmp_path: Path) -> None:
    rt = one_core
    results = Results(rt)
    ended, behind = ended_unseen(rt, results, tmp_path)
    rt.cancel(ended)
    after = rt.submit_bundle(payload(rt, sleep_then_mark, 0.0, str(tmp_path / "after")),
                             500.0, (), None)
    start = time.monotonic()
    got = results.wait_for({behind, after}, ANSWER_S)
    waited = time.monotonic() - start
    assert behind in got and got[behind].ok, (
        f"the call that ended on the worker after the cancel was lost ({waited:.1f} s): the "
        "manager swallowed its completion (TaskVine patch 0017 missing?)")
    assert after in got and got[after].ok, (
        f"the next call did not answer within {ANSWER_S:.0f} s: the manager stalled on the "
        "cancelled call's completion (TaskVine patch 0017 missing?)")
    assert ended not in results.got
