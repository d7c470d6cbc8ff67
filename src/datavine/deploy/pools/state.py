"""Where pools live on disk: the pools folder and one small JSON state file per pool.

A pool started by ``datavine pool start`` outlives the command; later commands find it
through ``<pool dir>/<name>.json`` (the factory's pid, the manager, the batch system, the
pool's settings). The pools folder is ``$DATAVINE_POOL_DIR`` or ``<project>/build/pools``,
the folder the HTCondor scripts bind into their chroot, so that a factory's scratch folder
has the same path for the host and for HTCondor.
"""

from __future__ import annotations

import json
import os
import re
from dataclasses import asdict, dataclass
from pathlib import Path

from datavine.config import ConfigError

PROJECT_ROOT = Path(__file__).resolve().parents[4]
_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.-]{0,63}$")


def default_pool_dir() -> Path:
    env = os.environ.get("DATAVINE_POOL_DIR")
    return Path(env) if env else PROJECT_ROOT / "build" / "pools"


def check_name(name: str) -> str:
    """Pool names become file names and HTCondor attribute values: keep them plain."""
    if not _NAME.match(name):
        raise ConfigError(f"pool name {name!r}: letters, digits, '_', '.', '-' (max 64)")
    return name


@dataclass(frozen=True)
class PoolState:
    """What a later process needs to watch or stop a running pool."""

    name: str
    batch: str
    pid: int
    manager: str
    scratch_dir: str
    log: str
    started_at: float
    config: dict[str, object]  # datavine.deploy.pools.factory.config_to_dict


def state_path(pool_dir: Path, name: str) -> Path:
    return Path(pool_dir) / f"{check_name(name)}.json"


def write_state(pool_dir: Path, state: PoolState) -> Path:
    path = state_path(pool_dir, state.name)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(".json.tmp")
    tmp.write_text(json.dumps(asdict(state), indent=2) + "\n")
    tmp.replace(path)  # atomic: a reader never sees half a file
    return path


def read_state(pool_dir: Path, name: str) -> PoolState | None:
    path = state_path(pool_dir, name)
    if not path.exists():
        return None
    return PoolState(**json.loads(path.read_text()))


def list_states(pool_dir: Path) -> list[PoolState]:
    folder = Path(pool_dir)
    if not folder.is_dir():
        return []
    return [PoolState(**json.loads(p.read_text())) for p in sorted(folder.glob("*.json"))]


def remove_state(pool_dir: Path, name: str) -> None:
    state_path(pool_dir, name).unlink(missing_ok=True)
