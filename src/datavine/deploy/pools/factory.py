"""``vine_factory`` command lines and JSON configs, built from one dataclass (pure, no I/O).

A :class:`FactoryConfig` says what a pool of TaskVine workers looks like (how many, how big,
their labels, whom they serve); :func:`factory_command` and :func:`factory_json` turn it into
what ``vine_factory`` reads. The pools in :mod:`datavine.deploy.pools.condor` and
:mod:`datavine.deploy.pools.local` run the result; the fast tests assert on it.

Defaults that differ from vine_factory's own, on purpose:

- ``min_workers=0`` (vine_factory: 5): no worker is kept without work unless asked;
- ``catalog`` is a loopback address: the factory reports to its catalog every minute and
  hands the address to every worker, and the default is a public server at Notre Dame; a
  site with its own ``catalog_server`` names it (``host:port``, a facility file's
  ``[manager] catalog``);
- ``idle_timeout_s`` is always passed: vine_factory never removes an idle worker itself,
  workers leave through their own idle timeout, which is how a pool scales down.

Workers that check the manager's certificate (``ssl_ca``, ``ssl_fingerprint``,
:mod:`datavine.deploy.tls`) get ``--ssl-ca``/``--ssl-fingerprint`` through vine_factory's
``--extra-options``; the CA file travels with every job as a wrapper input (vine_factory
copies it into its scratch folder and ships it, as it does the password file), named in
the job's folder (:mod:`~datavine.deploy.pools.ca_file`; the worker makes it absolute).

A pool never passes an option its programs do not take (:func:`fit_to_programs`, with what
their ``--help`` lists, :mod:`datavine.deploy.vine_options`): on TaskVine as released the
transfer address is left out (the workers' transfer servers listen on every interface), and
a certificate check the pool asks for is an error naming the option, never dropped.
"""

from __future__ import annotations

import json
import re
from collections.abc import Mapping
from dataclasses import asdict, dataclass, fields, replace
from pathlib import Path
from typing import Any, Literal

from datavine.config import ConfigError, check_counts
from datavine.deploy.tls import check_fingerprint, trust_options
from datavine.deploy.vine_options import PATCHED_OPTIONS, TRANSFER_ADDRESS, unsupported
from datavine.scheduler.labels import rack_feature

Batch = Literal["condor", "local"]
BATCHES: tuple[str, ...] = ("condor", "local")
# Nothing listens there unless a local catalog_server is started on purpose.
NO_CATALOG = "127.0.0.1:9097"
# vine_factory puts features in double quotes inside a shell command line (condor.sh runs
# `eval "$@"`): keep them to characters that need no quoting.
_SAFE_WORD = re.compile(r"^[A-Za-z0-9_.:=+@%,/-]+$")


@dataclass(frozen=True)
class FactoryConfig:
    """One pool of TaskVine workers started by ``vine_factory``.

    Whom the workers serve:
        manager_host, manager_port: the TaskVine manager (direct, no catalog lookup).
        password_file: the manager's password; workers without it are rejected.
        ssl: workers connect with TLS (without ``ssl_ca``/``ssl_fingerprint`` they do not
            check whom they reach).
        ssl_ca: a PEM file of CA certificates: the manager's certificate must verify
            against it and name ``manager_host`` (``--ssl-ca``; implies ``ssl``). The
            file is shipped with every job.
        ssl_fingerprint: the manager's certificate must have this SHA-256 fingerprint
            (``--ssl-fingerprint``; implies ``ssl``); kept as 64 lowercase hex digits.
        catalog: where the factory reports and workers look up managers (``host:port``);
            loopback by default so that nothing leaves the site.
        transfer_address: the only address the workers' transfer servers listen on
            (``--transfer-address``, datavine's TaskVine build); for workers on this host
            (``batch="local"``) of a manager on loopback. ``None``: every interface, as
            workers on other hosts need.

    How many:
        workers: most workers at once (``--max-workers``).
        min_workers: workers kept even without work (``--min-workers``); a pre-started
            pool sets it to ``workers``.
        idle_timeout_s: a worker without work for this long exits (``--timeout``).
        factory_period_s: how often the factory looks at the manager (``--factory-period``).
        workers_per_cycle: most new workers per period; ``None`` keeps vine_factory's 5.

    How big, and labels:
        cores, memory_mb, disk_mb: per worker; also the batch job's request.
        features: worker features (``--feature``); ``rack`` adds ``rack:<rack>``.
        named: each worker gets a unique name, the feature ``worker:<name>``
            (:mod:`datavine.deploy.pools.identity`), so that placement can send a bundle to the
            worker that read its file, as with local workers.

    Batch system:
        batch: ``"condor"`` (jobs through condor_submit) or ``"local"`` (processes here).
        extra_condor_submit: extra lines for the HTCondor submit file (``-B``), e.g.
            ``'+AccountingGroup = "group_cms"'`` or ``'requirements = (Machine == "a")'``.
        scratch_dir: the factory's folder (submit files, worker binary, logs).
        debug_workers: workers write a debug log, brought back to ``scratch_dir``.
    """

    manager_host: str
    manager_port: int
    batch: Batch = "condor"
    workers: int = 1
    min_workers: int = 0
    cores: int = 1
    memory_mb: int | None = None
    disk_mb: int | None = None
    features: tuple[str, ...] = ()
    rack: str | None = None
    password_file: Path | None = None
    ssl: bool = False
    ssl_ca: Path | None = None
    ssl_fingerprint: str | None = None
    idle_timeout_s: int = 300
    factory_period_s: int = 5
    workers_per_cycle: int | None = None
    catalog: str = NO_CATALOG
    transfer_address: str | None = None
    extra_condor_submit: tuple[str, ...] = ()
    scratch_dir: Path | None = None
    debug_workers: bool = False
    named: bool = True

    def __post_init__(self) -> None:
        if self.batch not in BATCHES:
            raise ConfigError(f"FactoryConfig.batch must be one of {BATCHES}, got {self.batch!r}")
        if not self.manager_host or any(c.isspace() for c in self.manager_host):
            raise ConfigError(f"FactoryConfig.manager_host is not a host: {self.manager_host!r}")
        if not 0 < self.manager_port < 65536:
            raise ConfigError(f"FactoryConfig.manager_port={self.manager_port} is not a TCP port")
        if not is_host_port(self.catalog):
            raise ConfigError(f"FactoryConfig.catalog must be host:port, got {self.catalog!r}")
        if self.transfer_address is not None and not _SAFE_WORD.match(self.transfer_address):
            raise ConfigError(f"FactoryConfig.transfer_address is not an address: "
                              f"{self.transfer_address!r}")
        check_counts("FactoryConfig", {"workers": self.workers, "cores": self.cores,
                                       "idle_timeout_s": self.idle_timeout_s,
                                       "factory_period_s": self.factory_period_s})
        check_counts("FactoryConfig", {"memory_mb": self.memory_mb, "disk_mb": self.disk_mb,
                                       "workers_per_cycle": self.workers_per_cycle},
                     optional=True)
        if not 0 <= self.min_workers <= self.workers:
            raise ConfigError(f"FactoryConfig.min_workers must be in 0..workers={self.workers}, "
                              f"got {self.min_workers}")
        for feature in self.all_features:
            if not _SAFE_WORD.match(feature):
                raise ConfigError(f"FactoryConfig feature {feature!r}: use letters, digits "
                                  "and _.:=+@%,/- only")
        for line in self.extra_condor_submit:
            if "\n" in line or "\\n" in line:
                raise ConfigError(f"FactoryConfig.extra_condor_submit: one line each: {line!r}")
        if self.extra_condor_submit and self.batch != "condor":
            raise ConfigError("FactoryConfig.extra_condor_submit needs batch='condor'")
        self._check_trust()

    def _check_trust(self) -> None:
        """``ssl_fingerprint`` in one form, a CA file's name the worker's command can carry,
        and ``ssl`` on when either is given (the factory's own queries use TLS too)."""
        if self.ssl_fingerprint is not None:
            object.__setattr__(self, "ssl_fingerprint", check_fingerprint(
                self.ssl_fingerprint, "FactoryConfig.ssl_fingerprint"))
        if self.ssl_ca is not None and not _SAFE_WORD.match(Path(self.ssl_ca).name):
            raise ConfigError(f"FactoryConfig.ssl_ca={str(self.ssl_ca)!r}: its name goes on "
                              "the workers' command line: use letters, digits and "
                              "_.:=+@%,- only")
        if self.ssl_ca is not None or self.ssl_fingerprint is not None:
            object.__setattr__(self, "ssl", True)

    @property
    def worker_options(self) -> str | None:
        """Options vine_factory adds to every worker's command line (``--extra-options``):
        the transfer address, the checks of the manager's certificate (the CA file by its
        name in the job's folder, where it is shipped)."""
        options = [] if self.transfer_address is None else [
            f"--transfer-address {self.transfer_address}"]
        ca_name = Path(self.ssl_ca).name if self.ssl_ca is not None else None
        options += trust_options(ca_name, self.ssl_fingerprint)
        return " ".join(options) or None

    @property
    def all_features(self) -> tuple[str, ...]:
        """``features`` plus the rack feature, in order, without repeats."""
        extra = (rack_feature(self.rack),) if self.rack else ()
        return tuple(dict.fromkeys((*self.features, *extra)))

    @property
    def manager(self) -> str:
        return f"{self.manager_host}:{self.manager_port}"


def is_host_port(text: str) -> bool:
    """Whether ``text`` is ``host:port`` (a name or IPv4 address, or ``[IPv6]``) (pure)."""
    host, sep, port = text.rpartition(":")
    if not sep or not port.isdigit() or not 0 < int(port) < 65536:
        return False
    if host.startswith("[") and host.endswith("]"):
        host = host[1:-1]
    return bool(host) and _SAFE_WORD.match(host) is not None


def fit_to_programs(cfg: FactoryConfig, worker_takes: frozenset[str],
                    factory_takes: frozenset[str]) -> tuple[FactoryConfig, list[str]]:
    """``cfg`` as the pool's ``vine_worker`` and ``vine_factory`` (which take the options
    ``worker_takes`` and ``factory_takes``) can run it, and what was left out, one line each
    (pure). The transfer address is left out when the workers lack its option; a check of
    the manager's certificate the workers or the factory cannot make raises ConfigError."""
    dropped = []
    if cfg.transfer_address is not None and TRANSFER_ADDRESS not in worker_takes:
        dropped.append(f"vine_worker takes no {TRANSFER_ADDRESS} (TaskVine patch "
                       f"{PATCHED_OPTIONS[TRANSFER_ADDRESS]}): the workers' transfer servers "
                       "listen on every interface")
        cfg = replace(cfg, transfer_address=None)
    trust = trust_options(str(cfg.ssl_ca) if cfg.ssl_ca is not None else None,
                          cfg.ssl_fingerprint)
    for program, takes in (("vine_worker", worker_takes), ("vine_factory", factory_takes)):
        missing = unsupported(trust, takes)
        if missing:
            patches = sorted({PATCHED_OPTIONS.get(m, "?") for m in missing})
            raise ConfigError(
                f"the pool's workers must check the manager's certificate (ssl_ca, "
                f"ssl_fingerprint), but this TaskVine's {program} takes no "
                f"{', '.join(missing)} (TaskVine patch {', '.join(patches)}: build it with "
                "scripts/build_taskvine.sh, see datavine doctor), or leave the checks out")
    return cfg, dropped


def factory_json(cfg: FactoryConfig) -> dict[str, int]:
    """The settings vine_factory re-reads from its ``-C`` file every period.

    Editing this file (``factory.json`` in a pool's scratch folder) rescales a running pool.
    """
    doc = {
        "max-workers": cfg.workers,
        "min-workers": cfg.min_workers,
        "timeout": cfg.idle_timeout_s,
        "cores": cfg.cores,
    }
    if cfg.memory_mb is not None:
        doc["memory"] = cfg.memory_mb
    if cfg.disk_mb is not None:
        doc["disk"] = cfg.disk_mb
    if cfg.workers_per_cycle is not None:
        doc["workers-per-cycle"] = cfg.workers_per_cycle
    return doc


def factory_config_text(cfg: FactoryConfig) -> str:
    return json.dumps(factory_json(cfg), indent=2, sort_keys=True) + "\n"


def factory_command(cfg: FactoryConfig, *, binary: str = "vine_factory",
                    config_file: Path | None = None, debug_file: Path | None = None,
                    parent_death: bool = False, wrapper: Path | None = None) -> list[str]:
    """The ``vine_factory`` command line for ``cfg`` (pure).

    ``config_file``: a JSON file with :func:`factory_json`'s content, re-read each period.
    ``debug_file``: the factory's debug log (batch and vine subsystems).
    ``parent_death``: the factory exits, removing its workers, when its parent dies.
    ``wrapper``: the script that names each worker (``cfg.named``); vine_factory copies it
    into its scratch folder and ships it with every job.
    ``cfg.ssl_ca``: shipped with every job too, and named there by its name alone.
    """
    cmd = [binary, "-T", cfg.batch, "--catalog", cfg.catalog,
           "--min-workers", str(cfg.min_workers), "--max-workers", str(cfg.workers),
           "--timeout", str(cfg.idle_timeout_s), "--factory-period", str(cfg.factory_period_s),
           "--cores", str(cfg.cores)]
    if cfg.workers_per_cycle is not None:
        cmd += ["--workers-per-cycle", str(cfg.workers_per_cycle)]
    if cfg.memory_mb is not None:
        cmd += ["--memory", str(cfg.memory_mb)]
    if cfg.disk_mb is not None:
        cmd += ["--disk", str(cfg.disk_mb)]
    for feature in cfg.all_features:
        cmd += ["--feature", feature]
    if cfg.password_file is not None:
        cmd += ["--password", str(cfg.password_file)]
    if cfg.ssl:
        cmd.append("--ssl")
    # the factory's own status connection checks the manager as its workers do (patch 0014)
    cmd += trust_options(str(cfg.ssl_ca) if cfg.ssl_ca is not None else None,
                         cfg.ssl_fingerprint)
    if cfg.scratch_dir is not None:
        cmd += ["--scratch-dir", str(cfg.scratch_dir)]
    if cfg.extra_condor_submit:
        # vine_factory expands the two characters backslash-n into a newline (-B).
        cmd += ["--batch-options", "\\n".join(cfg.extra_condor_submit)]
    if cfg.worker_options is not None:
        cmd += ["--extra-options", cfg.worker_options]
    if cfg.debug_workers:
        cmd.append("--debug-workers")
    if cfg.named and wrapper is not None:
        cmd += ["--wrapper", f"./{wrapper.name}", "--wrapper-input", str(wrapper)]
    if cfg.ssl_ca is not None:  # shipped with every job
        cmd += ["--wrapper-input", str(cfg.ssl_ca)]
    if config_file is not None:
        cmd += ["--config-file", str(config_file)]
    if debug_file is not None:
        cmd += ["--debug", "batch", "--debug", "vine", "--debug-file", str(debug_file)]
    if parent_death:
        cmd.append("--parent-death")
    return [*cmd, cfg.manager_host, str(cfg.manager_port)]


def config_to_dict(cfg: FactoryConfig) -> dict[str, object]:
    """A JSON-able dict of ``cfg`` (paths as strings, tuples as lists)."""
    out: dict[str, object] = asdict(cfg)
    for key, value in out.items():
        if isinstance(value, Path):
            out[key] = str(value)
        elif isinstance(value, tuple):
            out[key] = list(value)
    return out


def config_from_dict(doc: Mapping[str, Any]) -> FactoryConfig:
    """Inverse of :func:`config_to_dict` (``doc`` as JSON read it back: a pool's state
    file); unknown keys are an error naming them."""
    known = {f.name for f in fields(FactoryConfig)}
    unknown = set(doc) - known
    if unknown:
        raise ConfigError(f"unknown FactoryConfig keys: {sorted(unknown)}")
    values = dict(doc)
    for key in ("password_file", "scratch_dir", "ssl_ca"):
        if values.get(key) is not None:
            values[key] = Path(values[key])
    for key in ("features", "extra_condor_submit"):
        if key in values:
            values[key] = tuple(values[key])
    return FactoryConfig(**values)
