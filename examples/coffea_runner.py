"""A coffea processor run on TaskVine workers through datavine: one changed line.

    .venv/bin/python examples/coffea_runner.py [--workers N] [--chunksize N]

Runs a small processor (MET histogram, muon counts) over coffea's real NanoAOD sample
``nano_dy.root`` (fetched from coffea's source distribution on first use) with
``processor.Runner(executor=DatavineExecutor(...))``, which starts local workers at its first
call and keeps them for all of them (``with executor:`` stops them at the end), then prints
the histogram and what the executor did. The processor class lives in this script
(``__main__``); a processor in a module of your own next to the script works the same way:
the executor sends code the workers cannot import by value.
"""

from __future__ import annotations

import argparse
import warnings
from typing import Any

import awkward as ak
import hist
from coffea import processor
from coffea.nanoevents import NanoAODSchema

from datavine.coffea import DatavineExecutor
from datavine.io.samples import coffea_sample


class MetAndMuons(processor.ProcessorABC):
    """MET pT histogram, and event and muon counts, per dataset."""

    def process(self, events: Any) -> dict[str, Any]:
        met = hist.Hist.new.Reg(20, 0, 200, name="met", label="MET pT [GeV]").Double()
        met.fill(met=ak.to_numpy(events.MET.pt))
        return {events.metadata["dataset"]: {
            "met": met, "events": len(events), "muons": int(ak.sum(ak.num(events.Muon)))}}

    def postprocess(self, accumulator: Any) -> Any:
        return accumulator


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--workers", type=int, default=2, help="local 1-core workers")
    parser.add_argument("--chunksize", type=int, default=10, help="events per work item")
    args = parser.parse_args()
    # coffea's test samples lack some NanoAOD cross-references; coffea warns per chunk.
    warnings.filterwarnings("ignore", message="Missing cross-reference")

    fileset = {"DYJets": [str(coffea_sample("nano_dy"))]}
    executor = DatavineExecutor(workers=args.workers, skipbadfiles=True)
    run = processor.Runner(executor=executor, schema=NanoAODSchema, chunksize=args.chunksize,
                           skipbadfiles=True)
    with executor:  # local workers for preprocessing and processing, stopped at the end
        out = run(fileset, treename="Events", processor_instance=MetAndMuons())

    result = out["DYJets"]
    print(f"DYJets: {result['events']} events, {result['muons']} muons")
    print(result["met"])
    print("\n".join(executor.report.lines()))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
