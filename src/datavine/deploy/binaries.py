"""Where the TaskVine programs (vine_worker, vine_factory, vine_status) are installed.

The build puts them in the same prefix as the ``ndcctools`` Python package, so the prefix
is found from that package; ``DATAVINE_CCTOOLS`` overrides it, and ``PATH`` is the last resort.
"""

from __future__ import annotations

import os
import shutil
from pathlib import Path

from datavine.errors import DatavineError


def cctools_prefix() -> Path | None:
    env = os.environ.get("DATAVINE_CCTOOLS")
    if env:
        return Path(env)
    try:
        import ndcctools
    except ImportError:
        return None
    # <prefix>/lib/pythonX.Y/site-packages/ndcctools/__init__.py
    return Path(ndcctools.__file__).resolve().parents[4]


def vine_binary(name: str) -> Path:
    """Absolute path of a cctools program, with an error that says how to get it."""
    prefix = cctools_prefix()
    if prefix is not None and (prefix / "bin" / name).exists():
        return prefix / "bin" / name
    found = shutil.which(name)
    if found:
        return Path(found)
    raise DatavineError(
        f"{name} not found (looked in {prefix / 'bin' if prefix else 'no cctools prefix'} and "
        "PATH); build TaskVine with scripts/build_taskvine.sh or set DATAVINE_CCTOOLS")
