"""Benchmark: coffea's ``processor.Runner`` through four executors, whole calls timed.

One processor (MET and muon pT histograms, event, muon and 4-jet counts per dataset) over
two filesets:

- ``samples``: coffea's own NanoAOD samples (``nano_dy``, ``nano_tt_v12``,
  ``nano_dimuon``) in small chunks (``--samples-chunksize``): many tiny items, so the
  executors' own costs dominate;
- ``generated``: ``--files`` x ``--events-per-file`` NanoAOD-like events made by
  :mod:`datavine.io.datagen` (ZSTD) into ``build/bench-data/coffea`` (kept, outside git), read
  once before any clock starts so that every executor finds them in the page cache. This
  is the headline fileset.

Executors, each timed over the whole ``Runner`` call (preprocessing included: every run
gets an empty metadata cache):

- ``IterativeExecutor`` in this process;
- ``FuturesExecutor(workers=W)`` (its process pool starts inside the call);
- coffea's ``TaskVineExecutor`` with W local ``vine_worker`` s running this project's Python,
  started before the call (its manager starts inside the call, as for a user);
- ``DatavineExecutor(workers=W)``: "datavine" is its first call, which starts the
  executor's embedded cluster inside the clock; "datavine, warm" is a second ``Runner``
  call on the same executor (the cluster is reused). The headline is the first.

Every result must equal ``IterativeExecutor``'s (histograms and counts). The last line is
``key=value``: ``events_per_s`` (datavine on the generated fileset),
``ratio_vs_taskvine_executor``, ``ratio_vs_futures``, ``ratio_vs_iterative`` (events/s
ratios on the generated fileset) and the same ratios on the samples with a ``samples_``
prefix.

    .venv/bin/python benchmarks/coffea.py [--files 8 --events-per-file 500000]
        [--chunksize 100000] [--samples-chunksize 10] [--workers 2] [--repeat 1]
        [--peers iterative futures taskvine datavine] [--filesets samples generated]
"""

from __future__ import annotations

import argparse
import contextlib
import functools
import os
import sys
import warnings
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

# This file is named coffea.py: its folder must not stand before the coffea package on
# sys.path (python puts a script's folder first). It goes last, for ``common``.
HERE = Path(__file__).resolve().parent
sys.path[:] = [p for p in sys.path if Path(p or ".").resolve() != HERE]

import awkward as ak  # noqa: E402
import hist  # noqa: E402
import numpy as np  # noqa: E402
from coffea import processor  # noqa: E402
from coffea.nanoevents import NanoAODSchema  # noqa: E402

sys.path.append(str(HERE))
import common  # noqa: E402

from datavine.coffea import DatavineExecutor  # noqa: E402
from datavine.io.datagen import generate_dataset  # noqa: E402
from datavine.io.samples import coffea_sample  # noqa: E402

SAMPLES = ("nano_dy", "nano_tt_v12", "nano_dimuon")
PEERS = ("iterative", "futures", "taskvine", "datavine")


class Selection(processor.ProcessorABC):
    """MET and muon pT histograms; events, muons and events with >= 4 jets of pT > 25."""

    def process(self, events: Any) -> dict[str, Any]:
        dataset = events.metadata["dataset"]
        met = hist.Hist.new.Reg(40, 0, 200, name="met").Double()
        met.fill(met=ak.to_numpy(events.MET.pt))
        muon_pt = hist.Hist.new.Reg(20, 0, 100, name="pt").Double()
        muon_pt.fill(pt=ak.to_numpy(ak.flatten(events.Muon.pt)))
        jets = ak.sum(events.Jet.pt > 25, axis=1)
        return {dataset: {"met": met, "muon_pt": muon_pt, "events": len(events),
                          "muons": int(ak.sum(ak.num(events.Muon))),
                          "four_jets": int(ak.sum(jets >= 4))}}

    def postprocess(self, accumulator: Any) -> Any:
        return accumulator


def same(out: Any, ref: Any) -> bool:
    if out.keys() != ref.keys():
        return False
    for dataset, expected in ref.items():
        got = out[dataset]
        for key in ("events", "muons", "four_jets"):
            if got[key] != expected[key]:
                return False
        for key in ("met", "muon_pt"):
            if not np.array_equal(got[key].values(flow=True), expected[key].values(flow=True)):
                return False
    return True


def filesets(args: argparse.Namespace) -> dict[str, tuple[dict[str, list[str]], int]]:
    """name -> (fileset, chunksize)."""
    out: dict[str, tuple[dict[str, list[str]], int]] = {}
    if "samples" in args.filesets:
        out["samples"] = ({n: [str(coffea_sample(n))] for n in SAMPLES}, args.samples_chunksize)
    if "generated" in args.filesets:
        print(f"# generating {args.files} x {args.events_per_file:,} events (kept) ...",
              file=sys.stderr, flush=True)
        paths = generate_dataset(common.REPO / "build" / "bench-data" / "coffea", args.files,
                                 args.events_per_file, "zstd")
        for path in paths:  # into the page cache before any clock starts
            with open(path, "rb") as f:
                while f.read(1 << 24):
                    pass
        half = len(paths) // 2 or 1
        out["generated"] = ({"ttbar": [str(p) for p in paths[:half]],
                             "wjets": [str(p) for p in paths[half:]]}, args.chunksize)
    return out


def run_with(executor: Any, fileset: dict[str, list[str]], chunksize: int) -> Any:
    runner = processor.Runner(executor=executor, schema=NanoAODSchema, chunksize=chunksize,
                              metadata_cache={})
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # the samples' missing cross-references, per chunk
        return runner(fileset, treename="Events", processor_instance=Selection())


@contextlib.contextmanager
def taskvine_workers(workers: int) -> Iterator[tuple[int, Path]]:
    """``workers`` local vine_workers (this Python first on PATH) waiting for a manager on a
    free port with a fresh password; coffea's TaskVineExecutor starts that manager."""
    import socket

    from datavine.config import LocalWorkersConfig
    from datavine.deploy.local_workers import LocalWorkers
    from datavine.manager.cluster import make_password_file

    where = common.run_dir("coffea-taskvine")
    password = make_password_file(where)
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    pool = LocalWorkers(LocalWorkersConfig(workers=workers, cores=1), port, where / "workers",
                        password_file=password)
    pool.start()
    try:
        yield port, where
    finally:
        pool.stop()


class Peers(dict[str, Callable[[dict[str, list[str]], int], Any]]):
    """name -> run(fileset, chunksize); ``close()`` stops datavine's last embedded cluster."""

    def __init__(self, runs: dict[str, Callable[[dict[str, list[str]], int], Any]],
                 last: dict[str, DatavineExecutor]) -> None:
        super().__init__(runs)
        self.last = last

    def close(self) -> None:
        for executor in self.last.values():
            executor.close()


def peers(args: argparse.Namespace) -> Peers:
    """Executors are made per call, except datavine's warm run, which reuses the executor
    of the run just before it."""
    last: dict[str, DatavineExecutor] = {}

    def datavine(fileset: dict[str, list[str]], chunksize: int) -> Any:
        with contextlib.suppress(KeyError):
            last.pop("executor").close()
        last["executor"] = DatavineExecutor(workers=args.workers, status=False)
        return run_with(last["executor"], fileset, chunksize)

    def datavine_warm(fileset: dict[str, list[str]], chunksize: int) -> Any:
        return run_with(last["executor"], fileset, chunksize)

    def taskvine(fileset: dict[str, list[str]], chunksize: int) -> Any:
        from coffea.processor import TaskVineExecutor

        with taskvine_workers(args.workers) as (port, where):
            executor = TaskVineExecutor(port=port, password_file=str(where / "vine.password"),
                                        filepath=str(where), status=False, verbose=False)
            return run_with(executor, fileset, chunksize)

    table: dict[str, Callable[[dict[str, list[str]], int], Any]] = {
        "IterativeExecutor": lambda f, c: run_with(processor.IterativeExecutor(status=False),
                                                   f, c),
        "FuturesExecutor": lambda f, c: run_with(
            processor.FuturesExecutor(workers=args.workers, status=False), f, c),
        "TaskVineExecutor": taskvine,
        "datavine": datavine,
        "datavine, warm": datavine_warm,
    }
    wanted = {"iterative": ["IterativeExecutor"], "futures": ["FuturesExecutor"],
              "taskvine": ["TaskVineExecutor"], "datavine": ["datavine", "datavine, warm"]}
    return Peers({name: table[name] for peer in args.peers for name in wanted[peer]}, last)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--files", type=int, default=8)
    parser.add_argument("--events-per-file", type=int, default=500_000)
    parser.add_argument("--chunksize", type=int, default=100_000)
    parser.add_argument("--samples-chunksize", type=int, default=10)
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument("--repeat", type=int, default=1)
    parser.add_argument("--peers", nargs="+", choices=PEERS, default=list(PEERS))
    parser.add_argument("--filesets", nargs="+", choices=("samples", "generated"),
                        default=["samples", "generated"])
    args = parser.parse_args(argv)
    common.setup()
    print(f"# {common.machine_info()}", file=sys.stderr)
    kv: dict[str, Any] = {}
    for name, (fileset, chunksize) in filesets(args).items():
        ref = run_with(processor.IterativeExecutor(status=False), fileset, chunksize)
        events = sum(v["events"] for v in ref.values())
        runs = peers(args)
        rounds: dict[str, list[common.PeerResult]] = {peer: [] for peer in runs}
        for _ in range(args.repeat):
            for peer, run in runs.items():
                rounds[peer].append(common.measure(
                    peer, events, functools.partial(run, fileset, chunksize),
                    functools.partial(same, ref=ref)))
        runs.close()
        best = {peer: common.best_of(results) for peer, results in rounds.items()}
        for peer, results in rounds.items():
            if len(results) > 1:
                best[peer].note = "runs: " + ", ".join(f"{r.seconds:.1f} s" for r in results)
        print(f"\n## {name}: {events:,} events, chunksize {chunksize:,}, "
              f"{args.workers} workers\n")
        print(common.table(list(best.values()), "events"))
        ours = best.get("datavine")
        prefix = "" if name == "generated" else f"{name}_"
        rate = ours.rate if ours else None
        kv[f"{prefix}events_per_s"] = f"{rate:.0f}" if rate else "nan"
        for key, peer in (("taskvine_executor", "TaskVineExecutor"),
                          ("futures", "FuturesExecutor"), ("iterative", "IterativeExecutor")):
            other = best.get(peer)
            kv[f"{prefix}ratio_vs_{key}"] = common.ratio(rate, other.rate if other else None)
    print()
    print(common.kv_line(kv))
    return 0


if __name__ == "__main__":
    os.environ.setdefault("PYTHONWARNINGS", "ignore")
    sys.exit(main())
