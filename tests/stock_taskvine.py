"""TaskVine as released (``scripts/build_taskvine.sh --stock``: build/cctools-stock) for the
tests: where it is, the environment that puts it first, and whether this session runs on it
(scripts/test.sh's stock lane)."""

from __future__ import annotations

import importlib.util
import os
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
STOCK_PREFIX = ROOT / "build" / "cctools-stock"
BUILD_IT = "build it with scripts/build_taskvine.sh --stock"


def stock_site() -> Path | None:
    """The stock build's Python packages, None when it is not built."""
    found = sorted(STOCK_PREFIX.glob("lib/python3*/site-packages"))
    return found[-1] if found and (STOCK_PREFIX / "bin" / "vine_worker").exists() else None


def stock_env() -> dict[str, str]:
    """This process's environment with the stock build first (its ``ndcctools`` and
    programs): how the stock lane runs."""
    site = stock_site()
    assert site is not None, f"no stock TaskVine in {STOCK_PREFIX}: {BUILD_IT}"
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(site), env.get("PYTHONPATH")]))
    env["DATAVINE_CCTOOLS"] = str(STOCK_PREFIX)
    return env


def on_stock() -> bool:
    """Whether the ``ndcctools`` this session imports is the stock build's."""
    spec = importlib.util.find_spec("ndcctools")
    origin = spec.origin if spec is not None else None
    return origin is not None and Path(origin).resolve().is_relative_to(STOCK_PREFIX)
