"""Work items that need more memory than the ceiling are split in halves by entry range.

A processor allocates a fixed amount per event, on real workers whose memory policy has a
low ceiling (512 MB: a library with coffea imported idles at ~190 MB): a 100-event chunk
at 8 MB per event overruns it, a 50-event half still does, a 25-event quarter does not. The
result must equal the one computed without the allocation.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest

pytest.importorskip("coffea")

import numpy as np
from coffea import processor

from datavine.coffea.executor import build_graph
from datavine.coffea.splitting import halves, split_failed_items
from datavine.coffea.tasks import ItemPolicy
from datavine.errors import MemoryCapError
from datavine.scheduler.memory import MemoryPolicy
from tests.test_coffea_executor import MetMuons, assert_same, fileset, iterative, on, runner

pytestmark = [
    pytest.mark.coffea,
    pytest.mark.filterwarnings("ignore:Missing cross-reference"),
    pytest.mark.filterwarnings("ignore:Branch .* already exists"),
]
CEILING_MB = 512.0


class AllocatesPerEvent(MetMuons):
    """MetMuons that first fills ``mb_per_event`` MB per event of its chunk."""

    def __init__(self, mb_per_event: float) -> None:
        super().__init__()
        self.mb_per_event = mb_per_event

    def process(self, events: Any) -> dict[str, Any]:
        block = np.ones(int(len(events) * self.mb_per_event * 2**20 / 8))
        assert block.sum() == block.size
        return super().process(events)


@pytest.fixture(scope="module")
def low_ceiling(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Any]:
    import datavine

    memory = MemoryPolicy(default_mb=CEILING_MB, ceiling_mb=CEILING_MB, floor_mb=256.0)
    with datavine.LocalCluster(
            workers=2, cores=1, manager=datavine.ManagerConfig(
                run_dir=tmp_path_factory.mktemp("low-ceiling")),
            run=datavine.RunConfig(memory=memory, no_worker_timeout_s=30)) as cluster:
        yield cluster


@pytest.mark.taskvine
def test_item_over_the_ceiling_is_split_recursively(low_ceiling: Any) -> None:
    files = fileset("nano_tt_v12")  # 200 events: two 100-event chunks
    ref = runner(iterative())(files, treename="Events", processor_instance=MetMuons())
    executor = on(low_ceiling, split_min_entries=10)
    out = runner(executor)(files, treename="Events", processor_instance=AllocatesPerEvent(8))
    assert_same(out, ref)
    call = executor.report.last
    assert call.desc == "Processing" and not call.failed
    split_sizes = [s.items for s in call.splits]
    assert any("[0:100]" in label for labels in split_sizes for label in labels)
    assert any(label.endswith(":50]") or "[50:" in label for labels in split_sizes
               for label in labels)  # a half was split again
    assert call.succeeded == 8  # both chunks in quarters of 25 events
    assert any("split" in line for line in executor.report.lines())


@pytest.mark.taskvine
def test_item_that_cannot_be_split_further_fails_naming_it(low_ceiling: Any) -> None:
    executor = on(low_ceiling, split_min_entries=50)
    with pytest.raises(MemoryCapError) as info:
        runner(executor)(fileset("nano_tt_v12"), treename="Events",
                         processor_instance=AllocatesPerEvent(16))
    assert any("cannot be split further" in n and "split_min_entries=50" in n
               for n in info.value.__notes__)


def test_halves_and_replacement_keep_order() -> None:
    chunks = list(runner(iterative()).preprocess(fileset("nano_tt_v12"), treename="Events"))
    first, second = halves(chunks[0], 10)
    assert (first.entrystart, first.entrystop, second.entrystart, second.entrystop) == (
        0, 50, 50, 100)
    assert halves(first, 26) is None and halves(processor.executor.FileMeta(
        "d", "f.root", "Events"), 1) is None
    graph, _ = build_graph(chunks, len, ItemPolicy(), 2, "P")
    keys = [k for k in graph if k[0] == "P-item" and k[2] == 1]
    error = MemoryCapError(keys, "P-item", 900.0, 512.0, "at the ceiling")
    items, split = split_failed_items(chunks, graph, error, 10)
    assert [(i.entrystart, i.entrystop) for i in items] == [(0, 100), (100, 150), (150, 200)]
    assert split.items == (f"nano_tt_v12:{chunks[1].filename}[100:200]",)
