"""Configuration objects: one place for every setting, passed down explicitly.

Nothing in datavine reads global state on its own: the manager, the runtime and the
worker pools each receive the dataclass that concerns them. Defaults are chosen for a
facility run; tests and the embedded default override them by keyword.
"""

from __future__ import annotations

import dataclasses
import numbers
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, TypedDict, Unpack

from datavine.errors import ConfigError
from datavine.scheduler.memory import MemoryPolicy
from datavine.scheduler.placement import PlacementPolicy

if TYPE_CHECKING:
    from datavine.io.shards import ShardMap
    from datavine.scheduler.racks import RackMap

__all__ = ["ANY_HOST", "ConfigError", "LocalWorkersConfig", "ManagerConfig", "RunConfig"]

ANY_HOST = "0.0.0.0"  # ManagerConfig.listen_host for every interface
ANY_HOSTS = frozenset({ANY_HOST, "::", "*"})
# what a capped bundle's process reads ahead for the next bundle, as a share of its cap at
# most: the room between the column cache's RSS bound (CACHE_RSS_SHARE) and the share at
# which an idle capped child is replaced (worker.capped_child.RECYCLE_FRACTION, 0.8)
PREFETCH_CAP_SHARE = 0.1
UNCAPPED_CACHE_MB = 1024.0  # RunConfig.column_cache_mb of uncapped bundles, when None
CACHE_RSS_SHARE = 0.7  # of a cap: what a capped child keeps idle at most, its column cache in


@dataclass(frozen=True)
class ManagerConfig:
    """How the TaskVine manager listens and whom it accepts.

    Attributes:
        port: TCP port; 0 picks a free one.
        listen_host: the local address the manager listens on (an IP address or a host
            name, resolved when the manager starts); :data:`ANY_HOST` (``"0.0.0.0"``),
            ``"::"`` or ``"*"`` listen on every interface. The default, loopback, is for a
            manager whose workers run on this host (``LocalCluster``, a local pool); a
            manager that workers on other hosts reach listens on the address they reach it
            by (a facility file's ``[manager] listen_host``, by default its ``host``).
            Needs datavine's TaskVine build (``VINE_LISTEN_ADDRESS``, see
            ``scripts/patches/cctools``); other builds listen on every interface.
        password_file: TaskVine password file; workers without it are rejected. ``None``
            makes :class:`~datavine.manager.cluster.Cluster` create one in its run directory.
        ssl_key, ssl_cert: PEM files; when both are set, workers must connect with ``--ssl``.
            The workers a cluster starts itself check that they reach this manager: local
            workers are pinned to ``ssl_cert``'s SHA-256 fingerprint (``--ssl-fingerprint``),
            pools get a facility file's ``ssl_ca``/``ssl_fingerprint`` (by default the same
            pin) (:mod:`datavine.deploy.tls`).
        run_dir: where the manager keeps logs, staging files and the password.
        name: optional project name (only used for logs; no catalog is contacted).
        worker_timeout_s: a connected worker that answers nothing for this long (it died
            and left a process holding its connection, it is frozen, its node dropped off
            the network) is declared lost, and its calls run elsewhere. TaskVine's
            keep-alive checks and its timeout for a reply are tuned from it; its own
            defaults (a 900 s keep-alive, a 3600 s reply timeout during which the manager
            answers no one) would freeze a run.
        debug_log: keep TaskVine's full debug log (``vine-logs/debug`` in the run's info
            folder: every message to and from every worker). TaskVine turns it on, all
            flags, for every manager; formatting and writing it was the largest single
            item of the manager's CPU per bundle that does not grow with the workers (see
            ``benchmarks/README.md``, "manager profile"), so datavine keeps only TaskVine's
            notices and errors there unless this is set (to diagnose TaskVine itself).
            cctools' debug flags are process-wide: the manager created last decides.
    """

    port: int = 0
    listen_host: str = "127.0.0.1"
    password_file: Path | None = None
    ssl_key: Path | None = None
    ssl_cert: Path | None = None
    run_dir: Path = Path("runs/manager")
    name: str | None = None
    worker_timeout_s: float = 15.0
    debug_log: bool = False

    def __post_init__(self) -> None:
        if not 0 <= self.port < 65536:
            raise ConfigError(f"ManagerConfig.port={self.port} is not a TCP port")
        if not self.listen_host or any(c.isspace() for c in self.listen_host):
            raise ConfigError(f"ManagerConfig.listen_host is not a host or address: "
                              f"{self.listen_host!r}")
        if self.worker_timeout_s < 3:
            raise ConfigError(f"ManagerConfig.worker_timeout_s must be >= 3, got "
                              f"{self.worker_timeout_s}")
        if (self.ssl_key is None) != (self.ssl_cert is None):
            raise ConfigError("ManagerConfig.ssl_key and ssl_cert must be given together")

    @property
    def listens_everywhere(self) -> bool:
        """Whether ``listen_host`` means every interface."""
        return self.listen_host in ANY_HOSTS

    @property
    def ssl(self) -> tuple[str, str] | None:
        if self.ssl_key and self.ssl_cert:
            return (str(self.ssl_key), str(self.ssl_cert))
        return None


@dataclass(frozen=True)
class RunConfig:
    """How one graph is run.

    Attributes:
        max_retries: attempts for a bundle that failed for a reason outside the user's code
            (lost worker, crashed library); user exceptions are raised at once, as dask does.
        no_worker_timeout_s: fail, naming the manager's address, when work is waiting and
            no worker has been connected for this long.
        timeout_s: optional bound on a whole run.
        max_bundle_tasks: most dask tasks sent to a worker in one function call.
        target_bundle_s: bundle size aims at this much work, from measured task durations.
        bundles_per_slot: bundles kept submitted per worker core: with datavine's TaskVine
            (patch 0015) they wait in the library on the worker and the next starts as one
            ends; also the library's function slots.
        longest_first: tasks that read the most entries go out first
            (:mod:`datavine.scheduler.longest_first`): a run's last bundles are its
            shortest, so its cores finish close together; equal chunks (within 5% of each
            other) keep dask's order.
        wait_s: the longest the manager waits for a result in one loop turn (whole seconds,
            >= 1: TaskVine's wait takes whole seconds and does nothing with 0); a result is
            handled as soon as it arrives.
        progress: show a rich progress bar on the terminal.
        memory: memory caps per task category (:class:`~datavine.scheduler.memory.MemoryPolicy`);
            bundles run under their cap in a long-lived child of the worker's library, so an
            overrun (or a crash) costs a retry of that bundle, not the worker. ``None`` runs
            bundles in the library process itself, uncapped (fastest for trivial tasks).
        placement: delay-scheduling limits for tasks that read files; ``None`` places
            nothing (locality-blind).
        shardmap: the XCache shards (:class:`~datavine.io.shards.ShardMap`): which rack holds
            each file, and where :func:`datavine.io.reading.open_input` reads it from.
        racks: which rack each host sits in (:class:`~datavine.scheduler.racks.RackMap`, the
            facility file's ``[racks]``), for workers that do not say their rack themselves
            (a ``rack:`` feature).
        preload: modules the worker library imports once, before forking the child that
            runs capped bundles
            (the modules of the graph's functions are added automatically).
        pickle_by_value: modules whose functions travel by value (not importable on workers).
        max_library_failures: the run stops with the library's log once it died this often.
        time_limits: seconds a task of a category (a dask key's prefix) may run; a task past
            its limit is stopped, retried once elsewhere, then fails the run with
            :class:`~datavine.errors.TaskTimeLimitError`. In capped bundles (``memory``) the
            bundle's child is killed even when the task is stuck in C code.
        task_time_limit_s: the limit of categories that ``time_limits`` does not name
            (``None``: none).
        keep_on_workers: values that only other tasks consume stay on the worker that made
            them (TaskVine temp files; :mod:`datavine.scheduler.intermediates`); only the graph's
            outputs and small values come back to the manager. ``False`` sends every
            value through the manager (for comparison).
        inline_max_bytes: a kept value of at most this size also comes back inline, where
            that is cheaper than a file.
        library_start_timeout_s: a worker whose library has not started this long after
            TaskVine sent it (its files come from a peer it cannot reach: TCP gives up
            after ~130 s) is dropped for the network: its calls go to other workers, its
            host is blocked until its library starts or ends, peer transfers go off, and
            the run summary says so (:mod:`datavine.scheduler.network`). A library starts
            in 1-3 s; unpacking a large packed environment takes longer.
        library_from_peers: let workers fetch the library's own files (a few KB) from
            each other, TaskVine's default; by default the manager sends them to each
            worker, so that a worker that cannot reach its peers still starts it.
        speculation: backup copies (:mod:`datavine.scheduler.speculation`): once nothing
            more waits to be sent and a core idles, a bundle waiting in a busy worker's
            library, or running past ``speculation_after`` x its expected time plus
            ``speculation_slack_s``, gets a copy on the idle core (reading through the next
            shard in line); the first result wins, the other copy is cancelled. Counted in
            the run summary (``backups``). A call waiting behind a late one in a worker's
            library is copied too (first). ``speculation_waiting``: also copy calls that
            only wait behind one on time (tail stealing; off by default: on this
            2-core machine it gained nothing measurable, its cancels stop running calls,
            whose capped child takes the worker's column cache with it, and twice a run
            stalled 60 s after such a cancel; see benchmarks/README.md, stragglers).
        read_around_slow_shards: an XCache shard whose reads, as the workers clock them,
            take 3x the other shards' seconds per byte (or whose bundles take 3x, where
            reads are not clocked; or whose calls run 5x the other shards' bundles on two
            workers at once: :mod:`datavine.scheduler.shard_pace`) is read around for a
            while: its files' next calls read through the next shard in line, which caches
            them too, and calls waiting in a worker's library to read through it are sent
            again around it. Judged on time, so a cold cache against warm ones can look
            slow; ``False`` keeps every file on its own shard (a failed shard is still read
            around). The summary's ``reads.slow_shards`` says when and why.
        column_cache: workers keep the columns they decoded (:mod:`datavine.io.column_cache`),
            across bundles and runs of the cluster, and placement prefers the worker that
            holds a file's columns; reads through :func:`datavine.io.cached_arrays.read_arrays`
            (the AGC path, coffea's ``DatavineSource``) use it. Hits are in
            ``last_summary.cache``; ``cluster.drop_caches()`` empties the caches.
        column_cache_share: the cache's bound in a capped bundle, as a share of the
            bundle's memory cap (the cache is counted inside the cap; < 0.8, the share of the
            cap a capped child may hold idle).
        column_cache_mb: an upper bound in MB on every worker process's cache (``None``: the
            share alone), and the bound of uncapped bundles' caches (``memory=None``:
            ``UNCAPPED_CACHE_MB`` when ``None``).
        input_cache_mb: the byte ranges a worker fetches from ``root://`` servers (the XCache
            shards) are kept on its disk, up to this many MB per worker, and a rerun reads
            them from there instead of the network (:mod:`datavine.io.disk_cache`: keyed by
            the file's ROOT header, so a changed file is never served from it; bytes served
            from disk are in ``last_summary.reads.disk_bytes``). 0 (the default): off. The
            cache lives in the worker's workspace (TaskVine's cache folder), which is the
            batch slot's scratch disk: TaskVine counts it as the worker's disk in use (a
            worker started with ``--disk`` leaves its manager when it uses more), the batch
            system counts it against the job's disk, and it takes at most half of the disk's
            free space. Only the site knows how much scratch its slots have and whether its
            network to the XCache is what limits a rerun, so it is off until the facility
            file says how much (``[run] input_cache_mb``; a few GB is typical).
        prefetch_mb: while a bundle computes, its worker reads ahead the baskets of the
            bundle waiting behind it in the library (its ``root://`` chunk, the branches the
            worker's last read of that tree took), up to this many MB held per worker
            process, and at most a tenth of a bundle's cap (:mod:`datavine.worker.prefetch`;
            needs datavine's TaskVine, patch 0018, and capped bundles; the memory is the
            capped child's, so it counts in the bundles' peaks and caps). Bytes read ahead
            and used are in ``last_summary.reads.prefetched_bytes``. 0 (the default): off;
            worth it where a chunk's read takes a good part of its compute time (a
            facility's network).
    """

    max_retries: int = 3
    no_worker_timeout_s: float = 60.0
    timeout_s: float | None = None
    max_bundle_tasks: int = 512
    target_bundle_s: float = 0.25
    bundles_per_slot: int = 2
    longest_first: bool = True
    wait_s: float = 1.0
    progress: bool = False
    memory: MemoryPolicy | None = field(default_factory=MemoryPolicy)
    placement: PlacementPolicy | None = field(default_factory=PlacementPolicy)
    shardmap: ShardMap | None = None
    racks: RackMap | None = None
    preload: tuple[str, ...] = ()
    pickle_by_value: tuple[str, ...] = ()
    max_library_failures: int = 3
    time_limits: Mapping[str, float] = field(default_factory=dict)
    task_time_limit_s: float | None = None
    keep_on_workers: bool = True
    inline_max_bytes: int = 64 * 1024
    library_start_timeout_s: float = 30.0
    library_from_peers: bool = False
    speculation: bool = True
    speculation_after: float = 2.0
    speculation_slack_s: float = 0.2
    speculation_waiting: bool = False
    read_around_slow_shards: bool = True
    column_cache: bool = True
    column_cache_share: float = 0.5
    column_cache_mb: float | None = None
    input_cache_mb: float = 0.0
    prefetch_mb: float = 0.0

    def column_cache_budget_mb(self, cap_mb: float | None) -> float:
        """The column cache's bound (MB) for a bundle under ``cap_mb`` (None: uncapped)."""
        if not self.column_cache:
            return 0.0
        if cap_mb is None or cap_mb <= 0:
            return float(self.column_cache_mb if self.column_cache_mb is not None
                         else UNCAPPED_CACHE_MB)
        share = self.column_cache_share * cap_mb
        return share if self.column_cache_mb is None else min(share, self.column_cache_mb)

    def column_cache_rss_mb(self, cap_mb: float | None) -> float:
        """The RSS a capped bundle's process may keep after it, its cache included (MB; 0:
        no bound): below the share of the cap at which a capped child is replaced
        (:data:`datavine.worker.capped_child.RECYCLE_FRACTION`, 0.8), so that the cache
        survives to the next bundle."""
        if not self.column_cache or cap_mb is None or cap_mb <= 0:
            return 0.0
        return CACHE_RSS_SHARE * cap_mb

    def prefetch_budget_mb(self, cap_mb: float | None) -> float:
        """What a bundle under ``cap_mb`` may hold read ahead for the next one (MB): the
        smaller of ``prefetch_mb`` and :data:`PREFETCH_CAP_SHARE` of the cap; 0 when off or
        uncapped (an uncapped bundle runs in the library, which reads nothing ahead)."""
        if self.prefetch_mb <= 0 or cap_mb is None or cap_mb <= 0:
            return 0.0
        return min(self.prefetch_mb, PREFETCH_CAP_SHARE * cap_mb)

    def time_limit(self, category: str) -> float | None:
        """The time limit of a task of ``category``, or None."""
        return self.time_limits.get(category, self.task_time_limit_s)

    def __post_init__(self) -> None:
        for name in ("max_bundle_tasks", "bundles_per_slot"):
            if getattr(self, name) < 1:
                raise ConfigError(f"RunConfig.{name} must be >= 1, got {getattr(self, name)}")
        if self.wait_s < 1:
            raise ConfigError(f"RunConfig.wait_s must be >= 1 (whole seconds), got {self.wait_s}")
        if self.speculation_after < 1 or self.speculation_slack_s < 0:
            raise ConfigError("RunConfig.speculation_after must be >= 1 and speculation_slack_s "
                              f">= 0, got {self.speculation_after} and "
                              f"{self.speculation_slack_s}")
        for name in ("no_worker_timeout_s", "target_bundle_s", "library_start_timeout_s"):
            if getattr(self, name) <= 0:
                raise ConfigError(f"RunConfig.{name} must be > 0, got {getattr(self, name)}")
        if self.max_retries < 0:
            raise ConfigError(f"RunConfig.max_retries must be >= 0, got {self.max_retries}")
        limits = {f"time_limits[{c!r}]": v for c, v in self.time_limits.items()}
        for name, limit in {**limits, "task_time_limit_s": self.task_time_limit_s}.items():
            if limit is not None and not limit > 0:
                raise ConfigError(f"RunConfig.{name} must be > 0 s, got {limit}")
        if self.max_library_failures < 1:
            raise ConfigError("RunConfig.max_library_failures must be >= 1, got "
                              f"{self.max_library_failures}")
        if not 0 <= self.column_cache_share < 0.8:
            raise ConfigError("RunConfig.column_cache_share must be in [0, 0.8), got "
                              f"{self.column_cache_share}")
        if self.column_cache_mb is not None and self.column_cache_mb < 0:
            raise ConfigError(f"RunConfig.column_cache_mb must be >= 0, got "
                              f"{self.column_cache_mb}")
        if not self.input_cache_mb >= 0:
            raise ConfigError(f"RunConfig.input_cache_mb must be >= 0 (0: off), got "
                              f"{self.input_cache_mb}")
        if not self.prefetch_mb >= 0:
            raise ConfigError(f"RunConfig.prefetch_mb must be >= 0 (0: off), got "
                              f"{self.prefetch_mb}")

    def replace(self, **changes: Unpack[RunChanges]) -> RunConfig:
        return dataclasses.replace(self, **changes)


class RunChanges(TypedDict, total=False):
    """The fields :meth:`RunConfig.replace` may change, each with its type (every field of
    :class:`RunConfig`; ``tests/test_typing.py`` checks that they stay the same)."""

    max_retries: int
    no_worker_timeout_s: float
    timeout_s: float | None
    max_bundle_tasks: int
    target_bundle_s: float
    bundles_per_slot: int
    longest_first: bool
    wait_s: float
    progress: bool
    memory: MemoryPolicy | None
    placement: PlacementPolicy | None
    shardmap: ShardMap | None
    racks: RackMap | None
    preload: tuple[str, ...]
    pickle_by_value: tuple[str, ...]
    max_library_failures: int
    time_limits: Mapping[str, float]
    task_time_limit_s: float | None
    keep_on_workers: bool
    inline_max_bytes: int
    library_start_timeout_s: float
    library_from_peers: bool
    speculation: bool
    speculation_after: float
    speculation_slack_s: float
    speculation_waiting: bool
    read_around_slow_shards: bool
    column_cache: bool
    column_cache_share: float
    column_cache_mb: float | None
    input_cache_mb: float
    prefetch_mb: float


def check_counts(owner: str, counts: Mapping[str, object], *, minimum: int = 1,
                 optional: bool = False) -> None:
    """Each of ``counts`` (a setting's name -> its value) a whole number >= ``minimum``, or
    None when ``optional``; else a ConfigError naming ``owner.name`` and the value. The
    sizes of a pool's workers (:class:`~datavine.deploy.pools.factory.FactoryConfig`) and of
    local ones (:class:`LocalWorkersConfig`) are checked with it alike."""
    for name, value in counts.items():
        if value is None and optional:
            continue
        if (isinstance(value, bool) or not isinstance(value, numbers.Integral)
                or value < minimum):
            wanted = f"a whole number >= {minimum}{' or None' if optional else ''}"
            raise ConfigError(f"{owner}.{name} must be {wanted}, got {value!r}")


@dataclass(frozen=True)
class LocalWorkersConfig:
    """Local ``vine_worker`` processes on 127.0.0.1 (the embedded default pool).

    ``racks``: rack labels; worker ``i`` of ``n`` gets ``racks[i * len(racks) // n]`` (the
    workers are split into equal blocks), as the feature ``rack:<name>``. The sizes
    (``workers`` >= 0; ``cores``, ``idle_timeout_s`` >= 1; ``memory_mb``, ``disk_mb`` >= 1 or
    None) are whole numbers, checked as a pool's are (:func:`check_counts`).
    """

    workers: int = 2
    cores: int = 1
    memory_mb: int | None = None
    disk_mb: int | None = None
    features: tuple[str, ...] = ()
    racks: tuple[str, ...] = ()
    idle_timeout_s: int = 900
    connect_timeout_s: float = 60.0
    extra_env: dict[str, str] = field(default_factory=dict)

    def __post_init__(self) -> None:
        check_counts("LocalWorkersConfig", {"workers": self.workers}, minimum=0)
        check_counts("LocalWorkersConfig", {"cores": self.cores,
                                            "idle_timeout_s": self.idle_timeout_s})
        check_counts("LocalWorkersConfig", {"memory_mb": self.memory_mb,
                                            "disk_mb": self.disk_mb}, optional=True)
        if not self.connect_timeout_s > 0:
            raise ConfigError(f"LocalWorkersConfig.connect_timeout_s must be > 0, got "
                              f"{self.connect_timeout_s}")
