"""What is simulated: the facility (racks, workers, XCache nodes, links, the cores they share),
the workload (files, events, bytes per event, the cores' event rate) and the manager's costs
per bundle.

Every default says where it comes from. The seed facility (:meth:`FacilitySpec.challenge`,
:meth:`Workload.challenge`) is the 200 Gbps challenge's: 2 racks joined by an 80 Gbps link,
8 XCache nodes of 25-50 Gbps, ~2,500 cores, ~60k files, 25 kHz per core; bytes per event are
chosen so that 2,500 cores at 25 kHz want 240 Gbps, the challenge's TaskVine peak (its
average was 221 Gbps at 27.66 kHz/core, i.e. ~400 B/event); XCache misses fetch 1.16 x the
bytes asked for (whole 128 KiB blocks: ``benchmarks/locality.py`` pulled 340 MB for 292 MB
read). Figures for a facility on this machine come from a measured calibration
(:mod:`.calibration`), not from defaults here.

The HL-LHC target (:meth:`FacilitySpec.hllhc`, :meth:`Workload.hllhc`,
:meth:`ManagerCost.per_bundle`): 10,000 cores in 8 racks, 32 XCache shards, 900 Gbps of
demand (~200 TB in 30 minutes), ~10 core-second bundles at 25 kHz per core, so ~1,000
bundles a second for one manager core.
"""

from __future__ import annotations

from dataclasses import dataclass, replace

GBPS = 1e9 / 8  # bytes/s in one Gbps
SHARD_LINK, INTER_LINK = "xcache:", "inter:"  # how the network's links are named


def shard_link(shard: str) -> str:
    """The link of XCache node ``shard``'s NIC."""
    return SHARD_LINK + shard


def inter_link(src: str, dst: str, duplex: bool) -> str:
    """The link bytes from rack ``src`` to rack ``dst`` cross: one per direction when
    ``duplex``, else one per pair of racks."""
    if duplex:
        return f"{INTER_LINK}{src}>{dst}"
    a, b = sorted((src, dst))
    return f"{INTER_LINK}{a}|{b}"


@dataclass(frozen=True)
class ShardSpec:
    """One XCache node: its name (enters the shard map's hash), rack, NIC speed and, when
    workers share its host, that host's name."""

    name: str
    rack: str
    gbps: float
    host: str | None = None


@dataclass(frozen=True)
class FacilitySpec:
    """Racks of identical workers, XCache nodes, and the links between them.

    ``inter_rack_gbps`` is one link between the racks; with ``duplex=False`` (default) both
    directions share it (the seed names one 80 Gbps figure), with ``duplex=True`` each
    direction has it. ``origin_gbps``: the wide-area link cache misses are fetched over.
    ``weighted``: the shard map gives each XCache node a share of the files proportional to
    its Gbps (``Shard.weight``); otherwise every node gets an equal share.
    ``host_cores``: when > 0, every worker's core and the servers run on one machine of
    that many real cores (a facility in a box): the cores are one more resource shared
    max-min fairly by every running call (0: each worker core is a real one).
    ``worker_name`` / ``worker_host``: how workers are named and which host each runs on
    (``{rack}``, ``{r}`` the rack in lower case, ``{i}`` from 0, ``{j}`` from 1); a
    shard's :attr:`ShardSpec.host` on a worker's host puts that worker next to it.
    ``manager_nic_gbps``: the manager host's NIC, which every call sent and result taken
    crosses (0: its bytes are counted, its time is not modelled).
    """

    racks: tuple[str, ...] = ("rack-a", "rack-b")
    workers_per_rack: int = 50
    cores_per_worker: int = 25
    shards: tuple[ShardSpec, ...] = ()
    inter_rack_gbps: float = 80.0
    duplex: bool = False
    origin_gbps: float = 100.0
    weighted: bool = False
    host_cores: float = 0.0
    worker_name: str = "{rack}-w{i:03d}"
    worker_host: str = "{rack}-w{i:03d}"
    manager_nic_gbps: float = 0.0

    def __post_init__(self) -> None:
        if not self.racks or self.workers_per_rack < 1 or self.cores_per_worker < 1:
            raise ValueError("a facility needs racks, workers and cores")
        if self.host_cores < 0:
            raise ValueError("host_cores must be >= 0 (0: cores not shared)")
        if self.manager_nic_gbps < 0:
            raise ValueError("manager_nic_gbps must be >= 0 (0: not modelled)")
        unknown = {s.rack for s in self.shards} - set(self.racks)
        if unknown:
            raise ValueError(f"shards in unknown racks: {sorted(unknown)}")

    @property
    def cores(self) -> int:
        return len(self.racks) * self.workers_per_rack * self.cores_per_worker

    def workers(self) -> list[tuple[str, str, str]]:
        """(name, rack, host) of every worker, rack by rack."""
        out = []
        for rack in self.racks:
            for i in range(self.workers_per_rack):
                names = {"rack": rack, "r": rack.lower(), "i": i, "j": i + 1}
                out.append((self.worker_name.format(**names), rack,
                            self.worker_host.format(**names)))
        return out

    @classmethod
    def challenge(cls, **overrides: object) -> FacilitySpec:
        """2 racks x 50 workers x 25 cores (2,500), 4 XCache nodes per rack at 25, 32, 40
        and 50 Gbps (294 Gbps in all), 80 Gbps between the racks."""
        shards = tuple(ShardSpec(f"xcache-{4 * r + i}", rack, gbps)
                       for r, rack in enumerate(("rack-a", "rack-b"))
                       for i, gbps in enumerate((25.0, 32.0, 40.0, 50.0)))
        return replace(cls(shards=shards), **overrides)  # type: ignore[arg-type]

    @classmethod
    def hllhc(cls, **overrides: object) -> FacilitySpec:
        """The HL-LHC target: 8 racks x 50 workers x 25 cores (10,000), 4 XCache nodes
        per rack at 40 Gbps (32 nodes, 1,280 Gbps in all: 160 Gbps per rack for its
        112.5 Gbps of demand), 100 Gbps between each pair of racks (both directions sharing
        it), the shard map weighted by Gbps, the manager on a 25 Gbps NIC."""
        racks = tuple(f"rack-{chr(ord('a') + i)}" for i in range(8))
        shards = tuple(ShardSpec(f"xcache-{4 * r + i}", rack, 40.0)
                       for r, rack in enumerate(racks) for i in range(4))
        base = cls(racks=racks, workers_per_rack=50, cores_per_worker=25, shards=shards,
                   inter_rack_gbps=100.0, weighted=True, manager_nic_gbps=25.0)
        return replace(base, **overrides)  # type: ignore[arg-type]

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
    ``startup_s``: core-seconds a worker spends before its first bundle's work (its library
    starting, the analysis' imports), after ``startup_wait_s`` seconds that use no core (a
    starting library's handshake with the manager); ``lfn_format``: the files' logical
    names (``{}`` the file's index), which decide their shards.
    ``result_bytes``: what a bundle's result brings back to the manager (inline values;
    larger values stay on workers, ``RunConfig.inline_max_bytes``); ``task_bytes``: what
    one task adds to the call the manager sends (its function and arguments; the spec's own
    bookkeeping, keys and shard map, is measured by pickling it).
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
    startup_s: float = 0.0
    startup_wait_s: float = 0.0
    lfn_format: str = "/store/sim/file-{:06d}.root"
    seed: int = 1
    result_bytes: float = 0.0
    task_bytes: float = 0.0

    def __post_init__(self) -> None:
        if self.n_files < 1 or self.events_per_file <= 0 or self.khz_per_core <= 0:
            raise ValueError("a workload needs files, events and a rate")
        if not 0.0 <= self.hit_fraction <= 1.0:
            raise ValueError("hit_fraction is a fraction")
        if self.startup_s < 0 or self.startup_wait_s < 0:
            raise ValueError("startup_s and startup_wait_s must be >= 0")
        if self.result_bytes < 0 or self.task_bytes < 0:
            raise ValueError("result_bytes and task_bytes must be >= 0")

    @property
    def core_bytes_per_s(self) -> float:
        """What one core consumes when its reads keep up: events/s x bytes/event."""
        return self.khz_per_core * 1e3 * self.bytes_per_event

    @property
    def core_s_per_file(self) -> float:
        """A mean file's core-seconds at the full event rate."""
        return self.events_per_file / (self.khz_per_core * 1e3)

    @classmethod
    def challenge(cls, **overrides: object) -> Workload:
        return replace(cls(), **overrides)  # type: ignore[arg-type]

    @classmethod
    def hllhc(cls, **overrides: object) -> Workload:
        """The HL-LHC target's files: 250k events (log-normal, sigma 0.35), a 10
        core-second bundle each at 25 kHz; 450 B/event, so that 10,000 cores want 900 Gbps
        (10,000 x 25 kHz x 450 B) and a file is 112.5 MB (200 TB in 30 minutes is ~1.78M
        files, ~1,000 a second). A result brings back at most ``inline_max_bytes``
        (64 KiB: larger values stay on workers); a task adds 16 KiB to its call (a coffea
        work item's node: ``run_item``, the processor's function, the work item and its
        ``ItemPolicy``, which carries the X.509 proxy's ~10 KB)."""
        base = cls(events_per_file=250_000, bytes_per_event=450.0, khz_per_core=25.0,
                   result_bytes=64 * 1024, task_bytes=16 * 1024)
        return replace(base, **overrides)  # type: ignore[arg-type]


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

    @classmethod
    def per_bundle(cls, ms: float, **overrides: object) -> ManagerCost:
        """A measured figure of manager CPU per bundle, all of it included (TaskVine's
        wait, datavine's loop and decisions, as ``benchmarks/workers.py`` measures it):
        half when the call is sent, half when its result is taken, nothing more for the
        decisions."""
        if ms < 0:
            raise ValueError(f"manager ms per bundle must be >= 0, got {ms}")
        base = cls(dispatch_s=ms / 2e3, result_s=ms / 2e3, decision_s=0.0)
        return replace(base, **overrides)  # type: ignore[arg-type]
