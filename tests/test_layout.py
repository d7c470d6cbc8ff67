"""The layout keeps its promises: the scheduler's decisions read no clock and start nothing,
one module drives TaskVine, and a worker's ``import`` of its code stays light."""

from __future__ import annotations

import ast
import subprocess
import sys
from pathlib import Path

import datavine

PACKAGE = Path(datavine.__file__).parent
# what a pure decision module must not import: clocks, processes, sockets, TaskVine, the shell
SHELL = ("time", "subprocess", "socket", "threading", "signal", "ndcctools",
         "datavine.manager", "datavine.deploy", "datavine.apps", "datavine.coffea")


def imports(path: Path) -> set[str]:
    found: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            found |= {alias.name for alias in node.names}
        elif isinstance(node, ast.ImportFrom) and node.module and not node.level:
            found.add(node.module)
    return found


def under(module: str, prefixes: tuple[str, ...]) -> bool:
    return any(module == p or module.startswith(p + ".") for p in prefixes)


def test_scheduler_modules_import_no_clock_process_or_taskvine() -> None:
    modules = sorted((PACKAGE / "scheduler").glob("*.py"))
    assert any(p.name == "run_state.py" for p in modules)
    bad = {p.name: sorted(m for m in imports(p) if under(m, SHELL)) for p in modules}
    assert not {name: mods for name, mods in bad.items() if mods}


def test_only_the_runtime_imports_taskvine() -> None:
    users = sorted(str(p.relative_to(PACKAGE)) for p in PACKAGE.rglob("*.py")
                   if any(under(m, ("ndcctools.taskvine",)) for m in imports(p)))
    assert users == ["manager/runtime.py"]


def test_a_worker_importing_its_code_loads_no_dask_taskvine_or_manager() -> None:
    code = ("import sys, datavine.worker.remote; "
            "print(' '.join(sorted(m for m in sys.modules)))")
    loaded = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                            check=True, timeout=60).stdout.split()
    assert "datavine.worker.remote" in loaded
    heavy = [m for m in loaded if under(m, ("dask", "ndcctools", "rich", "datavine.manager",
                                            "datavine.deploy", "datavine.apps"))]
    assert not heavy
