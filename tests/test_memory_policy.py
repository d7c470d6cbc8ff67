"""The memory-cap policy (pure): initial caps, learning, escalation, giving up."""

from __future__ import annotations

import math

import pytest
from hypothesis import example, given, settings
from hypothesis import strategies as st

from datavine.config import ConfigError
from datavine.scheduler.memory import GiveUp, MemoryPolicy, MemoryState, Retry

POLICY = MemoryPolicy(default_mb=1024, ceiling_mb=4096, floor_mb=256, headroom=1.25,
                      growth=2.0, per_category={"big": 2048}, step_mb=64, min_samples=3)


def test_initial_caps_come_from_the_category_or_the_default() -> None:
    state = MemoryState(POLICY)
    assert state.cap_for("big") == 2048
    assert state.cap_for("anything") == 1024


def test_learning_lowers_a_cap_only_after_enough_samples() -> None:
    state = MemoryState(POLICY)
    state.record_peak("f", 300)
    state.record_peak("f", 400)
    assert state.cap_for("f") == 1024  # two samples: keep the initial cap
    state.record_peak("f", 350)
    assert state.cap_for("f") == 512  # 400 x 1.25 = 500, rounded up to 512


def test_learning_raises_a_cap_at_once() -> None:
    state = MemoryState(POLICY)
    state.record_peak("f", 1500)
    assert state.cap_for("f") == 1920  # 1875 rounded up to a multiple of 64


def test_learned_caps_stay_within_floor_and_ceiling() -> None:
    state = MemoryState(POLICY)
    for _ in range(3):
        state.record_peak("tiny", 1)
        state.record_peak("huge", 10_000)
    assert state.cap_for("tiny") == 256
    assert state.cap_for("huge") == 4096


def test_overrun_doubles_the_cap_then_gives_up_at_the_ceiling() -> None:
    state = MemoryState(POLICY)
    first = state.after_overrun("f", 1024, 1100)
    assert first == Retry(2048)
    assert state.after_overrun("f", 2048, 2100) == Retry(4096)
    final = state.after_overrun("f", 4096, 4100)
    assert isinstance(final, GiveUp)
    assert "ceiling" in final.reason and "'f'" in final.reason
    assert state.categories["f"].overruns == 3


def test_overrun_uses_the_peak_when_it_is_far_above_the_cap() -> None:
    state = MemoryState(POLICY)
    assert state.after_overrun("f", 512, 1800) == Retry(2304)  # 1800 x 1.25 = 2250 -> 2304


def test_a_peak_over_the_ceiling_gives_up_at_once() -> None:
    state = MemoryState(POLICY)
    decision = state.after_overrun("f", 1024, 5000)
    assert isinstance(decision, GiveUp) and "5000 MB" in decision.reason


def test_an_overrun_raises_the_cap_of_later_tasks_of_the_category() -> None:
    state = MemoryState(POLICY)
    state.after_overrun("f", 1024, 1030)
    assert state.cap_for("f") >= 1030 * 1.25


def test_dominant_category_is_the_one_with_the_largest_cap() -> None:
    state = MemoryState(POLICY)
    assert state.dominant_category(["a", "big", "b"]) == "big"
    with pytest.raises(ValueError):
        state.dominant_category([])


def test_as_dict_reports_every_category() -> None:
    state = MemoryState(POLICY)
    state.record_peak("f", 100)
    assert state.as_dict() == {"f": {"samples": 1, "max_peak_mb": 100.0, "overruns": 0,
                                     "cap_mb": 1024}}


@pytest.mark.parametrize("kwargs", [
    {"floor_mb": 0}, {"floor_mb": 5000}, {"default_mb": 100}, {"default_mb": 9000},
    {"per_category": {"x": 10}}, {"headroom": 0.9}, {"growth": 1.0}, {"step_mb": 0},
    {"min_samples": 0},
])
def test_invalid_policies_are_refused_naming_the_setting(kwargs: dict[str, object]) -> None:
    with pytest.raises(ConfigError, match="MemoryPolicy"):
        MemoryPolicy(**{"default_mb": 1024, "ceiling_mb": 4096, "floor_mb": 256,
                        **kwargs})  # type: ignore[arg-type]


@pytest.mark.parametrize("bad", [-1.0, math.nan, math.inf])
def test_invalid_measurements_are_refused(bad: float) -> None:
    state = MemoryState(POLICY)
    with pytest.raises(ValueError, match="peak_mb"):
        state.record_peak("f", bad)


def test_the_policy_is_not_changed_through_the_callers_dict() -> None:
    caps = {"a": 1000.0}
    policy = MemoryPolicy(per_category=caps)
    caps["a"] = 5000.0
    assert policy.initial_cap("a") == 1000.0


# ---------------------------------------------------------------------------------------------
policies = st.builds(
    lambda floor, span, default_frac, headroom, growth, step, min_samples: MemoryPolicy(
        floor_mb=floor, ceiling_mb=floor * span,
        # min(): floor + (ceiling - floor) x 1.0 can round one ulp above the ceiling
        default_mb=min(floor * span, floor + (floor * span - floor) * default_frac),
        headroom=headroom, growth=growth, step_mb=step, min_samples=min_samples),
    st.floats(16, 4096), st.floats(1, 64), st.floats(0, 1), st.floats(1, 3),
    st.floats(1.1, 4), st.sampled_from([1.0, 16.0, 64.0, 100.0]), st.integers(1, 5))
events = st.lists(st.tuples(st.sampled_from(["a", "b", "c"]), st.booleans(),
                            st.floats(0, 100_000)), max_size=40)


@settings(max_examples=300, deadline=None)
@given(policies, events)
def test_caps_never_leave_floor_and_ceiling(policy: MemoryPolicy,
                                            history: list[tuple[str, bool, float]]) -> None:
    state = MemoryState(policy)
    for category, overrun, peak in history:
        cap = state.cap_for(category)
        assert policy.floor_mb <= cap <= policy.ceiling_mb
        if overrun:
            decision = state.after_overrun(category, cap, peak)
            if isinstance(decision, Retry):
                assert policy.floor_mb <= decision.cap_mb <= policy.ceiling_mb
        else:
            state.record_peak(category, peak)
    for category in "abc":
        assert policy.floor_mb <= state.cap_for(category) <= policy.ceiling_mb


@settings(max_examples=300, deadline=None)
@given(policies, st.floats(0, 200_000), st.floats(0, 1))
@example(MemoryPolicy(floor_mb=16.0, ceiling_mb=16.000000000000004, default_mb=16.0,
                      headroom=1.0, growth=2.0, step_mb=1.0, min_samples=1), 17.0, 0.0)
def test_escalation_is_strictly_monotone_and_ends(policy: MemoryPolicy, need: float,
                                                  overshoot: float) -> None:
    """One task that needs ``need`` MB: each kill raises its cap until it fits or gives up."""
    state = MemoryState(policy)
    cap = state.cap_for("t")
    retries = 0
    while need > cap:
        peak = cap + (need - cap) * overshoot  # killed somewhere between its cap and its need
        decision = state.after_overrun("t", cap, peak)
        if isinstance(decision, GiveUp):
            assert need > policy.ceiling_mb or cap >= policy.ceiling_mb
            break
        assert decision.cap_mb > cap
        cap = decision.cap_mb
        retries += 1
    assert retries <= policy.max_retries
    if need <= policy.ceiling_mb:
        assert cap >= need  # it fits once it got there


@settings(max_examples=300, deadline=None)
@given(policies, st.lists(st.floats(0, 50_000), min_size=1, max_size=60))
def test_learning_converges_to_the_largest_peak_with_headroom(policy: MemoryPolicy,
                                                              peaks: list[float]) -> None:
    """After a pass over a workload, a second pass of the same tasks has no overrun (when
    they fit under the ceiling), and the cap is the largest peak x headroom, rounded."""
    state = MemoryState(policy)

    def run_pass() -> int:
        overruns = 0
        for need in peaks:
            cap = state.cap_for("t")
            while need > cap:
                overruns += 1
                decision = state.after_overrun("t", cap, need)
                if isinstance(decision, GiveUp):
                    break
                cap = decision.cap_mb
            else:
                state.record_peak("t", need)
        return overruns

    run_pass()
    fits = max(peaks) <= policy.ceiling_mb
    if fits:
        assert run_pass() == 0
    if state.categories["t"].samples >= policy.min_samples:
        assert state.cap_for("t") == policy.clamp(max(peaks) * policy.headroom)
    else:
        assert state.cap_for("t") >= min(policy.ceiling_mb, max(peaks))


def test_a_learned_cap_leaves_the_column_cache_its_share_on_top() -> None:
    state = MemoryState(POLICY, cache_share=0.5)
    for peak in (300, 400, 350):
        state.record_peak("f", peak)
    # need 400 x 1.25 = 500; the cache's half of the cap on top: 1000
    assert state.cap_for("f") == 1024
    bounded = MemoryState(POLICY, cache_share=0.5, cache_mb=100)
    for peak in (300, 400, 350):
        bounded.record_peak("f", peak)
    assert bounded.cap_for("f") == 640  # 500 + at most 100 MB of cache, rounded up


def test_the_cache_a_process_held_is_not_a_tasks_need() -> None:
    """A cap learned from peaks that held the cache squeezed it, run after run: the cache
    part of a peak is left out, whatever the cache held."""
    cached, plain = MemoryState(POLICY, cache_share=0.5), MemoryState(POLICY, cache_share=0.5)
    for own, cache in ((300, 600), (400, 100), (350, 900)):
        cached.record_peak("f", own + cache, cache)
        plain.record_peak("f", own)
    assert cached.cap_for("f") == plain.cap_for("f") == 1024
    state = MemoryState(POLICY)
    state.record_peak("f", 100, 500)  # a cache freed during the task: nothing below 0
    assert state.categories["f"].max_peak_mb == 0
    with pytest.raises(ValueError, match="cache_mb"):
        state.record_peak("f", 100, -1)
