"""Ship the Python environment to workers without conda: packed once, shared peer-to-peer.

:func:`pack_environment` copies the running interpreter (``bin/python3.X``, libpython, the
standard library minus tests, IDLE, tkinter) and the venv's site-packages (all, or a slim
``EnvSpec.include``) into a relocatable tree, tarred once per content key (interpreter, each
distribution's RECORD, the code ``.pth`` files point to, the spec). ``bin/run_in_env`` puts
the tree's ``bin`` on PATH and ``lib`` on LD_LIBRARY_PATH; Python finds its prefix from its
binary's place. Workers need a compatible OS (glibc, libssl...), not this Python install.
:func:`declare_environment` makes the tarball a cached file that workers pass to each other
and each unpacks locally (an untar mini-task: mini-task outputs are never shared between
peers, plain cached files are); :func:`use_environment` runs a Task or LibraryTask in it.
"""

from __future__ import annotations

import csv
import fnmatch
import hashlib
import io
import json
import os
import re
import shutil
import subprocess
import sys
import sysconfig
import tarfile
import time
from collections.abc import Iterator
from dataclasses import dataclass
from importlib import metadata
from pathlib import Path
from typing import TYPE_CHECKING

from datavine.errors import DatavineError

if TYPE_CHECKING:
    from datavine.manager.taskvine_types import VineFile, VineManager, VineTask

FORMAT = 1  # bump when the tree's layout changes: the key then changes too
LIBRARY_NEEDS = ("cloudpickle", "threadpoolctl")  # TaskVine's library code imports them
NO_OPT_PYC = frozenset({"__pycache__/*.opt-*"})  # .pyc of -O/-OO runs: never used by us
STDLIB_SKIP = NO_OPT_PYC | {"site-packages", "test", "tests", "idlelib", "tkinter",
                            "turtledemo", "ensurepip", "lib2to3", "config-*"}
SOURCE_SKIP = frozenset({"__pycache__", "*.egg-info", "*.dist-info"})
COMPRESSORS = {"gzip": (".tar.gz", ["gzip", "-6", "-n"]), "none": (".tar", None),
               "zstd": (".tar.zst", ["zstd", "-3", "-T0", "-q"])}
RUN_IN_ENV = """#!/bin/sh
# datavine's packed Python environment: run "$@" with this tree's Python first on PATH.
env_dir=$(cd "$(dirname "$0")/.." && pwd -P)
export PATH="$env_dir/bin:$PATH" DATAVINE_ENV="$env_dir" PYTHONNOUSERSITE=1 \
    LD_LIBRARY_PATH="$env_dir/lib${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
unset PYTHONHOME
exec "$@"
"""


class PackError(DatavineError):
    """The environment cannot be packed as asked; the message names the setting."""


@dataclass(frozen=True)
class EnvSpec:
    """What to pack. Attributes:
        include: distribution names for a slim pack (with everything they require, and
            ``LIBRARY_NEEDS``); empty packs every installed distribution.
        exclude: distribution names left out (and not followed as requirements).
        exclude_paths: glob patterns of paths in site-packages left out, e.g. ``*/tests/*``.
        compression: "gzip" (unpacks everywhere), "zstd" (faster; workers need zstd), "none".
        site_packages, prefix: the environment to pack; default: the running one.
    """

    include: tuple[str, ...] = ()
    exclude: tuple[str, ...] = ()
    exclude_paths: tuple[str, ...] = ()
    compression: str = "gzip"
    site_packages: Path | None = None
    prefix: Path | None = None

    def __post_init__(self) -> None:
        if self.compression not in COMPRESSORS:
            raise PackError(f"EnvSpec.compression={self.compression!r}: use one of "
                            f"{sorted(COMPRESSORS)}")


@dataclass(frozen=True)
class PackedEnv:
    """A tarball: sha256, size (bytes), content key, members, packing seconds, reused or not."""

    path: Path
    sha256: str
    size: int
    key: str = ""
    files: int = 0
    pack_s: float = 0.0
    reused: bool = False

    @classmethod
    def from_tarball(cls, path: Path | str) -> PackedEnv:
        """A tarball made elsewhere; it must unpack to a tree with ``bin/run_in_env``."""
        path = Path(path).resolve()
        return cls(path, _sha256(path), path.stat().st_size)


def pack_environment(spec: EnvSpec | None = None, cache_dir: Path | str | None = None, *,
                     keep: int = 3) -> PackedEnv:
    """Pack the environment once per content key; reuse the cached tarball otherwise.
    ``cache_dir`` defaults to ~/.cache/datavine/envs; it keeps the ``keep`` most recently
    used tarballs."""
    spec = spec or EnvSpec()
    env = _Env.of(spec)
    key = env.key(spec)
    suffix, command = COMPRESSORS[spec.compression]
    (cache := Path(cache_dir or Path.home() / ".cache/datavine/envs").resolve()).mkdir(
        parents=True, exist_ok=True)
    path = cache / f"env-{key}{suffix}"
    meta = path.with_name(path.name + ".json")
    if reused := path.exists() and meta.exists():
        os.utime(path)  # most recently used, for pruning
    else:
        started = time.perf_counter()
        members = sorted(env.members(spec))
        tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
        try:
            _write_tar(members, env.pyver, tmp, command)
            info = {"sha256": _sha256(tmp), "size": tmp.stat().st_size, "key": key,
                    "files": len(members) + 3, "pack_s": round(time.perf_counter() - started, 3)}
            os.replace(tmp, path)
        finally:
            tmp.unlink(missing_ok=True)
        meta.write_text(json.dumps(info))
    tarballs = [p for p in cache.glob("env-*") if not p.name.endswith(".json")]
    for old in sorted(tarballs, key=lambda p: -p.stat().st_mtime)[keep:]:
        old.unlink(missing_ok=True)
        old.with_name(old.name + ".json").unlink(missing_ok=True)
    return PackedEnv(path=path, reused=reused, **json.loads(meta.read_text()))


def declare_environment_files(manager: VineManager, packed: PackedEnv, *,
                              cache: str = "worker") -> tuple[VineFile, VineFile]:
    """Declare ``packed``; returns (the tarball's ``vine.File``, the unpacked tree's)."""
    tarball = manager.declare_file(str(packed.path), cache=cache, peer_transfer=True)
    return tarball, manager.declare_untar(tarball, cache=cache)


def declare_environment(manager: VineManager, packed: PackedEnv, *,
                        cache: str = "worker") -> VineFile:
    """Declare ``packed`` to a TaskVine manager; returns the unpacked tree's ``vine.File``.

    The manager sends the tarball to the first worker that needs it; later workers fetch it
    from a worker that has it, at most ``worker-source-max-transfers`` (a tune, default 10)
    at once from each, else from the manager: N workers starting together cost the manager
    about N / (that + 1) copies. ``cache="worker"``: kept for the worker's lifetime."""
    return declare_environment_files(manager, packed, cache=cache)[1]


def use_environment(task: VineTask, env_file: object) -> None:
    """Run ``task`` (a Task, a LibraryTask) inside the unpacked tree. Call it once the
    command is set: it becomes ``<mount>/bin/run_in_env <command>``, ``python`` the tree's."""
    task.add_execution_context(env_file)


@dataclass(frozen=True)
class _Env:
    """Where the environment to pack lives."""

    prefix: Path  # the base interpreter's installation
    pyver: str  # "python3.11"
    site: Path  # the (venv's) site-packages
    roots: tuple[Path, ...]  # directories that site-packages' .pth files add to sys.path
    path_files: frozenset[str]  # those .pth files: left out, their directories inlined

    @classmethod
    def of(cls, spec: EnvSpec) -> _Env:
        site = (spec.site_packages or Path(sysconfig.get_paths()["purelib"])).resolve()
        roots, path_files = [], set()
        for pth in sorted(site.glob("*.pth")):
            for line in pth.read_text().splitlines():
                root = (site / line.strip()).resolve()
                if line.strip() and not line.startswith(("#", "import")) and root.is_dir():
                    roots.append(root)
                    path_files.add(pth.name)
        return cls((spec.prefix or Path(sys.base_prefix)).resolve(),
                   f"python{sys.version_info.major}.{sys.version_info.minor}", site,
                   tuple(roots), frozenset(path_files))

    def key(self, spec: EnvSpec) -> str:
        """Content key: changes whenever what would be packed changes (cheap: no file data)."""
        binary = (self.prefix / "bin" / self.pyver).stat()
        h = hashlib.sha256(repr((FORMAT, sys.version, sysconfig.get_platform(), spec.include,
                                 spec.exclude, spec.exclude_paths, spec.compression, self.prefix,
                                 self.roots, binary.st_size, binary.st_mtime_ns)).encode())
        for entry in sorted(os.listdir(self.site)):
            h.update(entry.encode())
            record = self.site / entry / "RECORD"
            if entry.endswith(".pth") or record.exists():
                h.update((record if record.exists() else self.site / entry).read_bytes())
        for root in self.roots:
            for arc, path in _walk(root, "", SOURCE_SKIP):
                st = path.lstat()
                h.update(f"{arc} {st.st_size} {st.st_mtime_ns}".encode())
        return h.hexdigest()[:20]

    def members(self, spec: EnvSpec) -> Iterator[tuple[str, Path]]:
        """(name in the tree, source path) of every file or link to pack."""
        lib = f"lib/{self.pyver}"
        yield f"bin/{self.pyver}", self.prefix / "bin" / self.pyver
        for so in sorted((self.prefix / "lib").glob("libpython*.so*")):
            yield f"lib/{so.name}", so
        yield from _walk(self.prefix / lib, lib, STDLIB_SKIP)
        found = metadata.distributions(path=[str(self.site)])
        dists = {_norm(d.metadata["Name"]): d for d in found}
        wanted = _needed_files(dists, spec) if spec.include else None
        dropped = set().union(*(_record(dists[n]) for n in map(_norm, spec.exclude) if n in dists))
        for arc, path in _walk(self.site, "", NO_OPT_PYC):
            if ((wanted is None or arc in wanted) and arc not in dropped
                    and arc not in self.path_files
                    and not any(fnmatch.fnmatch(arc, p) for p in spec.exclude_paths)):
                yield f"{lib}/site-packages/{arc}", path
        for root in self.roots:  # editable installs and path entries: their code, inlined
            for arc, path in _walk(root, "", SOURCE_SKIP):
                yield f"{lib}/site-packages/{arc}", path


def _walk(top: Path, prefix: str, skip: frozenset[str]) -> Iterator[tuple[str, Path]]:
    """Files and links under ``top`` as (prefix/relative name, path), minus ``skip`` globs
    (matched against names, and against "dir/name" for files). Links are not followed."""
    for dirpath, dirnames, filenames in os.walk(top):
        rel = os.path.relpath(dirpath, top)
        base = f"{prefix}/{rel}" if rel != "." else prefix
        for name in list(dirnames):
            if any(fnmatch.fnmatch(name, pattern) for pattern in skip):
                dirnames.remove(name)
            elif os.path.islink(os.path.join(dirpath, name)):
                filenames.append(name)  # a link to a directory: packed as a link
        parent = os.path.basename(dirpath)
        for name in sorted(filenames):
            if not any(fnmatch.fnmatch(f"{parent}/{name}", p) for p in skip):
                yield f"{base}/{name}".lstrip("/"), Path(dirpath, name)


def _needed_files(dists: dict[str, metadata.Distribution], spec: EnvSpec) -> set[str]:
    """Files (relative to site-packages) of the distributions a slim pack needs."""
    if missing := [n for n in spec.include if _norm(n) not in dists]:
        raise PackError(f"EnvSpec.include names {missing}: not installed in this environment")
    todo = [_norm(n) for n in (*spec.include, *LIBRARY_NEEDS)]
    excluded = {_norm(n) for n in spec.exclude}
    files: set[str] = set()
    seen = set(excluded)
    while todo:
        name = todo.pop()
        if name in seen or name not in dists:
            continue  # a requirement that is not installed was not needed here
        seen.add(name)
        files |= _record(dists[name])
        for req in dists[name].requires or []:
            req_name, _, marker = req.partition(";")
            if "extra" not in marker:
                todo.append(_norm(re.split(r"[\s<>=!~\[(;]", req_name.strip(), maxsplit=1)[0]))
    return files


def _record(dist: metadata.Distribution) -> set[str]:
    """Files a distribution installed in site-packages (its RECORD, normalised)."""
    text = dist.read_text("RECORD") or ""
    names = {os.path.normpath(row[0]) for row in csv.reader(io.StringIO(text)) if row}
    return {n for n in names if not n.startswith("..")}


def _norm(name: str) -> str:
    return re.sub(r"[-_.]+", "-", name).lower()


def _write_tar(members: list[tuple[str, Path]], pyver: str, dest: Path,
               command: list[str] | None) -> None:
    """Tar ``members``, run_in_env and the links bin/python{,3} -> ``pyver`` into ``dest``,
    compressed by ``command`` (a filter from stdin to stdout) in a second process."""
    if command and not shutil.which(command[0]):
        raise PackError(f"{command[0]} not found: choose another EnvSpec.compression")
    with open(dest, "wb") as out:
        proc = subprocess.Popen(command, stdin=subprocess.PIPE, stdout=out) if command else None
        with tarfile.open(fileobj=proc.stdin if proc else out, mode="w|",
                          format=tarfile.PAX_FORMAT) as tar:
            for arc, path in members:
                tar.add(path, arcname=arc, recursive=False, filter=_anonymous)
            for name, link, data in (("python", pyver, b""), ("python3", pyver, b""),
                                     ("run_in_env", "", RUN_IN_ENV.encode())):
                info = tarfile.TarInfo(f"bin/{name}")
                info.type, info.linkname = (tarfile.SYMTYPE if link else tarfile.REGTYPE), link
                info.size, info.mode, info.mtime = len(data), 0o755, int(time.time())
                tar.addfile(info, io.BytesIO(data))
        if proc:
            proc.stdin.close()  # type: ignore[union-attr]
            if proc.wait():
                raise PackError(f"{' '.join(command or [])} failed with status {proc.returncode}")


def _anonymous(info: tarfile.TarInfo) -> tarfile.TarInfo:
    info.uid = info.gid = 0
    info.uname = info.gname = ""
    return info


def _sha256(path: Path) -> str:
    with open(path, "rb") as f:
        return hashlib.file_digest(f, "sha256").hexdigest()
