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
"""

from __future__ import annotations

import os
import pwd
import shutil
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

POOL_ATTR = "DatavinePool"
JOB_STATES = {1: "idle", 2: "running", 3: "removed", 4: "completed", 5: "held",
              6: "transferring", 7: "suspended"}


def scripts_dir() -> Path:
    """The personal pool's scripts (``DATAVINE_CONDOR_SCRIPTS`` overrides)."""
    env = os.environ.get("DATAVINE_CONDOR_SCRIPTS")
    return Path(env) if env else PROJECT_ROOT / "workers" / "condor"


def pool_user() -> str:
    return os.environ.get("DATAVINE_POOL_USER", "vinepool")


def condor_exec(*args: str, timeout_s: float = 30.0) -> subprocess.CompletedProcess[str]:
    """Run an HTCondor command as the pool user in the chroot (``condor_exec.sh``)."""
    try:
        return subprocess.run([str(scripts_dir() / "condor_exec.sh"), *args], text=True,
                              capture_output=True, timeout=timeout_s, check=False)
    except subprocess.TimeoutExpired as exc:
        raise PoolError(f"{' '.join(args)} did not answer within {timeout_s:.0f} s") from exc


def pool_missing() -> str | None:
    """Why the personal HTCondor pool cannot take jobs here, or None."""
    if os.geteuid() != 0:
        return "the personal HTCondor pool runs in a chroot: run as root"
    script = scripts_dir() / "condor_exec.sh"
    if not script.exists():
        return f"{script} not found (set DATAVINE_CONDOR_SCRIPTS)"
    try:
        pwd.getpwnam(pool_user())
    except KeyError:
        return f"user {pool_user()} missing: run workers/condor/install_pool.sh"
    result = condor_exec("condor_status", "-af", "Name", timeout_s=15)
    if result.returncode != 0 or not result.stdout.strip():
        return ("the personal HTCondor pool is not running (no slot in condor_status): "
                f"bash workers/condor/start_pool.sh ({result.stderr.strip()[-200:]})")
    return None


class CondorPool(FactoryPool):
    """Workers as HTCondor jobs of the personal pool, submitted by vine_factory."""

    batch = "condor"

    @property
    def constraint(self) -> str:
        return f'{POOL_ATTR} == "{self.name}"'

    def _prepare(self, scratch: Path) -> FactoryConfig:
        why = pool_missing()
        if why:
            raise PoolError(f"cannot start pool {self.name!r}: {why}")
        if not scratch.resolve().is_relative_to(self.pool_dir.resolve()):
            raise PoolError(f"scratch folder {scratch} must be under {self.pool_dir}: only "
                            "that folder is bound into the HTCondor chroot")
        user = pwd.getpwnam(pool_user())
        scratch.mkdir(parents=True, exist_ok=True)
        for folder in (scratch.parent, scratch):
            os.chown(folder, user.pw_uid, user.pw_gid)
        cfg = replace(self.config, scratch_dir=scratch,
                      extra_condor_submit=(*self.config.extra_condor_submit,
                                           f'+{POOL_ATTR} = "{self.name}"'))
        if self.config.password_file is not None:
            staged = scratch / "manager.password"
            staged.unlink(missing_ok=True)
            shutil.copyfile(self.config.password_file, staged)
            staged.chmod(0o600)
            os.chown(staged, user.pw_uid, user.pw_gid)
            cfg = replace(cfg, password_file=staged)
        return cfg

    def _launch(self, cmd: list[str], env: dict[str, str]) -> tuple[list[str], dict[str, str]]:
        # condor_exec.sh starts from a clean environment; VAR=value arguments add to it.
        script_env = {k: v for k, v in os.environ.items()
                      if k == "PATH" or k.startswith("DATAVINE_")}
        return [str(scripts_dir() / "condor_exec.sh"),
                *(f"{k}={v}" for k, v in env.items()), *cmd], script_env

    def condor(self, *args: str, timeout_s: float = 30.0) -> subprocess.CompletedProcess[str]:
        """Run an HTCondor command (``condor_q``, ``condor_history``...) in the pool."""
        return condor_exec(*args, timeout_s=timeout_s)

    def _jobs(self) -> dict[str, int]:
        result = condor_exec("condor_q", "-allusers", "-constraint", self.constraint,
                             "-af", "JobStatus")
        if result.returncode != 0:
            raise PoolError(f"condor_q failed: {result.stderr.strip()[-300:]}")
        counts = Counter(JOB_STATES.get(int(s), s) for s in result.stdout.split())
        return dict(counts)

    def worker_names(self) -> list[str]:
        if not self.config.named:
            return []
        result = condor_exec("condor_q", "-allusers", "-constraint",
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
            if pool_missing():
                return  # no running HTCondor, no jobs
            raise
        deadline = time.monotonic() + timeout_s
        forced = False
        while jobs:
            if time.monotonic() > deadline:
                raise PoolError(f"pool {self.name!r} still has jobs after {timeout_s:.0f} s: "
                                f"{jobs}; see condor_q -constraint '{self.constraint}'")
            if not forced and time.monotonic() > deadline - timeout_s / 2:
                condor_exec("condor_rm", "-forcex", "-constraint", self.constraint)
                forced = True
            elif set(jobs) - {"removed"}:
                condor_exec("condor_rm", "-constraint", self.constraint)
            time.sleep(0.5)
            jobs = self._jobs()
