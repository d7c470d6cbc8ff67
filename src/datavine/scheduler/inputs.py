"""Input awareness: which files a task will read, found before it runs.

TaskVine only sees files declared as task inputs; files that uproot opens inside a task are
invisible to it. datavine looks into each task's arguments for what it will open: ROOT file
paths and ``root://``/``http(s)://`` URLs (plain strings, or objects carrying them such as
coffea's ``WorkItem``/``FileMeta`` (``filename``) and uproot's dask readers). The search is
shallow and bounded so that graphs of 100k trivial tasks stay cheap to scan.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from dask._task_spec import DataNode, GraphNode, Task, TaskRef

_URL_PREFIXES = ("root://", "roots://", "xroot://", "http://", "https://", "davs://")
_FILE_ATTRS = ("filename", "file_path", "path")
_MAX_DEPTH = 4
_MAX_ITEMS = 64


def looks_like_input(value: str) -> bool:
    """A string naming a ROOT file or a remote data URL."""
    if value.startswith(_URL_PREFIXES):
        return True
    base = value.split("?", 1)[0].split(":", 1)[0] if "://" not in value else value
    return base.endswith(".root")


def task_files(node: GraphNode) -> tuple[str, ...]:
    """Files the task will open, in argument order, without duplicates."""
    found: list[str] = []
    if isinstance(node, Task):
        _scan((node.func, node.args, node.kwargs), found, 0)
    elif isinstance(node, DataNode):
        _scan(node.value, found, 0)
    return tuple(dict.fromkeys(found))


def _scan(obj: Any, found: list[str], depth: int) -> None:
    if depth > _MAX_DEPTH or obj is None or isinstance(obj, (int, float, bool, bytes, TaskRef)):
        return
    if isinstance(obj, str):
        if looks_like_input(obj):
            found.append(obj)
        return
    if isinstance(obj, GraphNode):
        inner = (obj.func, obj.args, obj.kwargs) if isinstance(obj, Task) else getattr(
            obj, "value", None)
        _scan(inner, found, depth + 1)
        return
    if isinstance(obj, Mapping):
        for i, (k, v) in enumerate(obj.items()):
            if i >= _MAX_ITEMS:
                break
            _scan(k, found, depth + 1)
            _scan(v, found, depth + 1)
        return
    if isinstance(obj, (list, tuple, set, frozenset)):
        for i, item in enumerate(obj):
            if i >= _MAX_ITEMS:
                break
            _scan(item, found, depth + 1)
        return
    for attr in _FILE_ATTRS:
        value = getattr(obj, attr, None)
        if isinstance(value, str) and looks_like_input(value):
            found.append(value)
            return
    # uproot's dask readers keep their inputs in a list of (file, object-path) pairs
    for attr in ("files", "_files", "filenames"):
        value = getattr(obj, attr, None)
        if isinstance(value, (list, tuple)):
            _scan(value, found, depth + 1)
