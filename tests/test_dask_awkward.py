"""hist.dask on real NanoAOD through coffea's dask path (dask-awkward), run on datavine.

coffea's ``NanoEventsFactory.from_root(..., mode="dask")`` builds dask-awkward collections;
dask-awkward pins dask < 2025.4, so these graphs reach the scheduler as classic dict graphs
(HighLevelGraphs). The test runs in ``.venv-legacy`` (``scripts/test.sh`` does that) and
skips cleanly where dask-awkward or coffea is not importable (``.venv``: dask >= 2025.4 has
no dask-awkward). The sample is coffea's own ``nano_dy.root`` (40 events), read in 4 steps.
"""

from __future__ import annotations

import warnings
from typing import Any

import pytest

dak = pytest.importorskip("dask_awkward", reason="dask-awkward is not installed (it needs "
                          "dask < 2025.4: run this in .venv-legacy)")
nanoevents = pytest.importorskip("coffea.nanoevents", reason="coffea is not installed")
hda = pytest.importorskip("hist.dask", reason="hist.dask (dask-histogram) is not installed")

pytestmark = [pytest.mark.taskvine, pytest.mark.coffea]

STEPS = 4
DY_EVENTS = 40


def dy_events() -> Any:
    """coffea's NanoAOD Drell-Yan sample as a dask-awkward array of 4 partitions."""
    from datavine.io.samples import coffea_sample

    path = coffea_sample("nano_dy")
    with warnings.catch_warnings():
        # coffea warns about steps_per_file and the sample's missing cross-references.
        warnings.simplefilter("ignore", RuntimeWarning)
        return nanoevents.NanoEventsFactory.from_root(
            {str(path): "Events"}, schemaclass=nanoevents.NanoAODSchema, steps_per_file=STEPS,
            mode="dask").events()


def met_histogram(events: Any) -> Any:
    return hda.Hist.new.Reg(50, 0.0, 200.0, name="met", label="MET pT [GeV]").Double().fill(
        events.MET.pt)


def test_graph_reaches_the_scheduler_as_a_dict_graph() -> None:
    events = dy_events()
    assert events.npartitions == STEPS
    graph = met_histogram(events).__dask_graph__()
    assert hasattr(graph, "layers"), "dask < 2025.4 collections carry HighLevelGraphs"


def test_met_histogram_on_datavine_equals_the_sync_scheduler(cluster: Any) -> None:
    events = dy_events()
    on_datavine = met_histogram(events).compute(scheduler=cluster.get)
    reference = met_histogram(events).compute(scheduler="sync")
    assert on_datavine.sum() == DY_EVENTS == reference.sum()
    assert on_datavine == reference
    assert cluster.last_summary.tasks >= STEPS


def test_several_collections_in_one_compute(cluster: Any) -> None:
    import dask

    events = dy_events()
    h = met_histogram(events)
    n_muons = dak.sum(dak.num(events.Muon, axis=1))
    hist_result, muons = dask.compute(h, n_muons, scheduler=cluster.get)
    hist_ref, muons_ref = dask.compute(h, n_muons, scheduler="sync")
    assert hist_result == hist_ref and hist_result.sum() == DY_EVENTS
    assert muons == muons_ref
