"""``CondorPool``: workers as HTCondor jobs, submitted by ``vine_factory -T condor``.

The factory runs where ``condor_submit`` is: in the personal HTCondor pool's chroot
(``workers/condor``, started by ``start_pool.sh``), as the pool's non-root user (HTCondor
refuses root), through ``workers/condor/condor_exec.sh``. The pool's scratch folder is under
the pools folder, which the scripts bind into the chroot at the same path, so the host
reads the factory's logs where the factory writes them. The manager's password is copied
there for the pool user (mode 0600); HTCondor passes the factory's environment on to the
jobs (``getenv = true``), so PATH and PYTHONPATH are set on the factory.

Every job carries ``DatavinePool = "<name>"``: ``condor_q``/``condor_rm`` find the pool's
jobs by it, and :meth:`CondorPool.stop` removes any the factory left behind.

Another HTCondor pool served by the same chroot (a box's, :mod:`datavine.deploy.box.condor`)
is named by ``DATAVINE_CONDOR_CONFIG``, its ``CONDOR_CONFIG`` inside the chroot: every
HTCondor command of the pool, the factory's included, then uses it, and the pool records it
in its scratch folder, so ``status``/``stop`` find the same pool later. Where the pool's
slots advertise ``DatavineRack``, a pool with a rack requires it
(``requirements = DatavineRack == "A"``): its workers land on that rack's hosts.
"""

from __future__ import annotations

import os
import pwd
import subprocess
import time
from collections import Counter
from dataclasses import replace
from pathlib import Path

from datavine.deploy.pools.base import PoolError
from datavine.deploy.pools.factory import FactoryConfig
from datavine.deploy.pools.factory_pool import FactoryPool
from datavine.deploy.pools.identity import condor_name
from datavine.deploy.pools.state import PROJECT_ROOT
from datavine.safe_paths import write_secret

POOL_ATTR = "DatavinePool"
RACK_ATTR = "DatavineRack"  # advertised by a box's startds (workers/condor/box_config.local)
CONFIG_ENV = "DATAVINE_CONDOR_CONFIG"
CONFIG_RECORD = "condor_config.path"  # in a pool's scratch folder: the pool's CONDOR_CONFIG
JOB_STATES = {1: "idle", 2: "running", 3: "removed", 4: "completed", 5: "held",
              6: "transferring", 7: "suspended"}


def scripts_dir() -> Path:
    """The personal pool's scripts (``DATAVINE_CONDOR_SCRIPTS`` overrides)."""
    env = os.environ.get("DATAVINE_CONDOR_SCRIPTS")
    return Path(env) if env else PROJECT_ROOT / "workers" / "condor"


def pool_user() -> str:
    return os.environ.get("DATAVINE_POOL_USER", "vinepool")


def condor_config() -> Path | None:
    """The ``CONDOR_CONFIG`` (a path inside the chroot) that ``DATAVINE_CONDOR_CONFIG`` names
    (a box's pool), or None: the personal pool's own configuration."""
    env = os.environ.get(CONFIG_ENV)
    return Path(env) if env else None


def condor_exec(*args: str, timeout_s: float = 30.0,
                config: Path | None = None) -> subprocess.CompletedProcess[str]:
    """Run an HTCondor command as the pool user in the chroot (``condor_exec.sh``), with
    ``config`` as its ``CONDOR_CONFIG`` (default: :func:`condor_config`)."""
    config = config if config is not None else condor_config()
    pre = [f"CONDOR_CONFIG={config}"] if config is not None else []
    try:
        return subprocess.run([str(scripts_dir() / "condor_exec.sh"), *pre, *args], text=True,
                              capture_output=True, timeout=timeout_s, check=False)
    except subprocess.TimeoutExpired as exc:
        raise PoolError(f"{' '.join(args)} did not answer within {timeout_s:.0f} s") from exc


def rack_requirement(rack: str) -> str:
    """The ClassAd expression a job of ``rack``'s pool requires of its slot."""
    return f'{RACK_ATTR} == "{rack}"'


def with_requirement(lines: tuple[str, ...], expr: str) -> tuple[str, ...]:
    """Submit-file ``lines`` that also require ``expr``: and-ed into a ``requirements``
    line already there (the last one, which HTCondor uses), else a line of its own."""
    out = list(lines)
    for i in range(len(out) - 1, -1, -1):
        key, sep, value = out[i].partition("=")
        if sep and key.strip().lower() == "requirements":
            out[i] = f"requirements = ({value.strip()}) && ({expr})"
            return tuple(out)
    return (*out, f"requirements = ({expr})")


def pool_racks(config: Path | None = None) -> set[str]:
    """The racks the pool's slots advertise (``DatavineRack``); empty for a pool without."""
    result = condor_exec("condor_status", "-af", RACK_ATTR, timeout_s=15, config=config)
    if result.returncode != 0:
        raise PoolError(f"condor_status failed: {result.stderr.strip()[-300:]}")
    return {r for r in result.stdout.split() if r != "undefined"}


def pool_missing(config: Path | None = None) -> str | None:
    """Why the personal HTCondor pool (or the one ``config`` names) cannot take jobs here,
    or None."""
    if os.geteuid() != 0:
        return "the personal HTCondor pool runs in a chroot: run as root"
    script = scripts_dir() / "condor_exec.sh"
    if not script.exists():
        return f"{script} not found (set DATAVINE_CONDOR_SCRIPTS)"
    try:
        pwd.getpwnam(pool_user())
    except KeyError:
        return f"user {pool_user()} missing: run workers/condor/install_pool.sh"
    result = condor_exec("condor_status", "-af", "Name", timeout_s=15, config=config)
    if result.returncode != 0 or not result.stdout.strip():
        config = config if config is not None else condor_config()
        if config is not None:
            return (f"the HTCondor pool of {config} is not running (no slot in "
                    f"condor_status) ({result.stderr.strip()[-200:]})")
        return ("the personal HTCondor pool is not running (no slot in condor_status): "
                f"bash workers/condor/start_pool.sh ({result.stderr.strip()[-200:]})")
    return None


class CondorPool(FactoryPool):
    """Workers as HTCondor jobs of the personal pool, submitted by vine_factory."""

    batch = "condor"

    @property
    def constraint(self) -> str:
        return f'{POOL_ATTR} == "{self.name}"'

    @property
    def condor_config(self) -> Path | None:
        """The pool's ``CONDOR_CONFIG``: as recorded at start, else :func:`condor_config`."""
        try:
            return Path((self.scratch_dir / CONFIG_RECORD).read_text().strip())
        except FileNotFoundError:
            return condor_config()

    def _prepare(self, scratch: Path) -> FactoryConfig:
        config = condor_config()
        (scratch / CONFIG_RECORD).unlink(missing_ok=True)
        why = pool_missing(config)
        if why:
            raise PoolError(f"cannot start pool {self.name!r}: {why}")
        if not scratch.resolve().is_relative_to(self.pool_dir.resolve()):
            raise PoolError(f"scratch folder {scratch} must be under {self.pool_dir}: only "
                            "that folder is bound into the HTCondor chroot")
        user = pwd.getpwnam(pool_user())
        scratch.mkdir(parents=True, exist_ok=True)
        for folder in (scratch.parent, scratch):
            os.chown(folder, user.pw_uid, user.pw_gid)
        if config is not None:
            (scratch / CONFIG_RECORD).write_text(f"{config}\n")
        extra = (*self.config.extra_condor_submit, f'+{POOL_ATTR} = "{self.name}"')
        if self.config.rack:
            racks = pool_racks(config)
            if racks and self.config.rack not in racks:
                raise PoolError(f"cannot start pool {self.name!r}: no slot of the HTCondor "
                                f"pool is on rack {self.config.rack!r} (its racks: "
                                f"{', '.join(sorted(racks))})")
            if racks:
                extra = with_requirement(extra, rack_requirement(self.config.rack))
        cfg = replace(self.config, scratch_dir=scratch, extra_condor_submit=extra)
        if self.config.password_file is not None:
            staged = write_secret(scratch / "manager.password",
                                  Path(self.config.password_file).read_bytes(), replace=True)
            os.chown(staged, user.pw_uid, user.pw_gid)
            cfg = replace(cfg, password_file=staged)
        return cfg

    def _launch(self, cmd: list[str], env: dict[str, str]) -> tuple[list[str], dict[str, str]]:
        # condor_exec.sh starts from a clean environment; VAR=value arguments add to it.
        script_env = {k: v for k, v in os.environ.items()
                      if k == "PATH" or k.startswith("DATAVINE_")}
        config = self.condor_config
        if config is not None:  # the factory's condor_submit, condor_q, condor_rm
            env = {**env, "CONDOR_CONFIG": str(config)}
        return [str(scripts_dir() / "condor_exec.sh"),
                *(f"{k}={v}" for k, v in env.items()), *cmd], script_env

    def condor(self, *args: str, timeout_s: float = 30.0) -> subprocess.CompletedProcess[str]:
        """Run an HTCondor command (``condor_q``, ``condor_history``...) in the pool."""
        return condor_exec(*args, timeout_s=timeout_s, config=self.condor_config)

    def _jobs(self) -> dict[str, int]:
        result = self.condor("condor_q", "-allusers", "-constraint", self.constraint,
                             "-af", "JobStatus")
        if result.returncode != 0:
            raise PoolError(f"condor_q failed: {result.stderr.strip()[-300:]}")
        counts = Counter(JOB_STATES.get(int(s), s) for s in result.stdout.split())
        return dict(counts)

    def worker_names(self) -> list[str]:
        if not self.config.named:
            return []
        result = self.condor("condor_q", "-allusers", "-constraint",
                             f"{self.constraint} && JobStatus == 2", "-af", "ClusterId", "ProcId")
        if result.returncode != 0:
            raise PoolError(f"condor_q failed: {result.stderr.strip()[-300:]}")
        return sorted(condor_name(self.name, *line.split()) for line in
                      result.stdout.splitlines() if len(line.split()) == 2)

    def _remove_jobs(self, timeout_s: float, factory_seen: bool) -> None:
        # Jobs are found by the pool's name, whoever started the factory.
        try:
            jobs = self._jobs()
        except PoolError:
            if pool_missing(self.condor_config):
                return  # no running HTCondor, no jobs
            raise
        deadline = time.monotonic() + timeout_s
        forced = False
        while jobs:
            if time.monotonic() > deadline:
                raise PoolError(f"pool {self.name!r} still has jobs after {timeout_s:.0f} s: "
                                f"{jobs}; see condor_q -constraint '{self.constraint}'")
            if not forced and time.monotonic() > deadline - timeout_s / 2:
                self.condor("condor_rm", "-forcex", "-constraint", self.constraint)
                forced = True
            elif set(jobs) - {"removed"}:
                self.condor("condor_rm", "-constraint", self.constraint)
            time.sleep(0.5)
            jobs = self._jobs()
