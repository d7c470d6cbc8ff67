"""The layout keeps its promises: the scheduler's decisions read no clock and start nothing,
one module drives TaskVine, the package's modules import one another in no circle, and a
worker's ``import`` of its code stays light."""

from __future__ import annotations

import ast
import subprocess
import sys
from collections.abc import Iterator
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


def test_only_the_taskvine_port_imports_taskvine() -> None:
    """The rule: ``ndcctools.taskvine`` is imported by manager/taskvine_port.py alone (function
    bodies included); in manager/ no other module imports ``ndcctools`` at all; elsewhere only
    deploy/binaries.py imports ``ndcctools`` itself, to find the TaskVine programs installed
    next to the Python package."""
    users = {str(p.relative_to(PACKAGE)): imports(p) for p in PACKAGE.rglob("*.py")}
    taskvine = sorted(name for name, found in users.items()
                      if any(under(m, ("ndcctools.taskvine",)) for m in found))
    cctools = sorted(name for name, found in users.items()
                     if any(under(m, ("ndcctools",)) for m in found))
    assert taskvine == ["manager/taskvine_port.py"]
    assert cctools == ["deploy/binaries.py", "manager/taskvine_port.py"]


# --- the import graph -------------------------------------------------------------------------
def module_names(root: Path) -> dict[str, Path]:
    """Every module of the package under ``root``, by its dotted name (a package by its own)."""
    names = {}
    for path in root.rglob("*.py"):
        parts = [root.name, *path.relative_to(root).with_suffix("").parts]
        if parts[-1] == "__init__":
            parts.pop()
        names[".".join(parts)] = path
    return names


def load_time_imports(tree: ast.Module) -> Iterator[ast.Import | ast.ImportFrom]:
    """The imports a module runs when it is imported, and those under ``if TYPE_CHECKING:``
    (a circle through them is one for the type checker and the reader): every block at module
    level and in class bodies, not function bodies (run later, when they are called)."""
    pending: list[ast.AST] = list(tree.body)
    while pending:
        node = pending.pop()
        if isinstance(node, ast.Import | ast.ImportFrom):
            yield node
        elif not isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef | ast.Lambda):
            pending.extend(ast.iter_child_nodes(node))


def imported_modules(name: str, path: Path, modules: dict[str, Path]) -> set[str]:
    """The package's modules that module ``name`` imports: ``import a.b``, ``from a import
    b`` (``a.b`` when it is a module, else ``a``) and relative imports. A submodule's import
    of its parent package's ``__init__``, which Python runs first, is no edge of its own."""
    found: set[str] = set()
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    for node in load_time_imports(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            found |= {alias.name for alias in node.names}
            continue
        base = node.module or ""
        if node.level:
            anchor = package.split(".")[:len(package.split(".")) - node.level + 1]
            base = ".".join([*anchor, *([node.module] if node.module else [])])
        for alias in node.names:
            found.add(f"{base}.{alias.name}" if f"{base}.{alias.name}" in modules else base)
    return {m for m in found if m in modules and m != name}


def import_graph(root: Path) -> dict[str, set[str]]:
    modules = module_names(root)
    return {name: imported_modules(name, path, modules) for name, path in modules.items()}


def find_cycle(graph: dict[str, set[str]]) -> list[str] | None:
    """One circle of ``graph`` as a path that ends where it starts, or None (pure)."""
    done: set[str] = set()
    for start in sorted(graph):
        if start in done:
            continue
        path, branches = [start], [iter(sorted(graph[start]))]
        while branches:
            step = next(branches[-1], None)
            if step is None:  # every way on from here explored: no circle through it
                done.add(path.pop())
                branches.pop()
            elif step in path:
                return [*path[path.index(step):], step]
            elif step not in done:
                path.append(step)
                branches.append(iter(sorted(graph.get(step, ()))))
    return None


def test_the_import_graph_is_read_as_python_runs_it(tmp_path: Path) -> None:
    root = tmp_path / "pkg"
    (root / "sub").mkdir(parents=True)
    (root / "__init__.py").write_text("from pkg.a import x\n")
    (root / "a.py").write_text("from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n"
                               "    from pkg.sub import b\nx = 1\n")
    (root / "sub" / "__init__.py").write_text("from .b import y\n")
    (root / "sub" / "b.py").write_text("from ..c import z\ny = 2\n"
                                       "def later():\n    import pkg.a\n")
    (root / "c.py").write_text("import pkg.sub.b\nfrom pkg import sub\nfrom pkg.sub import y\n"
                               "z = 3\n")
    graph = import_graph(root)
    assert graph == {"pkg": {"pkg.a"}, "pkg.a": {"pkg.sub.b"}, "pkg.sub": {"pkg.sub.b"},
                     "pkg.sub.b": {"pkg.c"}, "pkg.c": {"pkg.sub.b", "pkg.sub"}}
    assert find_cycle(graph) == ["pkg.sub.b", "pkg.c", "pkg.sub", "pkg.sub.b"]
    assert find_cycle({"a": {"b"}, "b": {"c"}, "c": set()}) is None


def test_the_package_imports_in_no_circle() -> None:
    """Module-level imports (``if TYPE_CHECKING:`` ones included; function bodies not) of
    every module of src/datavine form no circle."""
    cycle = find_cycle(import_graph(PACKAGE))
    assert cycle is None, "import circle: " + " -> ".join(cycle or [])


def test_a_worker_importing_its_code_loads_no_dask_taskvine_or_manager() -> None:
    code = ("import sys, datavine.worker.remote; "
            "print(' '.join(sorted(m for m in sys.modules)))")
    loaded = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                            check=True, timeout=60).stdout.split()
    assert "datavine.worker.remote" in loaded
    heavy = [m for m in loaded if under(m, ("dask", "ndcctools", "rich", "datavine.manager",
                                            "datavine.deploy", "datavine.apps"))]
    assert not heavy
