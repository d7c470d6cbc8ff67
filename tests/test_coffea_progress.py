"""Progress in events, and Ctrl-C returning the merge of what finished.

The interrupt is a real SIGINT sent to this process once all but one work item finished;
the last item sleeps on its worker. The executor must return the merge of the finished
items, equal to ``IterativeExecutor`` on those items, with a clear partial note.
"""

from __future__ import annotations

import os
import signal
import threading
import time
from collections.abc import Iterator
from typing import Any

import pytest

pytest.importorskip("coffea")

from datavine.coffea import PartialResultWarning
from datavine.coffea.progress import CallProgress
from tests.test_coffea_executor import (
    SAMPLES,
    MetMuons,
    assert_same,
    fileset,
    iterative,
    on,
    runner,
)

pytestmark = [
    pytest.mark.coffea, pytest.mark.taskvine,
    pytest.mark.filterwarnings("ignore:Missing cross-reference"),
    pytest.mark.filterwarnings("ignore:Branch .* already exists"),
]
SLEEP_S = 20.0


class SlowAt(MetMuons):
    """MetMuons whose item at ``slow`` (dataset, entrystart) sleeps first."""

    def __init__(self, slow: tuple[str, int]) -> None:
        super().__init__()
        self.slow = slow

    def process(self, events: Any) -> dict[str, Any]:
        meta = events.metadata
        if (meta["dataset"], meta["entrystart"]) == self.slow:
            time.sleep(SLEEP_S)
        return super().process(events)


@pytest.fixture(scope="module")
def own_cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Any]:
    """A cluster of its own: the interrupted item keeps its worker busy for a while."""
    import datavine

    manager = datavine.ManagerConfig(run_dir=tmp_path_factory.mktemp("interrupt"))
    with datavine.LocalCluster(workers=2, cores=1, manager=manager,
                               run=datavine.RunConfig(no_worker_timeout_s=30)) as cluster:
        yield cluster


def test_progress_counts_events(cluster: Any) -> None:
    files = fileset(*SAMPLES)
    chunks = list(runner(iterative()).preprocess(files, treename="Events"))
    executor = on(cluster)
    executor.status = True  # the bars: submitted / processed / accumulated, in events
    out = runner(executor)(chunks, processor_instance=MetMuons())
    total = sum(c.entrystop - c.entrystart for c in chunks)
    assert executor.report.last.processed == (total, total, "events")
    assert sum(v["events"] for v in out.values()) == total
    assert f"{total:,} of {total:,} events processed" in "\n".join(executor.report.lines())


def test_ctrl_c_returns_the_merge_of_what_finished(own_cluster: Any) -> None:
    chunks = list(runner(iterative()).preprocess(fileset(*SAMPLES), treename="Events"))
    slow = next(c for c in chunks if c.dataset == "nano_tt_v12" and c.entrystart > 0)
    ref = runner(iterative())([c for c in chunks if c != slow], processor_instance=MetMuons())
    runtime = own_cluster.runtime

    def interrupt_when_all_but_one_finished() -> None:
        deadline = time.monotonic() + 120
        while time.monotonic() < deadline:
            # the executor's progress, subscribed to the cluster's results during its call
            progress = [h for h in runtime.result_hooks if isinstance(h, CallProgress)]
            if progress and progress[0].items_done >= len(chunks) - 1:
                os.kill(os.getpid(), signal.SIGINT)
                return
            time.sleep(0.05)

    watcher = threading.Thread(target=interrupt_when_all_but_one_finished, daemon=True)
    executor = on(own_cluster, merge_fanin=2)
    watcher.start()
    with pytest.warns(PartialResultWarning, match="PARTIAL"):
        out = runner(executor)(chunks, processor_instance=SlowAt((slow.dataset,
                                                                  slow.entrystart)))
    watcher.join(timeout=5)
    assert_same(out, ref)
    record = executor.report.last
    assert record.succeeded == len(chunks) - 1 and record.interrupted
    assert f"{len(chunks) - 1} of {len(chunks)} work items" in record.interrupted
    assert any("INTERRUPTED" in line for line in executor.report.lines())
