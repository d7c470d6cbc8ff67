"""Run the scale test: the AGC-style analysis over a dataset on a pool, measured.

:func:`run_scale_test` does, in order:

1. the dataset: NanoAOD-like files made by :func:`datavine.io.datagen.generate_dataset`
   (reused when already there), or the files of a fileset JSON (URLs or paths);
2. optionally, a loopback XCache testbed (``xcache_shards``) that serves those files: tasks
   read ``root://`` URLs of the origin through their shard (``RunConfig.shardmap``);
3. the pool: a :class:`~datavine.manager.cluster.LocalCluster` by default; ``pool="external"``
   waits for workers of a pool started elsewhere on ``port``; ``pool="condor"`` starts
   HTCondor workers through ``vine_factory`` (:class:`~datavine.deploy.pools.CondorPool`). Workers
   are connected before the clock starts, as the challenge's pools were pre-started;
4. a first graph that reads each file's entry count on the workers (a file that does not
   open is reported failed, not fatal), then the processing graph: one task per chunk and
   pass (:func:`datavine.apps.scaletest.tasks.run_chunk`; the chunk a ``(path, start, stop)``
   argument, so placement sends a later pass's chunk to the worker whose column cache holds
   it) and a merge tree on the workers, timed;
5. the report (:func:`datavine.apps.scaletest.report.build_report`), and the run's view saved
   as one HTML file (``dashboard_html``; the live view's address is printed when the
   cluster is up: :mod:`datavine.dashboard`).
"""

from __future__ import annotations

import contextlib
import functools
import itertools
import json
import time
import uuid
from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass, replace
from pathlib import Path
from typing import TYPE_CHECKING

from datavine.apps.scaletest.report import ScaleReport, build_report
from datavine.apps.scaletest.tasks import FileInfo, Tally, file_info, merge_tallies, run_chunk
from datavine.config import ConfigError
from datavine.deploy.local_workers import default_workers
from datavine.errors import DatavineError
from datavine.scheduler.graph import Key, add_merge_tree

if TYPE_CHECKING:
    from datavine.apps.command_cluster import ClusterRequest
    from datavine.dashboard.launch import DashboardConfig
    from datavine.dashboard.metrics_listener import MetricsConfig
    from datavine.io.shards import ShardMap
    from datavine.manager.cluster import Cluster
    from datavine.scheduler.summary import RunSummary

Task = tuple[object, ...]  # a task of a classic dask graph: (function, *arguments)
POOLS = ("local", "external", "condor")
COMPRESSIONS = ("zstd", "lzma", "zlib", "lz4")


class ScaleTestError(DatavineError):
    """The scale test cannot run; the message names the setting or file at fault."""


@dataclass(frozen=True)
class ScaleTestConfig:
    """Settings of one scale test (the ``datavine scale-test`` options).

    Attributes:
        files, events_per_file, compression, seed, data_dir: the generated dataset.
        fileset: a JSON file of inputs instead (``{"dataset": ["url", ...]}``, coffea's
            ``{"dataset": {"files": {url: tree}}}`` or a plain list); relative paths are
            relative to the JSON file.
        chunk_events: events per task (equal chunks within a file, as coffea makes them).
        workers, cores, memory_mb: the pool (local default: one 1-core worker per core).
        pool: ``local``, ``external`` (workers of a pool started elsewhere connect to
            ``port`` with ``password_file``) or ``condor`` (HTCondor through vine_factory).
        manager_host: where condor workers find the manager.
        xcache_shards: serve the files through a loopback XCache testbed of N shards.
        facility: a facility file: the manager, the run settings and the XCache shards
            come from it (the generated files must lie in its ``xcache.export_root``, and
            are read through its origin's shards); the workers are its pools', or
            ``workers`` of a pool started elsewhere (``pool="external"``).
        retries: attempts again of a chunk that failed with an I/O error.
        merge_fanin: chunk results merged per merge task.
        passes: read the dataset this many times, each pass's chunks tasks of their own: a
            run long enough to show ramp-up, steady state and tail from a small generated
            dataset (the CLI's default; ``--quick`` is one pass of today's 8 small files).
        timeout_s: bound on the processing graph (``RunConfig.timeout_s``).
        connect_timeout_s: how long to wait for the pool's workers.
        bin_s: the timeline's bin width (default: the wall time / 120, at least 0.25 s).
        progress: datavine's progress bar.
        dashboard: the cluster's live view (``None``: the default, on unless
            ``DATAVINE_DASHBOARD=0``; ``False``: none; a
            :class:`~datavine.dashboard.launch.DashboardConfig`).
        dashboard_html: save the processing run's view there (one HTML file).
        metrics: the manager's own ``/metrics`` listener (``None``: ``DATAVINE_METRICS``,
            else the facility file's, else none).
        memory_caps: run every bundle under datavine's memory caps, in the library's
            capped child (the default); ``False`` runs bundles in the library process.
        column_cache: the workers keep the columns they decoded
            (``RunConfig.column_cache``, on by default): a later pass over the same files
            reads them from memory. The report gives the hit fraction of the run and of
            each pass. Applies to the cluster the scale test starts (a given one keeps its
            settings).
        column_cache_share: the column cache's share of a bundle's memory cap
            (``RunConfig.column_cache_share``; ``None``: the run settings', 0.5 by default):
            more room for the decoded columns, under larger caps.
        drop_caches: empty the workers' column caches before processing
            (``cluster.drop_caches()``): a cold first pass on a cluster that ran before.
    """

    files: int = 8
    events_per_file: int = 100_000
    chunk_events: int = 100_000
    compression: str = "zstd"
    seed: int = 0
    data_dir: Path = Path("runs/scaletest/data")
    fileset: Path | None = None
    workers: int | None = None
    cores: int = 1
    memory_mb: int | None = None
    pool: str = "local"
    port: int = 0
    password_file: Path | None = None
    manager_host: str = "127.0.0.1"
    xcache_shards: int = 0
    facility: Path | None = None
    retries: int = 1
    merge_fanin: int = 8
    passes: int = 1
    timeout_s: float | None = None
    connect_timeout_s: float = 120.0
    bin_s: float | None = None
    progress: bool = False
    dashboard: bool | DashboardConfig | None = None
    dashboard_html: Path | None = None
    metrics: MetricsConfig | None = None
    memory_caps: bool = True
    column_cache: bool = True
    column_cache_share: float | None = None
    drop_caches: bool = False
    tree: str = "Events"

    def __post_init__(self) -> None:
        for name in ("files", "events_per_file", "chunk_events", "cores", "passes"):
            if getattr(self, name) < 1:
                raise ConfigError(f"scale test: {name} must be >= 1, got {getattr(self, name)}")
        if self.workers is not None and self.workers < 1:
            raise ConfigError(f"scale test: workers must be >= 1, got {self.workers}")
        if self.compression not in COMPRESSIONS:
            raise ConfigError(f"scale test: compression must be one of {COMPRESSIONS}, got "
                              f"{self.compression!r}")
        if self.pool not in POOLS:
            raise ConfigError(f"scale test: pool must be one of {POOLS}, got {self.pool!r}")
        if self.facility is not None and self.xcache_shards:
            raise ConfigError("scale test: a facility's shards (--facility) and a loopback "
                              "XCache testbed (--xcache) exclude each other")
        if self.pool == "external" and self.facility is None and not (
                self.port and self.password_file):
            raise ConfigError("scale test: pool 'external' needs the manager's port and "
                              "password file (--port, --password) that its workers use")
        if self.merge_fanin < 2:
            raise ConfigError(f"scale test: merge_fanin must be >= 2, got {self.merge_fanin}")
        if self.xcache_shards < 0 or self.retries < 0:
            raise ConfigError("scale test: xcache_shards and retries must be >= 0")

    @property
    def n_workers(self) -> int:
        return self.workers or default_workers()


def run_scale_test(config: ScaleTestConfig, cluster: Cluster | None = None) -> ScaleReport:
    """Run the scale test; ``cluster`` (a started datavine cluster) replaces the pool."""
    setup: dict[str, float] = {}
    t = time.monotonic()
    files = dataset_files(config)
    setup["data_s"] = round(time.monotonic() - t, 3)
    with contextlib.ExitStack() as stack:
        t = time.monotonic()
        shardmap, files = serve_files(stack, config, files)
        setup["xcache_s"] = round(time.monotonic() - t, 3)
        t = time.monotonic()
        if cluster is None:
            cluster = start_cluster(stack, config, shardmap)
        setup["cluster_s"] = round(time.monotonic() - t, 3)
        t = time.monotonic()
        infos = read_file_infos(cluster, files, config.tree)
        setup["metadata_s"] = round(time.monotonic() - t, 3)
        chunks = make_chunks(infos, config.chunk_events)
        if config.drop_caches:
            cluster.drop_caches()
        t0 = time.time()
        started = time.monotonic()
        tally = process_chunks(cluster, chunks, config) if chunks else Tally()
        wall_s = time.monotonic() - started
        summary = cluster.last_summary if chunks else None
        workers, cores = pool_size(cluster, summary)
        view = save_view(cluster, config) if chunks else None
    report = build_report(infos, tally, wall_s=wall_s, t0=t0, workers=workers, cores=cores,
                          summary=summary, n_chunks=len(chunks) * config.passes,
                          bin_s=config.bin_s,
                          passes=config.passes)
    report.setup_s = setup
    report.config = {k: (str(v) if isinstance(v, Path) else v)
                     for k, v in asdict(config).items()}
    report.config["dashboard"] = config.dashboard is not False  # never its access token
    report.dashboard_html = str(view) if view is not None else None
    return report


def save_view(cluster: Cluster, config: ScaleTestConfig) -> Path | None:
    """The processing run's view as one HTML file at ``config.dashboard_html`` (None
    without one, or when the cluster has no view)."""
    if config.dashboard_html is None:
        return None
    try:
        return cluster.save_report(config.dashboard_html, title="datavine scale test")
    except OSError as exc:
        raise ScaleTestError(f"cannot write the run's view {config.dashboard_html}: "
                             f"{exc.strerror or exc}") from exc


# ---------------------------------------------------------------------------------------
# dataset


def dataset_files(config: ScaleTestConfig) -> list[str]:
    """The input files: the fileset's, or the generated dataset (made once)."""
    if config.fileset is not None:
        return fileset_files(config.fileset)
    from datavine.io.datagen import generate_dataset

    try:
        paths = generate_dataset(config.data_dir, config.files, config.events_per_file,
                                 config.compression, seed=config.seed)
    except OSError as exc:
        raise ScaleTestError(f"cannot write the generated data into {config.data_dir}: "
                             f"{exc.strerror or exc}") from exc
    return [str(p.resolve()) for p in paths]


def fileset_files(path: Path) -> list[str]:
    """Every file of a fileset JSON, in order, each once."""
    try:
        doc = json.loads(Path(path).read_text())
    except OSError as exc:
        raise ScaleTestError(f"cannot read the fileset {path}: {exc.strerror or exc}") from exc
    except json.JSONDecodeError as exc:
        raise ScaleTestError(f"the fileset {path} is not JSON: {exc}") from exc
    names: list[str] = []
    groups = doc.values() if isinstance(doc, dict) else [doc]
    for group in groups:
        if isinstance(group, dict):
            group = group.get("files", [])
        if isinstance(group, dict):
            group = list(group)
        if not isinstance(group, list) or not all(isinstance(n, str) for n in group):
            raise ScaleTestError(f"the fileset {path}: expected lists of file names or URLs "
                                 "per dataset, or {'files': {...}}")
        names.extend(group)
    base = Path(path).resolve().parent
    files = [n if "://" in n else str((base / n).resolve()) for n in names]
    if not files:
        raise ScaleTestError(f"the fileset {path} names no files")
    return list(dict.fromkeys(files))


def serve_files(stack: contextlib.ExitStack, config: ScaleTestConfig,
                files: list[str]) -> tuple[ShardMap | None, list[str]]:
    """Without XCache: (None, files). With it: a testbed serving the files' folder, and the
    files' ``root://`` URLs at its origin; with a facility, its shards and origin."""
    if config.facility is not None:
        return facility_files(config.facility, files)
    if not config.xcache_shards:
        return None, files
    from datavine.apps.testbed import serve_on_testbed
    from datavine.io.xcache.testbed import xcache_missing

    why = xcache_missing()
    if why:
        raise ScaleTestError(f"--xcache needs XRootD: {why}")
    local = [Path(f) for f in files if "://" not in f]
    if len(local) != len(files) or len({p.parent for p in local}) != 1:
        raise ScaleTestError("--xcache serves local files of one folder (the generated "
                             "dataset), not a fileset of URLs")
    from datavine.apps.analysis.sources import origin_url

    testbed, folder, served = serve_on_testbed(stack, local[0].parent, local,
                                               config.xcache_shards)
    return testbed.shard_map(), [origin_url(p, folder, testbed.origin_url) for p in served]


def facility_files(path: Path, files: list[str]) -> tuple[ShardMap, list[str]]:
    """The facility's shard map, and the files' URLs at its origin."""
    from datavine.apps.analysis.sources import origin_url
    from datavine.deploy.facility import load_facility

    facility = load_facility(path)
    shards = facility.shards
    if shards is None or shards.origin is None or facility.export_root is None:
        raise ScaleTestError(f"{path}: [xcache] origin, export_root and shards are needed to "
                             "read the files through the facility's shards")
    try:
        urls = [f if "://" in f else origin_url(f, facility.export_root, shards.origin.url)
                for f in files]
    except ValueError as exc:
        raise ScaleTestError(f"{path}: xcache.export_root: {exc}") from exc
    return shards, urls


# ---------------------------------------------------------------------------------------
# pool


def cluster_request(config: ScaleTestConfig, shardmap: ShardMap | None) -> ClusterRequest:
    """What the scale test asks of its cluster: a facility's, local workers, or a manager
    for a pool started elsewhere (``external``) or for HTCondor's (``condor``, started after)."""
    from datavine.apps.command_cluster import ClusterRequest

    external = config.pool == "external"
    if config.facility is not None:
        from datavine.deploy.facility import load_facility

        return ClusterRequest(
            facility=load_facility(config.facility), shardmap=shardmap,
            progress=config.progress, timeout_s=config.timeout_s,
            memory_caps=config.memory_caps, pool_workers=config.n_workers if external else None,
            connect_timeout_s=config.connect_timeout_s, dashboard=config.dashboard,
            column_cache=config.column_cache, column_cache_share=config.column_cache_share,
            metrics=config.metrics)
    request = ClusterRequest(
        shardmap=shardmap, progress=config.progress, timeout_s=config.timeout_s,
        memory_caps=config.memory_caps, no_worker_timeout_s=max(60.0, config.connect_timeout_s),
        connect_timeout_s=config.connect_timeout_s, dashboard=config.dashboard,
        run_dir_prefix="datavine-scaletest-", column_cache=config.column_cache,
        column_cache_share=config.column_cache_share, metrics=config.metrics)
    if config.pool == "local":
        return replace(request, workers=config.n_workers, cores=config.cores,
                       memory_mb=config.memory_mb)
    # workers from a pool started elsewhere, or HTCondor's: they reach it at manager_host
    return replace(request, port=config.port, listen_host=config.manager_host,
                   password_file=config.password_file if external else None,
                   pool_workers=config.n_workers if external else 0)


def start_cluster(stack: contextlib.ExitStack, config: ScaleTestConfig,
                  shardmap: ShardMap | None) -> Cluster:
    """A started cluster with its workers connected (:mod:`datavine.apps.command_cluster`);
    closed by ``stack``."""
    from datavine.apps.command_cluster import start_command_cluster

    cluster = start_command_cluster(stack, cluster_request(config, shardmap)).cluster
    if config.dashboard is not False:
        from datavine.dashboard.launch import announce

        print(f"scale test: {announce(cluster)}", flush=True)
    if config.pool == "condor":
        start_condor_workers(stack, config, cluster)
    return cluster


def start_condor_workers(stack: contextlib.ExitStack, config: ScaleTestConfig,
                         cluster: Cluster) -> None:
    """HTCondor workers for ``cluster`` through vine_factory, connected before returning."""
    from datavine.deploy.pools import CondorPool, FactoryConfig
    from datavine.deploy.pools.condor import pool_missing

    why = pool_missing()
    if why:
        raise ScaleTestError(f"--pool condor: {why}")
    factory = FactoryConfig(config.manager_host, cluster.port, batch="condor",
                            workers=config.n_workers, min_workers=config.n_workers,
                            cores=config.cores, memory_mb=config.memory_mb,
                            password_file=cluster.password_file, idle_timeout_s=300)
    pool = CondorPool(factory, name=f"scaletest-{uuid.uuid4().hex[:6]}")
    stack.enter_context(pool)
    assert cluster.runtime is not None  # started
    cluster.runtime.wait_for_workers(config.n_workers, config.connect_timeout_s)


def pool_size(cluster: Cluster, summary: RunSummary | None) -> tuple[int, int]:
    """(workers, cores) of the pool during the run: the most the runtime sampled, else
    what is connected now."""
    if summary is not None and summary.samples:
        return max(s[1] for s in summary.samples), max(s[2] for s in summary.samples)
    if cluster.runtime is not None:
        return cluster.runtime.pool_size()
    workers = summary.workers if summary is not None else 0
    return workers, workers


# ---------------------------------------------------------------------------------------
# graphs


def read_file_infos(cluster: Cluster, files: Sequence[str], tree: str) -> list[FileInfo]:
    """Each file's entry count, read on the workers (one task per file)."""
    token = uuid.uuid4().hex
    graph = {("scaletest-open", token, i): (file_info, f, tree) for i, f in enumerate(files)}
    return list(cluster.get(graph, list(graph)))


def make_chunks(infos: Sequence[FileInfo], chunk_events: int) -> list[tuple[str, int, int]]:
    """Equal chunks of about ``chunk_events`` entries per readable file."""
    chunks: list[tuple[str, int, int]] = []
    for info in infos:
        if info.error is not None or info.entries == 0:
            continue
        pieces = max(1, -(-info.entries // chunk_events))
        bounds = [info.entries * i // pieces for i in range(pieces + 1)]
        chunks.extend((info.path, lo, hi) for lo, hi in itertools.pairwise(bounds) if hi > lo)
    return chunks


def process_chunks(cluster: Cluster, chunks: Sequence[tuple[str, int, int]],
                   config: ScaleTestConfig) -> Tally:
    """Every chunk ``config.passes`` times, in one graph, merged on the workers."""
    graph, final = analysis_graph(chunks, config.retries, config.merge_fanin, config.passes)
    cluster.expect_events(chunk_events(graph))  # events/s in the live view and the metrics
    return cluster.get(graph, [final])[0]


def chunk_events(graph: Mapping[Key, Task]) -> dict[Key, int]:
    """The events of each chunk's task in an :func:`analysis_graph` (for the live view)."""
    out: dict[Key, int] = {}
    for key, task in graph.items():
        if isinstance(key, tuple) and key[0] == "agc-chunk" and isinstance(task[1], tuple):
            _, start, stop = task[1]
            if isinstance(start, int) and isinstance(stop, int):
                out[key] = stop - start
    return out


def analysis_graph(chunks: Sequence[tuple[str, int, int]], retries: int, fanin: int,
                   passes: int = 1) -> tuple[dict[Key, Task], Key]:
    """A task per chunk and pass (the chunk a ``(path, start, stop)`` argument, so datavine
    sees the file and the entries it reads) and a merge tree per pass, ``fanin`` at a time,
    whose first merge takes the total of the passes before (an empty tally before the
    first); returns (graph, final key).

    With the passes chained so, dask's order (the priority datavine takes ready tasks in)
    takes them one after another, as reruns would be: a chunk's later read finds its columns
    in the cache of the worker that read it before (placement sends it there). In one tree
    over all the passes it took the last pass first and mixed the others, so that a pass's
    figures mixed a chunk's first (cold) reads with its later (warm) ones. The chunk tasks
    take no input: nothing pulls them to a worker but what it holds. A chunk sent while its
    previous read still runs (the last few of a pass) reads its file again; one of a pass's
    end held for a worker may run after the next pass's read of it, and the report counts
    a chunk's reads in the order they ran (:func:`.report.passes_in_read_order`)."""
    token = uuid.uuid4().hex
    total: Key = ("agc-start", token)
    graph: dict[Key, Task] = {total: (Tally,)}
    for p in range(passes):
        leaves: list[Key] = [total]
        for i, (path, start, stop) in enumerate(chunks):
            leaves.append(("agc-chunk", token, p * len(chunks) + i))
            graph[leaves[-1]] = (run_chunk, (path, start, stop), retries, p)
        total = add_merge_tree(graph, leaves, fanin, key=functools.partial(_merge_key, token, p),
                               task=lambda keys: (merge_tallies, keys))
    return graph, total


def _merge_key(token: str, pass_index: int, depth: int, j: int) -> Key:
    return ("agc-merge", token, pass_index, depth, j)
