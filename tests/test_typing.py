"""``Any`` stays at the true edges (dask keys and values, a user's objects): the number of
annotations in src/datavine that mention ``Any`` may only go down.

An annotation counts when it names ``Any`` itself or a type alias whose definition does
(``JSON = dict[str, Any]``), so moving ``Any`` into an alias does not hide it. mypy itself
runs in CI from scripts/test.sh (``mypy`` with the configuration in pyproject.toml)."""

from __future__ import annotations

import ast
from collections import Counter
from collections.abc import Iterator
from pathlib import Path

import datavine

PACKAGE = Path(datavine.__file__).parent
TYPE_STATEMENT = getattr(ast, "TypeAlias", ())  # ``type X = ...``: Python 3.12 on
# the count after phase 2 of issue 23 (449 before phase 1, 314 after it); lower it as
# annotations get real types, never raise it
ANY_CEILING = 84


def mentions(node: ast.AST, names: set[str]) -> bool:
    """Whether an annotation names one of ``names`` (also inside string annotations)."""
    for sub in ast.walk(node):
        if isinstance(sub, ast.Name) and sub.id in names:
            return True
        if isinstance(sub, ast.Attribute) and sub.attr in names:
            return True
        if isinstance(sub, ast.Constant) and isinstance(sub.value, str):
            try:
                inner = ast.parse(sub.value, mode="eval")
            except SyntaxError:
                continue
            if mentions(inner, names):
                return True
    return False


def alias_definitions(tree: ast.Module) -> Iterator[tuple[str, ast.expr]]:
    """The module-level type aliases: ``X = dict[...]``, ``X: TypeAlias = ...``,
    ``type X = ...``."""
    for node in tree.body:
        if isinstance(node, TYPE_STATEMENT) and isinstance(node.name, ast.Name):
            yield node.name.id, node.value
        elif (isinstance(node, ast.AnnAssign) and isinstance(node.target, ast.Name)
              and node.value is not None and mentions(node.annotation, {"TypeAlias"})):
            yield node.target.id, node.value
        elif (isinstance(node, ast.Assign) and len(node.targets) == 1
              and isinstance(node.targets[0], ast.Name)
              and isinstance(node.value, ast.Subscript | ast.BinOp | ast.Name)):
            yield node.targets[0].id, node.value


def annotations(tree: ast.Module) -> Iterator[ast.expr]:
    """Every annotation in a module: parameters, returns and annotated assignments."""
    for node in ast.walk(tree):
        if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef):
            args = node.args
            for arg in (*args.posonlyargs, *args.args, *args.kwonlyargs, args.vararg,
                        args.kwarg):
                if arg is not None and arg.annotation is not None:
                    yield arg.annotation
            if node.returns is not None:
                yield node.returns
        elif isinstance(node, ast.AnnAssign) and not mentions(node.annotation, {"TypeAlias"}):
            yield node.annotation


def any_annotations(root: Path) -> Counter[str]:
    """Per module under ``root``, the annotations that mention ``Any``."""
    trees = {str(p.relative_to(root)): ast.parse(p.read_text())
             for p in sorted(root.rglob("*.py"))}
    anyish = {"Any"}
    while True:  # aliases of aliases
        grown = anyish | {name for tree in trees.values()
                          for name, value in alias_definitions(tree) if mentions(value, anyish)}
        if grown == anyish:
            break
        anyish = grown
    return Counter({name: n for name, tree in trees.items()
                    if (n := sum(mentions(a, anyish) for a in annotations(tree)))})


def test_the_count_sees_any_directly_in_strings_and_through_aliases(tmp_path: Path) -> None:
    (tmp_path / "a.py").write_text(
        "from typing import Any, TypeAlias\n"
        "JSON = dict[str, Any]\n"
        "Rows: TypeAlias = list[JSON]\n"
        "def f(x: Any, y: 'list[Any]', z: int) -> JSON: ...\n"
        "def g(rows: Rows, n: int) -> object:\n"
        "    total: typing.Any = 0\n"
        "    count: int = 0\n")
    (tmp_path / "b.py").write_text("def h(x: int) -> str: ...\n")
    assert any_annotations(tmp_path) == Counter({"a.py": 5})


def test_annotations_with_any_stay_under_the_ceiling() -> None:
    counts = any_annotations(PACKAGE)
    assert sum(counts.values()) <= ANY_CEILING, counts.most_common(15)


def test_run_config_replace_names_every_field_with_its_type() -> None:
    from dataclasses import fields

    from datavine.config import RunChanges, RunConfig

    changes = {name: getattr(hint, "__forward_arg__", hint)
               for name, hint in RunChanges.__annotations__.items()}
    assert {f.name: f.type for f in fields(RunConfig)} == changes
