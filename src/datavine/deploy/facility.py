"""A facility description (TOML) turned into datavine's configuration objects.

One file says how a site runs datavine: the manager (the host name workers reach it by,
the address it listens on, port, password, TLS and what the pools' workers check its
certificate against, the pools' catalog), how graphs are
run, the XCache shards and their racks, which hosts sit in which rack (``[racks]``, a
:class:`~datavine.scheduler.racks.RackMap`), the worker pools, and the memory and placement
policies. :func:`load_facility` reads it with :mod:`tomllib` and returns a
:class:`Facility` holding :class:`~datavine.config.ManagerConfig`,
:class:`~datavine.config.RunConfig`, :class:`~datavine.io.shards.ShardMap`,
:class:`~datavine.scheduler.memory.MemoryPolicy`,
:class:`~datavine.scheduler.placement.PlacementPolicy` and
one :class:`PoolSettings` per pool. ``manager/facility.example.toml`` documents every key.

Every problem is a :class:`FacilityError` naming the file and the key: unknown sections and
keys (a typo must not silently fall back to a default), values of the wrong type, values the
configuration classes refuse, and (by default) files that do not exist. Relative paths are
relative to the facility file's folder.

:class:`FacilityCluster` is a :class:`~datavine.manager.cluster.Cluster` whose workers come from the
facility's pools: it starts one ``vine_factory`` per pool for its manager, waits for the
pre-started workers, and stops the pools when it closes (``datavine run --facility``).

A manager with TLS (``[manager] ssl_key``/``ssl_cert``) has its pools' workers check its
certificate (:mod:`datavine.deploy.tls`): against ``ssl_ca`` (a CA file: the chain, and
the name ``host``), ``ssl_fingerprint`` (a pinned SHA-256), or both; given neither, they are
pinned to ``ssl_cert``'s own fingerprint (:meth:`Facility.worker_trust`).
"""

from __future__ import annotations

import os
import tomllib
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TypeVar

from datavine.config import ConfigError, LocalWorkersConfig, ManagerConfig, RunConfig
from datavine.deploy.pools.factory import (
    BATCHES,
    NO_CATALOG,
    Batch,
    FactoryConfig,
    is_host_port,
)
from datavine.deploy.pools.factory_pool import FactoryPool, pool_class
from datavine.deploy.pools.warm import WarmReport, warm_pools
from datavine.deploy.tls import ManagerTrust, check_ca_file, check_fingerprint
from datavine.io.shards import Shard, ShardMap
from datavine.manager.cluster import Cluster, manager_pin
from datavine.scheduler.memory import MemoryPolicy
from datavine.scheduler.placement import PlacementPolicy
from datavine.scheduler.racks import RackMap, url_host


class FacilityError(ConfigError):
    """A facility file cannot be used; the message names the file and the key."""

    def __init__(self, path: Path, key: str, problem: str) -> None:
        self.path = path
        self.key = key
        super().__init__(f"{path}: {key}: {problem}")


# ----------------------------------------------------------------------------------------------
# Value kinds: each checks a TOML value and converts it.
Kind = Callable[[object, "_Where"], object]
T = TypeVar("T")


@dataclass(frozen=True)
class _Where:
    path: Path
    key: str

    def error(self, problem: str) -> FacilityError:
        return FacilityError(self.path, self.key, problem)


def _int(value: object, where: _Where) -> int:
    if isinstance(value, bool) or not isinstance(value, int):
        raise where.error(f"expected an integer, got {value!r}")
    return value


def _float(value: object, where: _Where) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise where.error(f"expected a number, got {value!r}")
    return float(value)


def _bool(value: object, where: _Where) -> bool:
    if not isinstance(value, bool):
        raise where.error(f"expected true or false, got {value!r}")
    return value


def _str(value: object, where: _Where) -> str:
    if not isinstance(value, str) or not value:
        raise where.error(f"expected a non-empty string, got {value!r}")
    return value


def _path(value: object, where: _Where) -> Path:
    text = os.path.expanduser(_str(value, where))
    path = Path(text)
    return path if path.is_absolute() else (where.path.parent / path)


def _str_list(value: object, where: _Where) -> tuple[str, ...]:
    if not isinstance(value, list):
        raise where.error(f"expected a list of strings, got {value!r}")
    return tuple(_str(v, _Where(where.path, f"{where.key}[{i}]")) for i, v in enumerate(value))


def _float_map(value: object, where: _Where) -> dict[str, float]:
    if not isinstance(value, dict):
        raise where.error(f"expected a table of numbers, got {value!r}")
    return {k: _float(v, _Where(where.path, f"{where.key}.{k}")) for k, v in value.items()}


def _read_table(table: object, schema: Mapping[str, Kind], path: Path,
                section: str) -> dict[str, object]:
    """Check ``table`` against ``schema``: known keys only, each value of its kind."""
    if not isinstance(table, dict):
        raise FacilityError(path, section, f"expected a table, got {table!r}")
    out: dict[str, object] = {}
    for key, value in table.items():
        if key not in schema:
            raise FacilityError(path, f"{section}.{key}", "unknown key; expected one of "
                                f"{', '.join(sorted(schema))}")
        out[key] = schema[key](value, _Where(path, f"{section}.{key}"))
    return out


def _build(cls: Callable[..., T], values: Mapping[str, object], path: Path, section: str) -> T:
    """``cls(**values)``, its ConfigError/ValueError re-raised naming the file and section."""
    try:
        return cls(**values)
    except (ConfigError, ValueError, TypeError) as exc:
        raise FacilityError(path, section, str(exc)) from exc


def _pop(values: dict[str, object], key: str, kind: type[T]) -> T | None:
    """``values[key]`` removed, as the ``kind`` its schema made it; None when absent."""
    value = values.pop(key, None)
    return value if isinstance(value, kind) else None


def _get(values: Mapping[str, object], key: str, kind: type[T]) -> T | None:
    """``values[key]``, as the ``kind`` its schema made it; None when absent."""
    value = values.get(key)
    return value if isinstance(value, kind) else None


# ----------------------------------------------------------------------------------------------
MANAGER_KEYS: dict[str, Kind] = {"host": _str, "listen_host": _str, "catalog": _str,
                                 "workers_timeout_s": _float, "port": _int,
                                 "password_file": _path, "ssl_key": _path, "ssl_cert": _path,
                                 "ssl_ca": _path, "ssl_fingerprint": _str, "run_dir": _path,
                                 "name": _str, "worker_timeout_s": _float,
                                 "debug_log": _bool}
RUN_KEYS: dict[str, Kind] = {"max_retries": _int, "no_worker_timeout_s": _float,
                             "timeout_s": _float, "max_bundle_tasks": _int,
                             "target_bundle_s": _float, "bundles_per_slot": _int,
                             "wait_s": _float, "progress": _bool, "preload": _str_list,
                             "pickle_by_value": _str_list, "max_library_failures": _int,
                             "time_limits": _float_map, "task_time_limit_s": _float,
                             "library_start_timeout_s": _float, "library_from_peers": _bool,
                             "speculation": _bool, "speculation_after": _float,
                             "speculation_slack_s": _float,
                             "speculation_waiting": _bool,
                             "read_around_slow_shards": _bool, "column_cache": _bool,
                             "column_cache_share": _float, "column_cache_mb": _float,
                             "input_cache_mb": _float, "prefetch_mb": _float}
XCACHE_KEYS: dict[str, Kind] = {"origin": _str, "export_root": _path, "shards": lambda v, w: v}
SHARD_KEYS: dict[str, Kind] = {"url": _str, "rack": _str, "name": _str, "weight": _float}
MEMORY_KEYS: dict[str, Kind] = {"enabled": _bool, "default_mb": _float, "ceiling_mb": _float,
                                "floor_mb": _float, "headroom": _float, "growth": _float,
                                "per_category": _float_map, "step_mb": _float,
                                "min_samples": _int}
PLACEMENT_KEYS: dict[str, Kind] = {"enabled": _bool, "max_wait_s": _float,
                                   "cache_wait_s": _float}
POOL_KEYS: dict[str, Kind] = {"name": _str, "batch": _str, "workers": _int, "min_workers": _int,
                              "cores": _int, "memory_mb": _int, "disk_mb": _int, "rack": _str,
                              "features": _str_list, "idle_timeout_s": _int,
                              "factory_period_s": _int, "condor_submit": _str_list}
LOCAL_WORKERS_KEYS: dict[str, Kind] = {"workers": _int, "cores": _int, "memory_mb": _int,
                                       "disk_mb": _int, "features": _str_list,
                                       "racks": _str_list, "idle_timeout_s": _int}
SECTIONS = ("manager", "run", "xcache", "racks", "memory", "placement", "pools",
            "local_workers", "metrics")
METRICS_KEYS: dict[str, Kind] = {"listen": _str}


@dataclass(frozen=True)
class PoolSettings:
    """One worker pool of the facility; the manager's address is filled in at start."""

    name: str
    batch: Batch = "condor"  # checked: a file's value is any string
    workers: int = 1
    min_workers: int | None = None  # None: all of ``workers`` pre-started
    cores: int = 1
    memory_mb: int | None = None
    disk_mb: int | None = None
    rack: str | None = None
    features: tuple[str, ...] = ()
    idle_timeout_s: int = 900
    factory_period_s: int = 5
    condor_submit: tuple[str, ...] = ()

    def __post_init__(self) -> None:
        if self.batch not in BATCHES:
            raise ConfigError(f"batch must be one of {', '.join(BATCHES)}, got {self.batch!r}")
        # FactoryConfig checks the rest: build one against a placeholder manager now, so
        # that a bad pool fails when the file is read, not when the run starts it.
        self.factory_config("127.0.0.1", 9123)

    @property
    def prestarted(self) -> int:
        return self.workers if self.min_workers is None else self.min_workers

    def factory_config(self, host: str, port: int, password_file: Path | None = None,
                       ssl: bool = False, *, catalog: str = NO_CATALOG,
                       transfer_address: str | None = None,
                       trust: ManagerTrust | None = None) -> FactoryConfig:
        """The pool's vine_factory settings; ``transfer_address`` applies to a local pool
        only (its workers run on the manager's host), one on other hosts listens on all;
        ``trust``: what the workers check the manager's certificate against."""
        local = self.batch == "local"
        return FactoryConfig(
            manager_host=host, manager_port=port, batch=self.batch,
            workers=self.workers, min_workers=self.prestarted, cores=self.cores,
            memory_mb=self.memory_mb, disk_mb=self.disk_mb, features=self.features,
            rack=self.rack, password_file=password_file, ssl=ssl,
            idle_timeout_s=self.idle_timeout_s, factory_period_s=self.factory_period_s,
            extra_condor_submit=self.condor_submit, catalog=catalog,
            transfer_address=transfer_address if local else None,
            ssl_ca=trust.ca_file if trust is not None else None,
            ssl_fingerprint=trust.fingerprint if trust is not None else None)


@dataclass(frozen=True)
class Facility:
    """Everything a facility file says, as datavine's configuration objects.

    ``run`` already carries ``memory``, ``placement``, ``shards`` and ``racks``
    (``RunConfig.memory``, ``.placement``, ``.shardmap``, ``.racks``); ``memory``/``placement``
    are ``None`` when the file switches them off (``enabled = false``). A shard given
    without a rack has the rack ``racks`` maps its URL's host to.
    """

    path: Path
    manager: ManagerConfig
    run: RunConfig
    memory: MemoryPolicy | None = field(default_factory=MemoryPolicy)
    placement: PlacementPolicy | None = field(default_factory=PlacementPolicy)
    shards: ShardMap | None = None
    export_root: Path | None = None  # the folder the XCache origin serves, seen from here
    pools: tuple[PoolSettings, ...] = ()
    local_workers: LocalWorkersConfig | None = None
    racks: RackMap | None = None  # which hosts sit in which rack ([racks])
    manager_host: str = "127.0.0.1"  # the name workers reach the manager by
    catalog: str = NO_CATALOG  # where the pools' vine_factory report (loopback: nowhere)
    workers_timeout_s: float = 120.0  # how long to wait for the pools' pre-started workers
    ssl_ca: Path | None = None  # the pools' workers check the manager's certificate
    ssl_fingerprint: str | None = None  # against these ([manager] ssl_ca, ssl_fingerprint)
    # the manager's own /metrics listener ([metrics] listen = "[ADDRESS:]PORT"), unless
    # DATAVINE_METRICS or a command's --metrics says otherwise
    metrics_listen: tuple[str, int] | None = None

    @property
    def prestarted_workers(self) -> int:
        """Workers the pools start without waiting for work."""
        return sum(p.prestarted for p in self.pools)

    def worker_trust(self) -> ManagerTrust | None:
        """What the pools' workers check the manager's certificate against: ``ssl_ca``
        and/or ``ssl_fingerprint`` as given; given neither, with TLS on, a pin to the
        manager's own ``ssl_cert``; None without TLS. Files are read now: a FacilityError
        names the key whose file is missing or holds no certificate."""
        key = "manager.ssl_cert"
        try:
            if self.ssl_ca is not None or self.ssl_fingerprint is not None:
                key = "manager.ssl_ca"
                return ManagerTrust(self.ssl_ca, self.ssl_fingerprint)
            return manager_pin(self.manager)
        except ConfigError as exc:
            raise FacilityError(self.path, key, str(exc)) from exc


def load_facility(path: str | os.PathLike[str], *, check_files: bool = True) -> Facility:
    """Read and check a facility file. With ``check_files``, files it names must exist."""
    path = Path(path)
    try:
        doc = tomllib.loads(path.read_text())
    except OSError as exc:
        raise FacilityError(path, "(file)", f"cannot read it: {exc.strerror or exc}") from exc
    except UnicodeDecodeError as exc:
        raise FacilityError(path, "(file)", f"not UTF-8 text (byte {exc.start}: "
                            f"{exc.object[exc.start:exc.start + 1]!r}); TOML files are UTF-8"
                            ) from exc
    except tomllib.TOMLDecodeError as exc:
        raise FacilityError(path, "(file)", f"not valid TOML: {exc}") from exc
    for section in doc:
        if section not in SECTIONS:
            raise FacilityError(path, section, f"unknown section; expected one of "
                                f"{', '.join(SECTIONS)}")
    manager_table = dict(_read_table(doc.get("manager", {}), MANAGER_KEYS, path, "manager"))
    host = _pop(manager_table, "host", str) or "127.0.0.1"
    # the manager listens where it is reached, unless told otherwise (manager/listen.py)
    manager_table.setdefault("listen_host", host)
    catalog = _pop(manager_table, "catalog", str) or NO_CATALOG
    if not is_host_port(catalog):
        raise FacilityError(path, "manager.catalog", f"expected host:port, got {catalog!r}")
    timeout = _pop(manager_table, "workers_timeout_s", float)
    workers_timeout_s = 120.0 if timeout is None else timeout
    if workers_timeout_s <= 0:
        raise FacilityError(path, "manager.workers_timeout_s", f"must be > 0, got "
                            f"{workers_timeout_s}")
    ssl_ca = _pop(manager_table, "ssl_ca", Path)
    ssl_fingerprint = _pop(manager_table, "ssl_fingerprint", str)
    manager = _manager(manager_table, path, check_files)
    ssl_fingerprint = _trust(manager, ssl_ca, ssl_fingerprint, path, check_files)
    shards, export_root = _xcache(doc.get("xcache"), path, check_files)
    racks = _racks(doc.get("racks"), path)
    shards = _racked(shards, racks, path)
    memory = _policy(MemoryPolicy, doc.get("memory", {}), MEMORY_KEYS, path, "memory")
    placement = _policy(PlacementPolicy, doc.get("placement", {}), PLACEMENT_KEYS, path,
                        "placement")
    run = _read_table(doc.get("run", {}), RUN_KEYS, path, "run")
    run.update(memory=memory, placement=placement, shardmap=shards, racks=racks)
    facility = Facility(
        path=path,
        manager=manager,
        run=_build(RunConfig, run, path, "run"),
        memory=memory,
        placement=placement,
        shards=shards,
        export_root=export_root,
        pools=_pools(doc.get("pools", []), path),
        local_workers=_local_workers(doc.get("local_workers"), path),
        racks=racks,
        manager_host=host,
        catalog=catalog,
        workers_timeout_s=workers_timeout_s,
        ssl_ca=ssl_ca,
        ssl_fingerprint=ssl_fingerprint,
        metrics_listen=_metrics(doc.get("metrics"), path),
    )
    if check_files and facility.pools:
        facility.worker_trust()  # a certificate to pin to that holds none fails here
    return facility


def _metrics(table: object, path: Path) -> tuple[str, int] | None:
    """``[metrics] listen``: where the manager's own ``/metrics`` listener listens."""
    from datavine.dashboard.metrics_listener import parse_listen

    listen = _read_table(table or {}, METRICS_KEYS, path, "metrics").get("listen")
    if listen is None:
        return None
    try:
        return parse_listen(str(listen), "listen")
    except ConfigError as exc:
        raise FacilityError(path, "metrics.listen", str(exc)) from None


def _policy(cls: Callable[..., T], table: object, schema: Mapping[str, Kind], path: Path,
            section: str) -> T | None:
    """A policy section: ``cls(**values)``, or ``None`` when it says ``enabled = false``."""
    values = _read_table(table, schema, path, section)
    if not values.pop("enabled", True):
        return None
    return _build(cls, values, path, section)


def _manager(values: dict[str, object], path: Path, check_files: bool) -> ManagerConfig:
    values.setdefault("run_dir", Path("runs/manager"))
    manager = _build(ManagerConfig, values, path, "manager")
    if check_files:
        for key in ("password_file", "ssl_key", "ssl_cert"):
            file = _get(values, key, Path)
            if file is not None and not file.is_file():
                raise FacilityError(path, f"manager.{key}", f"{file} does not exist")
    return manager


def _trust(manager: ManagerConfig, ssl_ca: Path | None, fingerprint: str | None, path: Path,
           check_files: bool) -> str | None:
    """``[manager] ssl_ca`` and ``ssl_fingerprint`` checked: TLS on the manager for either,
    the fingerprint's form (returned in one form), the CA file (with ``check_files``)."""
    for key, given in (("ssl_ca", ssl_ca), ("ssl_fingerprint", fingerprint)):
        if given is not None and manager.ssl is None:
            raise FacilityError(path, f"manager.{key}", "the workers check the manager's "
                                "certificate only with TLS on: give ssl_key and ssl_cert")
    try:
        if fingerprint is not None:
            fingerprint = check_fingerprint(fingerprint)
    except ConfigError as exc:
        raise FacilityError(path, "manager.ssl_fingerprint", str(exc)) from exc
    try:
        if ssl_ca is not None and check_files:
            check_ca_file(ssl_ca)
    except ConfigError as exc:
        raise FacilityError(path, "manager.ssl_ca", str(exc)) from exc
    return fingerprint


def _xcache(table: object, path: Path, check_files: bool) -> tuple[ShardMap | None, Path | None]:
    if table is None:
        return None, None
    values = _read_table(table, XCACHE_KEYS, path, "xcache")
    entries = values.get("shards")
    if not isinstance(entries, list) or not entries:
        raise FacilityError(path, "xcache.shards", "expected at least one [[xcache.shards]] "
                            "table with a url")
    shards = []
    for i, entry in enumerate(entries):
        where = f"xcache.shards[{i}]"
        shard = _read_table(entry, SHARD_KEYS, path, where)
        url = _get(shard, "url", str)
        if url is None:
            raise FacilityError(path, f"{where}.url", "missing: every shard needs its URL")
        if not url.startswith(("root://", "roots://", "http://", "https://")):
            raise FacilityError(path, f"{where}.url", f"expected a root:// or http(s):// URL, "
                                f"got {url!r}")
        shards.append(_build(Shard, shard, path, where))
    export_root = _get(values, "export_root", Path)
    if check_files and export_root is not None and not export_root.is_dir():
        raise FacilityError(path, "xcache.export_root", f"{export_root} is not a folder")
    shardmap = _build(ShardMap, {"shards": shards, "origin": values.get("origin")}, path,
                      "xcache")
    return shardmap, export_root


def _racks(table: object, path: Path) -> RackMap | None:
    """``[racks]``: each rack's hosts, as names, addresses, globs or networks."""
    if table is None:
        return None
    if not isinstance(table, dict):
        raise FacilityError(path, "racks", f"expected a table of racks, got {table!r}")
    patterns: dict[str, tuple[str, ...]] = {}
    for rack, value in table.items():
        patterns[rack] = _str_list(value, _Where(path, f"racks.{rack}"))
        _build(RackMap.of, {"mapping": {rack: patterns[rack]}}, path, f"racks.{rack}")
    return _build(RackMap.of, {"mapping": patterns}, path, "racks")


def _racked(shards: ShardMap | None, racks: RackMap | None, path: Path) -> ShardMap | None:
    """The shards, those without a rack given the rack ``racks`` maps their host to."""
    if shards is None or racks is None or all(s.rack is not None for s in shards.shards):
        return shards
    placed = [s if s.rack is not None else
              Shard(s.url, racks.rack_for(url_host(s.url)), s.name, s.weight)
              for s in shards.shards]
    origin = shards.origin.url if shards.origin is not None else None
    return _build(ShardMap, {"shards": placed, "origin": origin}, path, "xcache")


def _pools(entries: object, path: Path) -> tuple[PoolSettings, ...]:
    if not isinstance(entries, list):
        raise FacilityError(path, "pools", "expected [[pools]] tables")
    pools = []
    for i, entry in enumerate(entries):
        where = f"pools[{i}]"
        values = _read_table(entry, POOL_KEYS, path, where)
        if "name" not in values:
            raise FacilityError(path, f"{where}.name", "missing: every pool needs a name")
        pools.append(_build(PoolSettings, values, path, f"{where} ({values['name']})"))
    names = [p.name for p in pools]
    if len(set(names)) != len(names):
        raise FacilityError(path, "pools", f"pool names must be unique, got {names}")
    return tuple(pools)


def _local_workers(table: object, path: Path) -> LocalWorkersConfig | None:
    if table is None:
        return None
    values = _read_table(table, LOCAL_WORKERS_KEYS, path, "local_workers")
    return _build(LocalWorkersConfig, values, path, "local_workers")


WARM_JOINED_S = 30.0  # how long a run waits for the libraries of workers that joined


class FacilityCluster(Cluster):
    """A manager whose workers come from the facility's pools (started and stopped here)."""

    def __init__(self, facility: Facility, run: RunConfig | None = None, *,
                 pool_dir: Path | None = None, warm_up: bool = True) -> None:
        super().__init__(facility.manager, run or facility.run,
                         min_workers=facility.prestarted_workers,
                         connect_timeout_s=facility.workers_timeout_s)
        self.facility = facility
        if self.metrics_config is None and facility.metrics_listen is not None:
            from datavine.dashboard.metrics_listener import MetricsConfig, metrics_config

            self.metrics_config = metrics_config(MetricsConfig(*facility.metrics_listen))
        self.pool_dir = pool_dir  # None: the default (the one bound into the condor chroot)
        self.pools: list[FactoryPool] = []
        self.warm_up = warm_up
        self.warm_report: WarmReport | None = None

    def _start_workers(self) -> None:
        """One pool per ``[[pools]]``; with TLS, their workers check the manager's
        certificate (:meth:`Facility.worker_trust`)."""
        trust = self.facility.worker_trust() if self.facility.pools else None
        for settings in self.facility.pools:
            cfg = settings.factory_config(self.facility.manager_host, self.port,
                                          self.password_file,
                                          ssl=self.manager_config.ssl is not None,
                                          catalog=self.facility.catalog,
                                          transfer_address=self._rt.listen_address,
                                          trust=trust)
            pool = pool_class(settings.batch)(cfg, name=settings.name, pool_dir=self.pool_dir)
            pool.start()
            self.pools.append(pool)  # only once started: stop() must not touch another's

    def start(self) -> FacilityCluster:
        """Start the manager and the pools, wait for their pre-started workers, and start
        the library on each named one (``warm_up``) so that the run does not pay for it."""
        super().start()
        if self.warm_up and self.pools:
            self.warm_report = warm_pools(self._rt, self.pools, self.facility.workers_timeout_s)
        return self

    def get(self, dsk: Any, keys: Any, **kwargs: Any) -> Any:
        """The dask scheduler callable; workers that joined the pools since the last look
        (more connected than warm) get their library started first."""
        report = self.warm_report
        if report is not None and self._rt.connected_workers() > len(report.warm):
            self.warm_report = warm_pools(self._rt, self.pools, WARM_JOINED_S)
        return super().get(dsk, keys, **kwargs)

    def close(self) -> None:
        for pool in reversed(self.pools):
            pool.stop()
        self.pools.clear()
        super().close()
