"""A small coffea processor over CMS NanoAOD: histograms, a cutflow and sums per dataset.

What the fault scenarios (:mod:`datavine.apps.event_faults`) run through coffea's
``processor.Runner``: every figure is a sum over events (integer counts, or histograms of
unit weights), so a run that loses or repeats a chunk differs from a fault-free one, and any
two runs that process each event once agree exactly. Imports coffea: load it only where
coffea is installed (its workers import it by name).
"""

from __future__ import annotations

from typing import TypeAlias

import awkward as ak
import hist
import numpy as np
from coffea import processor

Output: TypeAlias = dict[str, dict[str, object]]  # dataset -> figure name -> figure

CUTS = ("all", ">=1 muon", ">=2 muons", "MET > 20")


class NanoCutflow(processor.ProcessorABC):
    """Per dataset: the MET and muon pT histograms, a cutflow (:data:`CUTS`), the events
    and muons seen and the sum of MET."""

    def process(self, events: ak.Array) -> Output:
        dataset = events.metadata["dataset"]
        met = ak.to_numpy(events.MET.pt)
        muons = ak.num(events.Muon)
        met_hist = hist.Hist.new.Reg(40, 0, 200, name="met").Double()
        met_hist.fill(met=met)
        muon_pt = hist.Hist.new.Reg(20, 0, 100, name="pt").Double()
        muon_pt.fill(pt=ak.to_numpy(ak.flatten(events.Muon.pt)))
        cutflow = {CUTS[0]: len(events), CUTS[1]: int(ak.sum(muons >= 1)),
                   CUTS[2]: int(ak.sum(muons >= 2)),
                   CUTS[3]: int(np.count_nonzero(met > 20))}
        return {dataset: {"met": met_hist, "muon_pt": muon_pt, "cutflow": cutflow,
                          "events": len(events), "muons": int(ak.sum(muons)),
                          "met_sum": float(np.sum(met, dtype=np.float64))}}

    def postprocess(self, accumulator: Output) -> Output:
        return accumulator


def events_in(output: Output) -> int:
    """Events the output counted, over its datasets."""
    total = 0
    for figures in output.values():
        count = figures.get("events", 0)
        total += count if isinstance(count, int) else 0
    return total
