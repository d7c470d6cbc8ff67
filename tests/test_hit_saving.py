"""What a read from a worker's memory saves over one from the file, learned from bundles'
times and decoded bytes (pure)."""

from __future__ import annotations

import pytest

from datavine.protocol import ReadRecordDict
from datavine.scheduler.hit_saving import HitSaving, bytes_split

MB = 1_000_000


def test_a_cold_read_and_a_hit_are_told_apart_by_bundles_that_mix_them() -> None:
    """Cold reads of 60 ms and hits of 12 ms (the default scale test's ZSTD chunks, about):
    bundles of a cold read alone and of a cold read with its file's later passes."""
    learned = HitSaving()
    for _ in range(3):
        learned.observe("chunk", 1, 0.060, decoded=17 * MB, cached=0)
        learned.observe("chunk", 8, 0.060 + 7 * 0.012, decoded=17 * MB, cached=7 * 17 * MB)
    assert learned.saving_s("chunk") == pytest.approx(0.048, rel=1e-6)
    costs = learned.costs("chunk")
    assert costs is not None
    assert (costs.hit_s, costs.cold_s) == pytest.approx((0.012, 0.060), rel=1e-6)
    assert learned.saving_s("other") is None and learned.costs("other") is None


def test_one_kind_of_bundle_alone_tells_nothing() -> None:
    learned = HitSaving()
    for _ in range(4):  # all cold reads alone: a task's base and its decoding are one
        learned.observe("chunk", 1, 0.05, decoded=MB, cached=0)
    assert learned.saving_s("chunk") is None
    for _ in range(4):  # and bundles without a column cache teach nothing
        learned.observe("chunk", 8, 0.1, decoded=0, cached=0)
    assert learned.saving_s("chunk") is None
    learned.observe("chunk", 4, 0.04, decoded=0, cached=4 * MB)  # hits: now it is told
    assert learned.saving_s("chunk") == pytest.approx(0.04, rel=1e-6)


def test_recent_bundles_count_most() -> None:
    """The files get slower to decode (a codec change, a loaded host): the saving follows."""
    learned = HitSaving()
    for cold_s in [0.05] * 5 + [0.5] * 30:
        learned.observe("chunk", 1, cold_s, decoded=MB, cached=0)
        learned.observe("chunk", 4, 0.03, decoded=0, cached=4 * MB)
    saving = learned.saving_s("chunk")
    assert saving is not None and saving == pytest.approx(0.5 - 0.0075, rel=0.01)


def test_bytes_split_sums_what_was_decoded_and_served() -> None:
    def read(lfn: str, **counts: int) -> ReadRecordDict:
        return ReadRecordDict(lfn=lfn, server="local", rack=None, bytes=0, failovers=0,
                              errors=(), **counts)  # type: ignore[typeddict-item]

    reads = [read("a", decoded=5, cached=7), read("b"), read("a@0-10", cached=2)]
    assert bytes_split(reads) == (5, 9)
