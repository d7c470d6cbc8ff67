"""The facility model's prediction of a facility in a box, from a loopback calibration.

The box (:mod:`datavine.deploy.box`, described here by :class:`BoxGeometry` alone, without
its code): a manager host with the origin XRootD; ``racks`` racks of ``hosts_per_rack``
hosts, one ``vine_worker`` of ``cores_per_worker`` cores on each; an XCache shard on the
first host of each rack (``xcache-A`` on ``a1``, ...), files given to shards by datavine's
own :class:`~datavine.io.shards.ShardMap` (rendezvous hashing of the files' logical names,
``/nanoaod_0000.root``, ...); the racks joined by one link shaped to ``link_mbit`` in each
direction (tc tbf on both ends), every other link unshaped; caches cold (a shard's first read
of a file comes from the origin, over the unshaped core). The whole box runs on one machine
of ``host_cores`` cores: every worker's calls and the servers share them.

:func:`predict_box` builds that facility for :mod:`.driver` (datavine's own planner,
dispatcher and placement on simulated time) with nothing but the box's description and a
:class:`~datavine.apps.sim.calibration.Calibration`: a call reads its file at the rate one
core works through its events, on cores shared by all (``FacilitySpec.host_cores``), across
the shaped link when its shard is in another rack; each worker's library starts inside the
run (pool workers) unless ``warm_libraries``. Locality-blind placement lands calls on random
free workers, so both placements are averaged over ``seeds`` runs of the model.
"""

from __future__ import annotations

import statistics
import string
from dataclasses import asdict, dataclass, field
from typing import Any

from datavine.apps.sim.calibration import Calibration, load_calibration
from datavine.apps.sim.driver import SimConfig, simulate
from datavine.apps.sim.results import SimResult
from datavine.apps.sim.spec import FacilitySpec, ManagerCost, ShardSpec, Workload
from datavine.config import RunConfig

__all__ = ["BoxGeometry", "BoxPrediction", "box_facility", "box_workload",
           "load_calibration", "predict_box"]

UNSHAPED_GBPS = 1000.0  # a link nothing shapes: never the bottleneck of a box
PLACEMENTS = ("datavine", "blind")


@dataclass(frozen=True)
class BoxGeometry:
    """A box as its operator describes it (see the module docstring).

    ``host_cores``: the real cores the whole box shares (None: the calibration's machine's,
    as the box runs where it was calibrated). ``warm_libraries``: the workers' libraries
    started before the run (``LocalCluster``); pool workers start theirs inside it.
    ``shard_name``: the shards' names, which enter the hash (``{rack}``, ``{k}`` its index).
    """

    racks: int = 2
    hosts_per_rack: int = 2
    cores_per_worker: int = 1
    link_mbit: float = 200.0
    files: int = 16
    events_per_file: int = 100_000
    compression: str = "zstd"
    host_cores: int | None = None
    warm_libraries: bool = False
    shard_name: str = "xcache-{rack}"
    lfn_format: str = "/nanoaod_{:04d}.root"

    def __post_init__(self) -> None:
        if self.racks < 1 or self.hosts_per_rack < 1 or self.cores_per_worker < 1:
            raise ValueError("a box needs racks, hosts and cores")
        if self.link_mbit <= 0 or self.files < 1 or self.events_per_file < 1:
            raise ValueError("a box needs a link, files and events")


@dataclass(frozen=True)
class BoxPrediction:
    """The model's prediction of one run on the box (means over ``seeds`` model runs).

    ``run_time_s``: the analysis' wall time (the record's ``wall_s``); ``interrack_bytes``:
    bytes that crossed racks (the kernel's spine counters); ``near_fraction``: of the bytes
    read, those read in the worker's rack; ``*_range``: lowest and highest over the seeds.
    """

    placement: str
    run_time_s: float
    interrack_bytes: float
    near_fraction: float
    events_per_s: float
    bytes_read: float
    placement_tiers: dict[str, float]
    seeds: int
    run_time_range: tuple[float, float]
    interrack_bytes_range: tuple[float, float]
    geometry: BoxGeometry = field(repr=False, default_factory=BoxGeometry)

    def to_dict(self) -> dict[str, Any]:
        out = asdict(self)
        out["geometry"] = asdict(self.geometry)
        return out

    def line(self) -> str:
        """One line for a report."""
        return (f"{self.placement}: {self.run_time_s:.2f} s ({self.run_time_range[0]:.2f}-"
                f"{self.run_time_range[1]:.2f}), {self.events_per_s:,.0f} events/s, "
                f"inter-rack {self.interrack_bytes / 1e6:.1f} MB "
                f"({self.interrack_bytes_range[0] / 1e6:.1f}-"
                f"{self.interrack_bytes_range[1] / 1e6:.1f}), near {self.near_fraction:.3f}")


def box_facility(box: BoxGeometry, calibration: Calibration) -> FacilitySpec:
    """The box as the model's facility: racks A, B, ...; workers ``w-a1`` on ``a1``...;
    a shard on each rack's first host; the shaped link in each direction; shared cores."""
    racks = tuple(string.ascii_uppercase[:box.racks])  # as the box names them
    shards = tuple(ShardSpec(box.shard_name.format(rack=r, k=k), r, UNSHAPED_GBPS,
                             host=f"{r.lower()}1") for k, r in enumerate(racks))
    return FacilitySpec(racks=racks, workers_per_rack=box.hosts_per_rack,
                        cores_per_worker=box.cores_per_worker, shards=shards,
                        inter_rack_gbps=box.link_mbit / 1000.0, duplex=True,
                        origin_gbps=UNSHAPED_GBPS,
                        host_cores=float(box.host_cores or calibration.host_cores),
                        worker_name="w-{r}{j}", worker_host="{r}{j}")


def box_workload(box: BoxGeometry, calibration: Calibration) -> Workload:
    """The box's files as the model's workload, costed by the calibration."""
    if box.compression != calibration.compression:
        raise ValueError(f"the calibration is of {calibration.compression!r} files, the box "
                         f"reads {box.compression!r}: calibrate with that compression")
    cold = not box.warm_libraries
    startup = calibration.first_call_s + (calibration.library_start_s if cold else 0.0)
    return Workload(n_files=box.files, events_per_file=box.events_per_file, spread=0.0,
                    bytes_per_event=calibration.bytes_per_event,
                    khz_per_core=1e-3 / calibration.cpu_s_per_event,
                    hit_fraction=0.0,  # cold caches: the shard's first read is the origin's
                    merge_s=calibration.merge_s, peak_mb=calibration.peak_mb,
                    startup_s=startup,
                    startup_wait_s=calibration.library_wait_s if cold else 0.0,
                    lfn_format=box.lfn_format)


def box_config(calibration: Calibration, seed: int = 0) -> SimConfig:
    """datavine's defaults (the box's facility file sets no [run]); the manager's round trip
    per bundle as measured; decisions at a fixed cost, so that the model repeats."""
    cost = ManagerCost(dispatch_s=0.0, result_s=0.0, latency_s=calibration.manager_s_per_bundle,
                       start_s=0.0, decision_s=0.0002)
    return SimConfig(run=RunConfig(), cost=cost, sample_s=0.1, seed=seed)


def predict_box(box: BoxGeometry, calibration: Calibration, placement: str = "datavine",
                *, seeds: int = 8) -> BoxPrediction:
    """The model's run time, inter-rack bytes and near fraction of one run on ``box``
    (``placement``: ``"datavine"`` or ``"blind"``), averaged over ``seeds`` model runs."""
    if placement not in PLACEMENTS:
        raise ValueError(f"placement must be one of {PLACEMENTS}, got {placement!r}")
    facility, workload = box_facility(box, calibration), box_workload(box, calibration)
    results: list[SimResult] = [simulate(facility, workload, placement,
                                         box_config(calibration, seed))
                                for seed in range(max(seeds, 1))]
    times = [r.wall_s for r in results]
    crossed = [r.interrack_bytes for r in results]
    tiers: dict[str, float] = {}
    for r in results:
        for tier, n in r.placement.items():
            tiers[tier] = tiers.get(tier, 0.0) + n / len(results)
    run_time = statistics.fmean(times)
    events = box.files * box.events_per_file
    return BoxPrediction(
        placement=placement, run_time_s=run_time, interrack_bytes=statistics.fmean(crossed),
        near_fraction=statistics.fmean(r.near_fraction for r in results),
        events_per_s=events / run_time if run_time > 0 else 0.0,
        bytes_read=statistics.fmean(r.bytes_total for r in results),
        placement_tiers=tiers, seeds=len(results),
        run_time_range=(min(times), max(times)), interrack_bytes_range=(min(crossed),
                                                                        max(crossed)),
        geometry=box)
