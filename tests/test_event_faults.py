"""Exactly once, under faults, on real workers: an AGC run and a coffea run each with a
worker killed (SIGKILL of its session) and frozen (SIGSTOP of its session) mid-run
(:mod:`datavine.apps.event_faults`). The fault strikes the worker keeping the first value
delivered, so that value is lost and made again: the events equal the dataset's entries,
the histograms, cutflow and sums equal the fault-free run's exactly, and neither the
progress nor the run summary counts a remade value twice (coffea's progress counted 290 of
280 events, the summary 20 of 19 tasks, before they were keyed by task).

The frozen worker is declared lost after ``worker_timeout_s``, set low here (5 s) so that
each test stays short; ``benchmarks/faults.py`` runs them with the default (15 s).
"""

from __future__ import annotations

from pathlib import Path

import pytest

from datavine.apps import event_faults
from datavine.apps.event_faults import EventCheck

pytestmark = [pytest.mark.taskvine, pytest.mark.faults]
FROZEN_TIMEOUT_S = 5.0


def assert_exactly_once(check: EventCheck) -> None:
    assert not check.error, check
    assert check.injected and 0 < check.struck_after < check.graph_tasks, check  # mid-run
    assert check.remade >= 1 and check.lost_workers, check  # the struck value was made again
    assert check.deliveries > check.graph_tasks, check  # ... and delivered again
    assert check.events == check.dataset_events, check
    assert check.same_as_fault_free, check
    assert check.tasks_counted == check.graph_tasks, check
    assert check.processes_left == 0, check
    assert check.ok, check


@pytest.fixture(scope="module")
def agc(tmp_path_factory: pytest.TempPathFactory) -> event_faults.Workload:
    data: Path = tmp_path_factory.mktemp("event-faults")
    data.chmod(0o755)
    return event_faults.agc_workload(data)


@pytest.mark.parametrize("fault", event_faults.FAULTS)
def test_agc_run_counts_every_event_once(agc: event_faults.Workload, fault: str) -> None:
    check = event_faults.check(agc, fault, worker_timeout_s=FROZEN_TIMEOUT_S)
    assert_exactly_once(check)
    assert check.counted_events is None  # the AGC run keeps no count of its own


@pytest.mark.coffea
@pytest.mark.filterwarnings("ignore:Missing cross-reference")
@pytest.mark.filterwarnings("ignore:Branch .* already exists")
@pytest.mark.parametrize("fault", event_faults.FAULTS)
def test_coffea_run_counts_every_event_once(fault: str) -> None:
    pytest.importorskip("coffea")
    check = event_faults.check(event_faults.coffea_workload(), fault,
                               worker_timeout_s=FROZEN_TIMEOUT_S)
    assert_exactly_once(check)
    assert check.counted_events == check.dataset_events == 280, check
