"""Client side of an executor call: make work items and code travel as they work locally.

Before a call's graph is built, :class:`~datavine.coffea.DatavineExecutor` asks this module:

- :func:`absolute_paths`: local relative paths in ``FileMeta``/``WorkItem`` filenames become
  absolute (workers run each call in a sandbox of their own, where a relative path names
  nothing). ``FileMeta`` objects are changed in place, because ``Runner`` matches the
  preprocessing output to its own ``FileMeta`` objects by filename.
- :func:`missing_local_files`: local files that do not exist here, to be reported at once
  instead of failing on every worker.
- :func:`ship_code`: the modules that the item function and coffea's pickled processor refer
  to, and that a fresh interpreter of this Python cannot import (a user's own file next to
  the script, a test module, a notebook's helpers): sent by value with cloudpickle's
  ``register_pickle_by_value``, and the processor pickled again so that it takes effect.
- :func:`with_datavine_reads`: coffea's uproot options get
  :class:`~datavine.coffea.source.DatavineSource` as ``handler`` (reads through the shards,
  accounted), unless the user chose a handler; and NanoEvents' buffers are kept in the
  worker's column cache (:mod:`datavine.coffea.buffers`), unless the ``Runner`` has a
  ``cachestrategy``.
- :func:`find_x509_proxy`: the X509 proxy to send with the items, found as coffea does.
"""

from __future__ import annotations

import dataclasses
import errno
import functools
import io
import os
import pickle
import subprocess
import sys
import tempfile
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import TypeGuard, TypeVar

import cloudpickle

from datavine.coffea.buffers import worker_buffers
from datavine.coffea.source import DatavineSource
from datavine.safe_paths import check_own_file

Item = TypeVar("Item")  # a coffea FileMeta or WorkItem
T = TypeVar("T")

_IMPORTABLE: dict[str, bool] = {}  # top-level module -> a fresh interpreter finds it
_CHECK_TIMEOUT_S = 60.0
_WORK_FUNCTION = "_work_function"
_METADATA_FETCHER = "metadata_fetcher_root"


def is_local(filename: str) -> bool:
    return "://" not in filename


def absolute_paths(items: Iterable[Item]) -> list[Item]:
    """``items`` with local relative filenames made absolute (``FileMeta`` in place)."""
    out = []
    for item in items:
        name = getattr(item, "filename", None)
        if isinstance(name, str) and is_local(name) and not os.path.isabs(name):
            absolute = os.path.abspath(os.path.expanduser(name))
            if dataclasses.is_dataclass(item) and not isinstance(item, type):
                item = dataclasses.replace(item, filename=absolute)
            else:
                setattr(item, "filename", absolute)  # noqa: B010 (any item with a filename)
        out.append(item)
    return out


def missing_local_files(items: Iterable[Item]) -> list[tuple[int, Item]]:
    """(index, item) of the items whose local file does not exist on this machine."""
    missing = []
    for i, item in enumerate(items):
        name = getattr(item, "filename", None)
        if isinstance(name, str) and is_local(name) and not os.path.exists(name):
            missing.append((i, item))
    return missing


# --- code ----------------------------------------------------------------------------------
class _ModuleRecorder(pickle.Unpickler):
    """Unpickles, noting the module of every global the pickle refers to."""

    def __init__(self, data: bytes) -> None:
        super().__init__(io.BytesIO(data))
        self.modules: set[str] = set()

    def find_class(self, module: str, name: str) -> object:
        self.modules.add(module)
        found = super().find_class(module, name)
        if module.startswith("cloudpickle") and name == "subimport":
            # a module object a by-value function uses: pickled as subimport("name")
            def subimport(module_name: str) -> object:
                self.modules.add(module_name)
                return found(module_name)

            return subimport
        return found


def referenced_modules(blob: bytes) -> tuple[object, set[str]]:
    """Unpickle ``blob``; returns the object and the modules its globals come from."""
    recorder = _ModuleRecorder(blob)
    value = recorder.load()
    return value, recorder.modules


def importable_elsewhere(names: Iterable[str]) -> dict[str, bool]:
    """Whether a fresh interpreter of this Python, started outside this directory (as a
    worker's library is), finds each top-level module. Answers are cached per process."""
    todo = sorted({n for n in names if n not in _IMPORTABLE})
    if todo:
        probe = ("import importlib.util, sys\n"
                 "for n in sys.argv[1:]:\n"
                 "    try:\n"
                 "        print(n, importlib.util.find_spec(n) is not None)\n"
                 "    except Exception:\n"
                 "        print(n, False)\n")
        env = {k: v for k, v in os.environ.items() if k != "PYTHONSTARTUP"}
        with tempfile.TemporaryDirectory(prefix="datavine-probe-") as cwd:
            done = subprocess.run([sys.executable, "-c", probe, *todo], cwd=cwd, env=env,
                                  capture_output=True, text=True, timeout=_CHECK_TIMEOUT_S,
                                  check=False)
        answers = dict(line.split() for line in done.stdout.splitlines() if " " in line)
        for name in todo:
            _IMPORTABLE[name] = answers.get(name) == "True"
    return {n: _IMPORTABLE[n] for n in names}


def needs_by_value(modules: Iterable[str]) -> list[str]:
    """Top-level packages among ``modules`` that workers cannot import."""
    tops = {m.split(".")[0] for m in modules} - set(sys.builtin_module_names)
    tops -= set(sys.stdlib_module_names) | {"__main__", "__mp_main__", "builtins"}
    tops = {t for t in tops if t in sys.modules}
    return sorted(t for t, ok in importable_elsewhere(tops).items() if not ok)


def register_by_value(names: Iterable[str]) -> list[str]:
    """Register each module (already imported here) with cloudpickle; returns the names."""
    done = []
    for name in names:
        module = sys.modules.get(name)
        if module is not None:
            cloudpickle.register_pickle_by_value(module)
            done.append(name)
    return done


def by_value_modules() -> set[str]:
    """Modules currently registered with cloudpickle to travel by value."""
    from cloudpickle import cloudpickle as impl

    return set(getattr(impl, "_PICKLE_BY_VALUE_MODULES", ()))


def ship_code(function: Callable[[Item], T]) -> tuple[Callable[[Item], T], list[str]]:
    """``function`` ready to travel: modules the workers lack are sent by value. Returns the
    function (with coffea's processor pickled again when that changed it) and the modules
    this call registered."""
    registered: list[str] = []
    try:
        _, modules = referenced_modules(cloudpickle.dumps(function))
    except Exception:  # cannot be inspected here: it travels as it is, and says why there
        return function, registered
    registered += register_by_value(needs_by_value(modules))
    if not _is_coffea(function, _WORK_FUNCTION):
        return function, registered
    assert isinstance(function, functools.partial)
    blob = function.keywords.get("processor_instance")
    if not isinstance(blob, bytes):
        return function, registered
    import lz4.frame

    try:
        processor, modules = referenced_modules(lz4.frame.decompress(blob))
    except Exception:
        return function, registered
    registered += register_by_value(needs_by_value(modules))
    if not {m.split(".")[0] for m in modules} & by_value_modules():
        return function, registered
    repickled = lz4.frame.compress(cloudpickle.dumps(processor), compression_level=1)
    return _rebind(function, processor_instance=repickled), registered


def with_datavine_reads(function: Callable[[Item], T]) -> Callable[[Item], T]:
    """coffea's work or metadata function with ``handler=DatavineSource`` in its uproot
    options (unless a handler is set there already) and, for the work function, the
    worker's column cache as NanoEvents' buffer cache (unless the ``Runner`` has a
    ``cachestrategy``: :mod:`datavine.coffea.buffers`); any other function as is."""
    if _is_coffea(function, _WORK_FUNCTION):
        assert isinstance(function, functools.partial)
        if function.args and function.args[0] != "root":
            return function  # parquet
        options = dict(function.keywords.get("uproot_options") or {})
        changes: dict[str, object] = {}
        if options.get("handler") is None:
            options["handler"] = DatavineSource
            changes["uproot_options"] = options
        if _no_cache_strategy(function.keywords.get("cache_function")):
            changes["cache_function"] = worker_buffers  # the worker's column cache
        return _rebind(function, **changes) if changes else function
    elif _is_coffea(function, _METADATA_FETCHER) and len(function.args) >= 3:
        assert isinstance(function, functools.partial)
        options = dict(function.args[2] or {})
        if options.get("handler") is None:
            options["handler"] = DatavineSource
            args = (*function.args[:2], options, *function.args[3:])
            return functools.partial(function.func, *args, **function.keywords)
    return function


def _no_cache_strategy(cache_function: object) -> bool:
    """Whether coffea's ``cache_function`` is its ``get_cache`` with no ``cachestrategy``."""
    return (isinstance(cache_function, functools.partial)
            and getattr(cache_function.func, "__name__", "") == "get_cache"
            and cache_function.args in ((None,), ()))


def _is_coffea(function: object, name: str) -> TypeGuard[functools.partial[object]]:
    """Whether ``function`` is coffea's function ``name`` with arguments bound."""
    return (isinstance(function, functools.partial)
            and getattr(function.func, "__name__", "") == name
            and getattr(function.func, "__module__", "").startswith("coffea."))


def _rebind(function: functools.partial[T], **keywords: object) -> functools.partial[T]:
    return functools.partial(function.func, *function.args, **{**function.keywords,
                                                                **keywords})


def register_module(module_name: str) -> None:
    """Have cloudpickle send ``module_name``'s classes and functions by value."""
    import importlib

    try:
        module = importlib.import_module(module_name)
    except ImportError as exc:
        raise ValueError(f"DatavineExecutor.pickle_by_value: cannot import {module_name!r}: "
                         f"{exc}") from exc
    cloudpickle.register_pickle_by_value(module)


def find_x509_proxy(setting: str | bool | None) -> Path | None:
    """The proxy to send: ``setting`` when a path, none when ``False``; for ``None`` as
    coffea's TaskVineExecutor looks: ``$X509_USER_PROXY``, then ``$TMPDIR/x509up_u<uid>``
    (in a shared folder: used only when it is a regular file of this user's, else
    :class:`~datavine.safe_paths.UnsafePathError` names its owner)."""
    if setting is False:
        return None
    if isinstance(setting, (str, os.PathLike)) and setting:
        path = Path(setting)
        if not path.is_file():
            raise FileNotFoundError(errno.ENOENT, "DatavineExecutor.x509_proxy: no such file",
                                    str(path))
        return path
    env = os.environ.get("X509_USER_PROXY")
    if env:
        return Path(env) if Path(env).is_file() else None
    default = Path(os.environ.get("TMPDIR", "/tmp")) / f"x509up_u{os.getuid()}"
    if not os.path.lexists(default):
        return None
    # in a shared folder: another user may have put a proxy (or a symlink) there first
    return check_own_file(default, "X509 proxy")
