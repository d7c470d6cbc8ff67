"""What is simulated: the facility (racks, workers, XCache nodes, links), the workload (files,
events, bytes per event, the cores' event rate) and the manager's costs per bundle.

Every default says where it comes from. The seed facility (:meth:`FacilitySpec.challenge`,
:meth:`Workload.challenge`) is the 200 Gbps challenge's: 2 racks joined by an 80 Gbps link,
8 XCache nodes of 25-50 Gbps, ~2,500 cores, ~60k files, 25 kHz per core; bytes per event are
chosen so that 2,500 cores at 25 kHz want 240 Gbps, the challenge's TaskVine peak (its
average was 221 Gbps at 27.66 kHz/core, i.e. ~400 B/event). Figures measured on this
project's machine (:meth:`Workload.measured_here`) come from ``/work/shared/FINDINGS.md``
and ``benchmarks/README.md``: the AGC-style analysis at 769 kHz (ZSTD) and 217 kHz (LZMA)
per core, 108 and 70 compressed bytes per event, and XCache misses fetching 1.16 x the
bytes asked for (whole 128 KiB blocks: 340 MB pulled for 292 MB read).
"""

from __future__ import annotations

from dataclasses import dataclass, replace

GBPS = 1e9 / 8  # bytes/s in one Gbps


@dataclass(frozen=True)
class ShardSpec:
    """One XCache node: its name (enters the shard map's hash), rack and NIC speed."""

    name: str
    rack: str
    gbps: float


@dataclass(frozen=True)
class FacilitySpec:
    """Racks of identical workers, XCache nodes, and the links between them.

    ``inter_rack_gbps`` is one link between the racks; with ``duplex=False`` (default) both
    directions share it (the seed names one 80 Gbps figure), with ``duplex=True`` each
    direction has it. ``origin_gbps``: the wide-area link cache misses are fetched over.
    ``weighted``: the shard map gives each XCache node a share of the files proportional to
    its Gbps (``Shard.weight``); otherwise every node gets an equal share.
    """

    racks: tuple[str, ...] = ("rack-a", "rack-b")
    workers_per_rack: int = 50
    cores_per_worker: int = 25
    shards: tuple[ShardSpec, ...] = ()
    inter_rack_gbps: float = 80.0
    duplex: bool = False
    origin_gbps: float = 100.0
    weighted: bool = False

    def __post_init__(self) -> None:
        if not self.racks or self.workers_per_rack < 1 or self.cores_per_worker < 1:
            raise ValueError("a facility needs racks, workers and cores")
        unknown = {s.rack for s in self.shards} - set(self.racks)
        if unknown:
            raise ValueError(f"shards in unknown racks: {sorted(unknown)}")

    @property
    def cores(self) -> int:
        return len(self.racks) * self.workers_per_rack * self.cores_per_worker

    @classmethod
    def challenge(cls, **overrides: object) -> FacilitySpec:
        """2 racks x 50 workers x 25 cores (2,500), 4 XCache nodes per rack at 25, 32, 40
        and 50 Gbps (294 Gbps in all), 80 Gbps between the racks."""
        shards = tuple(ShardSpec(f"xcache-{4 * r + i}", rack, gbps)
                       for r, rack in enumerate(("rack-a", "rack-b"))
                       for i, gbps in enumerate((25.0, 32.0, 40.0, 50.0)))
        return replace(cls(shards=shards), **overrides)  # type: ignore[arg-type]

    @classmethod
    def small(cls, workers: int = 2, cores: int = 1, racks: int = 1,
              shard_gbps: float = 1e4) -> FacilitySpec:
        """A host-sized facility: ``workers`` per rack, one fast shard per rack."""
        names = tuple(f"rack-{chr(ord('a') + i)}" for i in range(racks))
        return cls(racks=names, workers_per_rack=workers, cores_per_worker=cores,
                   shards=tuple(ShardSpec(f"xcache-{i}", r, shard_gbps)
                                for i, r in enumerate(names)),
                   inter_rack_gbps=shard_gbps, origin_gbps=shard_gbps)


@dataclass(frozen=True)
class Workload:
    """Files to process, one bundle per file, then a tree of cheap merges.

    ``events_per_file`` is the mean; sizes are log-normal with ``spread`` (sigma), which
    gives the tail its long files. ``hit_fraction``: share of files already in their XCache
    node (misses go to the origin and pull ``miss_overhead`` x their bytes).
    ``peak_mb``: resident memory of one bundle (FINDINGS: a 100k-event chunk needs
    110-120 MB in a fresh process; long-lived ones grew to 210-320 MB).
    """

    n_files: int = 60_000
    events_per_file: float = 200_000
    spread: float = 0.35
    bytes_per_event: float = 480.0
    khz_per_core: float = 25.0
    hit_fraction: float = 1.0
    miss_overhead: float = 1.16
    merge_fanin: int = 8
    merge_s: float = 0.05
    peak_mb: float = 300.0
    seed: int = 1

    def __post_init__(self) -> None:
        if self.n_files < 1 or self.events_per_file <= 0 or self.khz_per_core <= 0:
            raise ValueError("a workload needs files, events and a rate")
        if not 0.0 <= self.hit_fraction <= 1.0:
            raise ValueError("hit_fraction is a fraction")

    @property
    def core_bytes_per_s(self) -> float:
        """What one core consumes when its reads keep up: events/s x bytes/event."""
        return self.khz_per_core * 1e3 * self.bytes_per_event

    @classmethod
    def challenge(cls, **overrides: object) -> Workload:
        return replace(cls(), **overrides)  # type: ignore[arg-type]

    @classmethod
    def measured_here(cls, compression: str = "zstd", **overrides: object) -> Workload:
        """The AGC-style analysis as measured on this project's machine (one core)."""
        rates = {"zstd": (769.0, 108.0), "lzma": (217.0, 70.0)}
        khz, per_event = rates[compression]
        return replace(cls(khz_per_core=khz, bytes_per_event=per_event),
                       **overrides)  # type: ignore[arg-type]


@dataclass(frozen=True)
class ManagerCost:
    """What one bundle costs the manager (one thread: TaskVine and datavine's loop).

    ``dispatch_s`` / ``result_s``: manager time to send a call and to take its result.
    ``latency_s`` + ``start_s``: how long a core waits between a call leaving the manager
    and its work starting (``benchmarks/README.md``, analysis: ~6 ms round trip per bundle
    here, ~1 ms of it in the library, which is ``start_s``). ``decision_s``: datavine's own
    decisions per bundle (planner, placement, caps); ``None`` measures the real time the
    decisions take in the simulation and charges that (runs are then not repeatable to the
    bit).
    ``wait_s``: the loop's wait between submission rounds when nothing comes back
    (``RunConfig.wait_s``).
    """

    dispatch_s: float = 0.0005
    result_s: float = 0.0005
    latency_s: float = 0.005
    start_s: float = 0.001
    decision_s: float | None = 0.0002
    wait_s: float = 1.0
