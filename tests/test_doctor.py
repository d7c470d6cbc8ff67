"""``datavine doctor`` names every capability TaskVine as released lacks (build/cctools-stock)
and none on the project's build: the real command, a real manager and worker each time."""

from __future__ import annotations

import subprocess
import sys

import pytest

from datavine.manager.capabilities import CAPABILITIES
from tests.stock_taskvine import BUILD_IT, on_stock, stock_env, stock_site

pytestmark = pytest.mark.taskvine


def doctor(env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "datavine.apps.cli", "doctor"], env=env,
                          capture_output=True, text=True, timeout=120, check=False)


def missing_lines(out: str) -> list[str]:
    return [line for line in out.splitlines() if line.startswith("missing: ")]


def test_on_the_project_build_nothing_is_missing() -> None:
    if on_stock():
        pytest.skip("this session runs on TaskVine as released (the stock lane)")
    done = doctor()
    assert done.returncode == 0, done.stdout + done.stderr
    assert missing_lines(done.stdout) == []
    assert "build/cctools" in done.stdout and "nothing missing" in done.stdout


def test_on_the_stock_build_every_capability_is_named_once() -> None:
    if stock_site() is None:
        pytest.skip(f"no stock TaskVine: {BUILD_IT}")
    done = doctor(stock_env())
    assert done.returncode == 1, done.stdout + done.stderr
    lines = missing_lines(done.stdout)
    assert len(lines) == len(CAPABILITIES)
    for capability, line in zip(CAPABILITIES, lines, strict=True):
        assert f"lacks {capability.what} ({capability.patch})" in line
        assert capability.lost in line and "to get it: " in line
    assert "cctools-stock" in done.stdout and "series=none" in done.stdout
