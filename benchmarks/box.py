"""Benchmark: datavine across real hosts, racks and a shaped inter-rack link (the box).

A facility in a box (:mod:`datavine.deploy.box`): a manager host (manager, origin xrootd),
``--racks`` racks of ``--hosts-per-rack`` hosts behind their own routers, an XCache shard on
the first host of each rack, one 1-core ``vine_worker`` per rack host, and the racks joined
only through a spine shaped to ``--link-mbit`` (tc tbf). The data: ``--files`` generated
NanoAOD-like ZSTD files of ``--events`` events, read through the shards. Every scenario gets
a fresh box (cold caches, new workers, counters from zero) and runs ``datavine run
--facility`` on the manager host, as a user logged into it would:

- ``datavine``: placement near the data (the workers say their racks when they connect);
- ``blind``: ``[placement] enabled = false`` (TaskVine places bundles anywhere);
- ``peers-cut``: datavine with the racks unable to reach each other (blackhole routes:
  a firewall that drops; the manager host and the origin still reachable);
- ``peers-cut-fallback`` (once per repeat, ``--no-fallback`` skips it): the same with the
  library's files fetched from peers (``library_from_peers = true``, TaskVine's way) and
  ``library_start_timeout_s = 5``: the safety net drops the worker that cannot start its
  library, and the summary's ``network:`` lines say which worker and what was done.

Per run: events/s, the near fraction by bytes (datavine's accounting of each read), the
bytes that crossed racks by the kernel's counters on the spine and by datavine's own count
of far bytes read. Before the runs, the facility model (:mod:`datavine.apps.sim`) predicts
the datavine and blind runs from a loopback calibration; after them, the box also runs
``datavine scale-test --facility``. The modes alternate, ``--repeats`` times; the best of
each is compared. Last line: ``throughput_ratio`` (datavine / blind events/s, best
against best; ``throughput_ratio_median``: the medians, steadier where one run of a mode
is lucky),
``interrack_bytes_ratio`` (datavine / blind, kernel), ``near_fraction`` (datavine),
``accounting_ratio`` (datavine's far bytes / the kernel's inter-rack bytes, blind runs:
the ones with far bytes to count), ``accounting_ratio_bounded`` (the same with the bound on
what calls stopped while they ran read added: such a call, a backup copy or the first copy
it outran, reports no reads; the kernel's bytes lie between the two),
``peers_cut_slowdown`` (peers-cut / datavine wall time),
``fallback_slowdown`` and ``fallback_said`` (the safety net's run),
``prediction_ratio_time`` (model / box, the median of the datavine and blind ratios, each
against that mode's median run) and ``prediction_ratio_bytes`` (blind's inter-rack bytes,
model / median run).

    .venv/bin/python benchmarks/box.py [--files 16 --events 100000 --repeats 2]
        [--racks 2 --hosts-per-rack 2 --link-mbit 200] [--workers hand|condor]

Needs root with CAP_NET_ADMIN and XRootD (scripts/setup.sh --xcache); HTCondor for
``--workers condor``.
"""

from __future__ import annotations

import argparse
import json
import shutil
import statistics
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import common  # this script's folder is on sys.path when it runs

from datavine.deploy.box.facility import bring_up, start_workers, take_down
from datavine.deploy.box.net import Box, box_missing
from datavine.deploy.box.plan import BoxSpec
from datavine.scheduler.summary import network_line

MODES = ("datavine", "blind", "peers-cut")
# the safety net, shown once per repeat: the library's files from peers (as TaskVine does by
# default), so a worker in a cut rack cannot start it; dropped after the bound
FALLBACK = "peers-cut-fallback"
DATAVINE = str(Path(sys.executable).parent / "datavine")


@dataclass
class BoxRun:
    """One scenario's run on a fresh box."""

    mode: str
    wall_s: float | None = None
    events: int = 0
    events_per_s: float | None = None
    near_fraction: float | None = None
    far_bytes: int = 0
    near_bytes: int = 0
    unmeasured_bytes: int = 0  # at most this read by calls stopped while they ran
    interrack_bytes: int = 0
    placement: dict[str, int] = field(default_factory=dict)
    bundles_by_worker: dict[str, int] = field(default_factory=dict)
    notes: list[str] = field(default_factory=list)
    error: str = ""

    @property
    def ok(self) -> bool:
        return not self.error and self.events_per_s is not None


def facility_for(box: Box, mode: str) -> Path:
    """The box's facility file, with placement off for the blind mode."""
    text = (box.dir / "facility.toml").read_text()
    if mode == "blind":
        text += "\n[placement]\nenabled = false\n"
    if mode == FALLBACK:
        text += "\n[run]\nlibrary_from_peers = true\nlibrary_start_timeout_s = 5\n"
    path = box.dir / f"facility-{mode}.toml"
    path.write_text(text)
    return path


def run_on_box(args: argparse.Namespace, data: Path, mode: str, workdir: Path) -> BoxRun:
    """Bring a fresh box up, start its workers, run the analysis on the manager host."""
    spec = BoxSpec(name="bench", racks=args.racks, hosts_per_rack=args.hosts_per_rack,
                   link_mbit=args.link_mbit)
    folder = workdir / f"box-{mode}"
    shutil.rmtree(folder, ignore_errors=True)
    box = bring_up(spec, folder, data=data, condor=args.workers == "condor")
    run = BoxRun(mode)
    try:
        facility = facility_for(box, mode)
        n_workers = args.racks * args.hosts_per_rack
        if args.workers == "hand":
            start_workers(box)
        if mode in ("peers-cut", FALLBACK):
            box.cut_racks("blackhole")
        record = box.dir / f"run-{mode}.json"
        argv = [DATAVINE, "run", "--facility", str(facility), "--data", str(data),
                "--files", str(args.files), "--events", str(args.events), "--no-progress",
                "--json", str(record), "--timeout", str(args.timeout)]
        if args.workers == "hand":
            argv += ["--pool-workers", str(n_workers), "--pool-timeout", "60"]
        before = box.interrack_bytes()
        done = box.run("mgr", argv, timeout_s=args.timeout + 120, check=False)
        run.interrack_bytes = box.interrack_bytes() - before
        if done.returncode != 0:
            run.error = (done.stderr or done.stdout).strip().splitlines()[-1:] or ["failed"]
            run.error = f"exit {done.returncode}: {run.error[0]}"
            (workdir / f"failed-{mode}.log").write_text(done.stdout + done.stderr)
            return run
        fill(run, json.loads(record.read_text()))
    finally:
        take_down(box)
    return run


def fill(run: BoxRun, record: dict[str, Any]) -> None:
    summary = record.get("summary") or {}
    reads = summary.get("reads") or {}
    run.wall_s = record["wall_s"]
    run.events = record["events"]
    run.events_per_s = record["events_per_s"]
    run.near_bytes = int(reads.get("near_bytes", 0))
    run.far_bytes = int(reads.get("far_bytes", 0))
    run.unmeasured_bytes = int((summary.get("backups") or {}).get("unmeasured_bytes", 0))
    run.near_fraction = reads.get("near_fraction")
    run.placement = dict(summary.get("placement") or {})
    run.bundles_by_worker = {str(k): int(v) for k, v in (summary.get("hosts") or {}).items()}
    run.notes = [str(n) for n in summary.get("notes") or []]
    run.notes += [f"network: {network_line(f)}" for f in summary.get("network") or []]


def best(runs: list[BoxRun], mode: str) -> BoxRun | None:
    ok = [r for r in runs if r.mode == mode and r.ok]
    return max(ok, key=lambda r: r.events_per_s or 0.0) if ok else None


def median(runs: list[BoxRun], mode: str, attr: str) -> float | None:
    values = [getattr(r, attr) for r in runs if r.mode == mode and r.ok]
    return statistics.median(values) if values else None


def div(a: float | None, b: float | None) -> float | None:
    return a / b if a is not None and b else None


def fmt(x: float | None, spec: str = ".3f") -> str:
    return "n/a" if x is None else format(x, spec)


def predict(args: argparse.Namespace) -> dict[str, Any]:
    """The facility model's prediction of the datavine and blind runs, or why there is none."""
    try:
        from datavine.apps.sim.box import BoxGeometry, load_calibration, predict_box
    except ImportError as exc:
        return {"error": f"the facility model has no box prediction: {exc}"}
    calibration = load_calibration(args.calibration) if args.calibration else None
    if calibration is None:
        return {"error": "no calibration (benchmarks/facility_model.py --calibrate)"}
    # the workers' libraries start before the run (Cluster warms the workers it waits for)
    geometry = BoxGeometry(racks=args.racks, hosts_per_rack=args.hosts_per_rack,
                           cores_per_worker=1, link_mbit=args.link_mbit, files=args.files,
                           events_per_file=args.events, compression="zstd",
                           warm_libraries=True)
    return {mode: predict_box(geometry, calibration, placement=mode)
            for mode in ("datavine", "blind")}


def scale_test_on_box(args: argparse.Namespace, data: Path, workdir: Path) -> dict[str, Any]:
    """``datavine scale-test --facility`` on a fresh box; its JSON record."""
    spec = BoxSpec(name="bench", racks=args.racks, hosts_per_rack=args.hosts_per_rack,
                   link_mbit=args.link_mbit)
    box = bring_up(spec, workdir / "box-scaletest", data=data, condor=args.workers == "condor")
    try:
        n = args.racks * args.hosts_per_rack
        if args.workers == "hand":
            start_workers(box)
        out = workdir / "scaletest"
        argv = [DATAVINE, "scale-test", "--facility", str(box.dir / "facility.toml"),
                "--data", str(data), "--files", str(args.files), "--events-per-file",
                str(args.events), "--passes", "2", "--out", str(out), "--timeout",
                str(args.timeout)]
        if args.workers == "hand":
            argv += ["--pool", "external", "--workers", str(n)]
        before = box.interrack_bytes()
        done = box.run("mgr", argv, timeout_s=args.timeout + 120, check=False)
        crossed = box.interrack_bytes() - before
        if done.returncode != 0:
            return {"error": (done.stderr or done.stdout).strip()[-500:]}
        record = json.loads((out / "scaletest.json").read_text())
        record["interrack_bytes"] = crossed
        print(done.stdout[-1500:])
        return record
    finally:
        take_down(box)


def coffea_on_box(args: argparse.Namespace, data: Path, workdir: Path) -> dict[str, Any]:
    """coffea's ``Runner`` with ``DatavineExecutor`` on a fresh box (benchmarks/box_coffea.py
    on the manager host); its JSON line, with the inter-rack bytes."""
    spec = BoxSpec(name="bench", racks=args.racks, hosts_per_rack=args.hosts_per_rack,
                   link_mbit=args.link_mbit)
    box = bring_up(spec, workdir / "box-coffea", data=data)
    try:
        start_workers(box)
        argv = [sys.executable, str(Path(__file__).resolve().parent / "box_coffea.py"),
                "--facility", str(box.dir / "facility.toml"), "--data", str(data),
                "--files", str(args.files), "--workers",
                str(args.racks * args.hosts_per_rack)]
        before = box.interrack_bytes()
        done = box.run("mgr", argv, timeout_s=args.timeout + 120, check=False)
        crossed = box.interrack_bytes() - before
        if done.returncode != 0:
            return {"error": (done.stderr or done.stdout).strip()[-800:]}
        record: dict[str, Any] = json.loads(done.stdout.strip().splitlines()[-1])
        record["interrack_bytes"] = crossed
        return record
    finally:
        take_down(box)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--files", type=int, default=16)
    parser.add_argument("--events", type=int, default=100_000)
    parser.add_argument("--racks", type=int, default=2)
    parser.add_argument("--hosts-per-rack", type=int, default=2)
    parser.add_argument("--link-mbit", type=float, default=200.0)
    parser.add_argument("--repeats", type=int, default=2)
    parser.add_argument("--workers", choices=("hand", "condor"), default="hand",
                        help="vine_workers started by hand on each rack host, or HTCondor "
                        "pools (one per rack) through the box's pool")
    parser.add_argument("--timeout", type=float, default=300.0)
    parser.add_argument("--calibration", type=Path, default=common.RUNS / "calibration.json",
                        help="the facility model's loopback calibration (JSON)")
    parser.add_argument("--data-dir", type=Path, default=None)
    parser.add_argument("--no-scale-test", action="store_true")
    parser.add_argument("--no-coffea", action="store_true")
    parser.add_argument("--no-fallback", dest="fallback", action="store_false",
                        help=f"skip the {FALLBACK!r} runs (the safety net's cost)")
    parser.add_argument("--png", type=Path, default=common.REPO / "benchmarks" / "figures"
                        / "box.png")
    args = parser.parse_args()
    why = box_missing()
    if why:
        print(f"box: cannot run here: {why}", file=sys.stderr)
        return 2
    print(common.machine_info())
    workdir = Path(tempfile.mkdtemp(prefix="datavine-box-bench-"))
    workdir.chmod(0o755)
    data = args.data_dir or (common.RUNS.parent / "box-data")
    files = common.readable_dataset(data, args.files, args.events)
    size = sum(f.stat().st_size for f in files)
    print(f"data: {args.files} files x {args.events:,} events (zstd), {size / 1e6:.0f} MB in "
          f"{data}; box: {args.racks} racks x {args.hosts_per_rack} hosts, inter-rack link "
          f"{args.link_mbit:g} Mbit/s, workers {args.workers}")
    prediction = predict(args)
    print(f"model prediction: {prediction}")

    runs: list[BoxRun] = []
    for repeat in range(args.repeats):
        for mode in (*MODES, *((FALLBACK,) if args.fallback else ())):
            t0 = time.monotonic()
            run = run_on_box(args, data, mode, workdir)
            runs.append(run)
            print(f"[{repeat + 1}/{args.repeats}] {mode:9} "
                  + (f"{run.events_per_s:>10,.0f} ev/s  {run.wall_s:6.2f} s  near "
                     f"{fmt(run.near_fraction)}  inter-rack {run.interrack_bytes / 1e6:6.1f} MB"
                     f" (datavine far {run.far_bytes / 1e6:6.1f} MB"
                     + (f", + up to {run.unmeasured_bytes / 1e6:.1f} MB unmeasured"
                        if run.unmeasured_bytes else "") + ")  placement "
                     f"{run.placement}  bundles {run.bundles_by_worker}" if run.ok
                     else f"FAILED {run.error}")
                  + f"  [{time.monotonic() - t0:.0f} s with the box]", flush=True)
            for note in run.notes:
                print(f"    note: {note}")

    dv, blind, cut = (best(runs, m) for m in MODES)
    throughput_ratio = div(dv.events_per_s if dv else None, blind.events_per_s if blind else None)
    interrack_ratio = div(dv.interrack_bytes if dv else None,
                          blind.interrack_bytes if blind else None)
    blind_ok = [r for r in runs if r.mode == "blind" and r.ok and r.interrack_bytes]
    accounting = (statistics.median(r.far_bytes / r.interrack_bytes for r in blind_ok)
                  if blind_ok else None)
    bounded = (statistics.median((r.far_bytes + r.unmeasured_bytes) / r.interrack_bytes
                                 for r in blind_ok) if blind_ok else None)
    slowdown = div(cut.wall_s if cut else None, dv.wall_s if dv else None)
    fallback = best(runs, FALLBACK)
    pairs: dict[str, Any] = {
        "throughput_ratio": fmt(throughput_ratio),
        "throughput_ratio_median": fmt(div(median(runs, "datavine", "events_per_s"),
                                           median(runs, "blind", "events_per_s"))),
        "interrack_bytes_ratio": fmt(interrack_ratio),
        "near_fraction": fmt(dv.near_fraction if dv else None),
        "accounting_ratio": fmt(accounting), "accounting_ratio_bounded": fmt(bounded),
        "peers_cut_slowdown": fmt(slowdown),
    }
    if args.fallback:
        pairs["fallback_slowdown"] = fmt(div(fallback.wall_s if fallback else None,
                                             dv.wall_s if dv else None))
        pairs["fallback_said"] = bool(fallback and any(n.startswith("network:")
                                                       for n in fallback.notes))
    if "error" not in prediction:
        # against the median run of each mode: the best blind run is also the one that
        # happened to read most near (TaskVine's choices), so it is no fair comparison
        pt = [div(prediction[m].run_time_s, median(runs, m, "wall_s")) for m in ("datavine",
                                                                               "blind")]
        pt = [x for x in pt if x is not None]
        pairs["prediction_ratio_time"] = fmt(statistics.median(pt) if pt else None)
        pairs["prediction_ratio_bytes"] = fmt(div(prediction["blind"].interrack_bytes,
                                                  median(runs, "blind", "interrack_bytes")))
        for m in ("datavine", "blind"):
            print(f"model / box ({m}, medians): time "
                  f"{fmt(div(prediction[m].run_time_s, median(runs, m, 'wall_s')))}, "
                  f"inter-rack {prediction[m].interrack_bytes / 1e6:.1f} MB predicted, "
                  f"{(median(runs, m, 'interrack_bytes') or 0) / 1e6:.1f} MB measured")
    if not args.no_scale_test:
        st = scale_test_on_box(args, data, workdir)
        if "error" in st:
            print(f"scale test on the box FAILED: {st['error']}")
        else:
            print(f"scale test on the box: {st.get('gbps')} Gbps, inter-rack "
                  f"{st['interrack_bytes'] / 1e6:.1f} MB")
            pairs["scaletest_gbps"] = fmt(st.get("gbps"))
            pairs["scaletest_interrack_mb"] = fmt(st["interrack_bytes"] / 1e6, ".1f")
    if not args.no_coffea:
        cf = coffea_on_box(args, data, workdir)
        print(f"coffea Runner on the box: {cf}")
        if "error" not in cf:
            pairs["coffea_events_per_s"] = fmt(cf["events_per_s"], ".0f")
            pairs["coffea_correct"] = cf["correct"]
            pairs["coffea_near_fraction"] = fmt(cf["near_fraction"])
    try:
        plot(runs, args, args.png)
        print(f"figure: {args.png}")
    except Exception as exc:  # a picture must not lose the figures
        print(f"figure not written: {exc}")
    shutil.rmtree(workdir, ignore_errors=True)
    print(common.kv_line(pairs))
    return 0


def plot(runs: list[BoxRun], args: argparse.Namespace, path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    ok = [r for r in runs if r.ok]
    fig, axes = plt.subplots(1, 3, figsize=(11, 3.4))
    colours = {"datavine": "tab:green", "blind": "tab:grey", "peers-cut": "tab:orange"}
    for ax, (title, value) in zip(axes, (
            ("events/s (thousands)", lambda r: r.events_per_s / 1e3),
            ("inter-rack MB (kernel)", lambda r: r.interrack_bytes / 1e6),
            ("near fraction (bytes)", lambda r: r.near_fraction or 0.0)), strict=True):
        for i, mode in enumerate(MODES):
            vals = [value(r) for r in ok if r.mode == mode]
            ax.bar([i], [statistics.median(vals) if vals else 0], color=colours[mode])
            ax.scatter([i] * len(vals), vals, color="black", s=10, zorder=3)
        ax.set_xticks(range(len(MODES)), MODES)
        ax.set_title(title, fontsize=10)
    fig.suptitle(f"The box: {args.racks} racks x {args.hosts_per_rack} hosts, inter-rack "
                 f"{args.link_mbit:g} Mbit/s, {args.files} x {args.events:,} events (zstd), "
                 "fresh box per run (bars: medians, dots: runs)", fontsize=10)
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=110)


if __name__ == "__main__":
    sys.exit(main())
