"""A coffea processor run on TaskVine workers through datavine: one changed line.

    .venv/bin/python examples/coffea_runner.py [--workers N] [--chunksize N]

Runs a small processor (MET histogram, muon counts) over coffea's real NanoAOD sample
``nano_dy.root`` (fetched from coffea's source distribution on first use) with
``processor.Runner(executor=DatavineExecutor(...))``, which starts local workers for the run
(``with executor:`` keeps them for both of the Runner's steps), then prints the histogram
and what the executor did. The processor class lives in this script (``__main__``), so
cloudpickle sends it to the workers by value; for a processor in a module of your own that
the workers cannot import, pass ``DatavineExecutor(pickle_by_value=("your_module",))``.
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
from datavine.samples import coffea_sample


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
    with executor:  # one set of local workers for preprocessing and processing
        out = run(fileset, treename="Events", processor_instance=MetAndMuons())

    result = out["DYJets"]
    print(f"DYJets: {result['events']} events, {result['muons']} muons")
    print(result["met"])
    for call in executor.report.calls:
        print(f"{call.desc}: {call.items} items, {call.succeeded} succeeded, "
              f"{len(call.skipped)} skipped, {call.wall_s:.1f} s")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
