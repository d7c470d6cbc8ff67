"""Workers ordered by bundles in flight: the best few below a bound, as a full sort says."""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from datavine.scheduler.least_busy import LeastBusy

IDS = [f"w{i}" for i in range(12)]
ops_st = st.lists(st.tuples(st.sampled_from(IDS), st.integers(-1, 4)), max_size=200)


@settings(max_examples=300, deadline=None)
@given(ops=ops_st, n=st.integers(1, 5), below=st.integers(0, 5))
def test_the_best_are_those_a_sort_puts_first(ops: list[tuple[str, int]], n: int,
                                              below: int) -> None:
    """``put`` and ``remove`` in any order (a count of -1 removes): ``best``, ``least`` and
    ``any_below`` answer as sorting every worker by (count, id) does, and asking changes
    nothing."""
    group, counts = LeastBusy(), {}
    for wid, count in ops:
        if count < 0:
            group.remove(wid)
            counts.pop(wid, None)
        else:
            group.put(wid, count)
            counts[wid] = count
    ranked = sorted(counts, key=lambda w: (counts[w], w))
    for _ in range(2):
        assert group.best(n, below) == [w for w in ranked if counts[w] < below][:n]
        assert group.least() == (ranked[0] if ranked else None)
        assert group.any_below(below) == any(c < below for c in counts.values())
        assert len(group) == len(counts)


def test_stale_entries_are_dropped_as_counts_change() -> None:
    group = LeastBusy()
    for i in range(1000):
        group.put("w", i % 3)
    assert len(group._heap) <= 2 * len(group) + 33
    assert group.best(3, 3) == ["w"]
