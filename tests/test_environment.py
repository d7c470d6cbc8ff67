"""``environment``: packing (a fake environment, fast), the real packed tree running on its
own, and TaskVine workers running tasks and a library inside the shipped environment."""

from __future__ import annotations

import os
import re
import subprocess
import sys
import tarfile
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from datavine.manager.environment import (
    EnvSpec,
    PackedEnv,
    PackError,
    declare_environment,
    pack_environment,
    use_environment,
)

PYVER = f"python{sys.version_info.major}.{sys.version_info.minor}"
REPO = Path(__file__).resolve().parents[1]
REAL_CACHE = REPO / "build" / "test-envs"  # git-ignored; kept between runs, as a user's cache


def make_dist(site: Path, name: str, version: str, files: dict[str, str],
              requires: tuple[str, ...] = ()) -> None:
    for rel, text in files.items():
        (site / rel).parent.mkdir(parents=True, exist_ok=True)
        (site / rel).write_text(text)
    info = site / f"{name}-{version}.dist-info"
    info.mkdir(parents=True)
    (info / "METADATA").write_text(f"Metadata-Version: 2.1\nName: {name}\nVersion: {version}\n"
                                   + "".join(f"Requires-Dist: {r}\n" for r in requires))
    rows = [*files, f"{info.name}/METADATA", f"{info.name}/RECORD", f"../../bin/{name}"]
    (info / "RECORD").write_text("".join(f"{row},,\n" for row in rows))


@pytest.fixture
def fake_env(tmp_path: Path) -> EnvSpec:
    """A tiny interpreter prefix and venv: foo requires bar (and qux only as an extra)."""
    prefix = tmp_path / "prefix"
    stdlib = prefix / "lib" / PYVER
    for rel in ("os.py", "json/__init__.py", "test/test_os.py", "idlelib/x.py",
                "__pycache__/os.cpython-311.pyc", "__pycache__/os.cpython-311.opt-1.pyc",
                "site-packages/base_only.py", "config-3.11-x86_64-linux-gnu/libpython.a"):
        (stdlib / rel).parent.mkdir(parents=True, exist_ok=True)
        (stdlib / rel).write_text(rel)
    (prefix / "bin").mkdir()
    (prefix / "bin" / PYVER).write_text("interpreter")
    (prefix / "lib" / "libpython3.11.so.1.0").write_text("libpython")
    site = tmp_path / "venv" / "site-packages"
    make_dist(site, "foo", "1.0", {"foo/__init__.py": "", "foo/tests/test_foo.py": ""},
              ("bar>=1", "qux; extra == 'all'"))
    make_dist(site, "bar", "2.0", {"bar.py": ""})
    make_dist(site, "baz", "3.0", {"baz/__init__.py": ""})
    make_dist(site, "qux", "4.0", {"qux.py": ""})
    (tmp_path / "src" / "mypkg").mkdir(parents=True)
    (tmp_path / "src" / "mypkg" / "__init__.py").write_text("VALUE = 1\n")
    (site / "__editable__.mypkg-0.1.pth").write_text(f"{tmp_path / 'src'}\n")
    return EnvSpec(site_packages=site, prefix=prefix, compression="none")


def names(packed: PackedEnv) -> set[str]:
    with tarfile.open(packed.path) as tar:
        return set(tar.getnames())


def test_the_tree_holds_interpreter_stdlib_site_packages_and_inlined_sources(
        fake_env: EnvSpec, tmp_path: Path) -> None:
    packed = pack_environment(fake_env, tmp_path / "cache")
    got = names(packed)
    lib = f"lib/{PYVER}"
    assert {f"bin/{PYVER}", "bin/python", "bin/python3", "bin/run_in_env",
            "lib/libpython3.11.so.1.0", f"{lib}/os.py", f"{lib}/json/__init__.py",
            f"{lib}/__pycache__/os.cpython-311.pyc", f"{lib}/site-packages/foo/__init__.py",
            f"{lib}/site-packages/baz/__init__.py", f"{lib}/site-packages/mypkg/__init__.py",
            f"{lib}/site-packages/bar-2.0.dist-info/RECORD"} <= got
    for left_out in ("test/test_os.py", "idlelib/x.py", "__pycache__/os.cpython-311.opt-1.pyc",
                     "site-packages/base_only.py", "site-packages/__editable__.mypkg-0.1.pth"):
        assert f"{lib}/{left_out}" not in got
    assert not any("config-3.11" in n for n in got)
    assert packed.files == len(got) and packed.size == packed.path.stat().st_size
    assert PackedEnv.from_tarball(packed.path).sha256 == packed.sha256
    with tarfile.open(packed.path) as tar:
        script = tar.getmember("bin/run_in_env")
        assert script.mode & 0o111 and tar.getmember("bin/python").linkname == PYVER
        assert {m.uname for m in tar.getmembers()} == {""}


def test_a_second_pack_reuses_the_tarball(fake_env: EnvSpec, tmp_path: Path) -> None:
    first = pack_environment(fake_env, tmp_path / "cache")
    written = first.path.stat().st_mtime_ns
    time.sleep(0.01)
    again = pack_environment(fake_env, tmp_path / "cache")
    assert not first.reused and again.reused
    assert (again.path, again.sha256, again.size, again.key) == (
        first.path, first.sha256, first.size, first.key)
    with tarfile.open(again.path) as tar:
        assert tar.getnames()  # still a readable tarball
    assert again.path.stat().st_mtime_ns >= written  # touched for pruning, not rewritten
    assert again.sha256 == PackedEnv.from_tarball(again.path).sha256


def test_a_changed_environment_is_repacked(fake_env: EnvSpec, tmp_path: Path) -> None:
    assert fake_env.site_packages is not None
    first = pack_environment(fake_env, tmp_path / "cache")
    make_dist(fake_env.site_packages, "new", "1.0", {"new.py": ""})  # pip install new
    installed = pack_environment(fake_env, tmp_path / "cache")
    (tmp_path / "src" / "mypkg" / "__init__.py").write_text("VALUE = 2  # edited\n")
    edited = pack_environment(fake_env, tmp_path / "cache")
    keys = {first.key, installed.key, edited.key}
    assert len(keys) == 3 and not installed.reused and not edited.reused
    assert f"lib/{PYVER}/site-packages/new.py" in names(installed)
    assert pack_environment(fake_env, tmp_path / "cache", keep=1).reused
    assert sorted(p.name for p in (tmp_path / "cache").iterdir()) == sorted(
        [edited.path.name, edited.path.name + ".json"])  # keep=1 pruned the older ones


def test_a_slim_pack_follows_requirements_but_not_extras(fake_env: EnvSpec,
                                                         tmp_path: Path) -> None:
    from dataclasses import replace

    slim = pack_environment(replace(fake_env, include=("foo",)), tmp_path / "cache")
    site = f"lib/{PYVER}/site-packages"
    got = names(slim)
    assert {f"{site}/foo/__init__.py", f"{site}/bar.py", f"{site}/mypkg/__init__.py"} <= got
    assert f"{site}/baz/__init__.py" not in got and f"{site}/qux.py" not in got
    trimmed = pack_environment(replace(fake_env, include=("foo",), exclude=("bar",),
                                       exclude_paths=("*/tests/*",)), tmp_path / "cache")
    got = names(trimmed)
    assert f"{site}/foo/__init__.py" in got
    assert f"{site}/bar.py" not in got and f"{site}/foo/tests/test_foo.py" not in got


def test_wrong_specs_are_refused_naming_the_setting(fake_env: EnvSpec, tmp_path: Path) -> None:
    from dataclasses import replace

    with pytest.raises(PackError, match="not installed"):
        pack_environment(replace(fake_env, include=("nope",)), tmp_path / "cache")
    with pytest.raises(PackError, match=r"EnvSpec\.compression"):
        EnvSpec(compression="rar")


def test_gzip_tarballs_are_named_and_readable(fake_env: EnvSpec, tmp_path: Path) -> None:
    from dataclasses import replace

    packed = pack_environment(replace(fake_env, compression="gzip"), tmp_path / "cache")
    assert packed.path.name.endswith(".tar.gz") and "bin/run_in_env" in names(packed)


# --- the real environment --------------------------------------------------------------------
REAL_SPEC = EnvSpec(include=("datavine",), compression="zstd")  # datavine, numpy, dask, ...


@pytest.fixture(scope="module")
def real_packed() -> PackedEnv:
    return pack_environment(REAL_SPEC, REAL_CACHE)


def test_the_unpacked_tree_runs_without_this_python_installation(real_packed: PackedEnv,
                                                                  tmp_path: Path) -> None:
    tree = tmp_path / "tree"
    tree.mkdir()
    subprocess.run(["tar", "xf", str(real_packed.path), "-C", str(tree)], check=True)
    probe = ("import sys, numpy, datavine.worker.memcap; "
             "maps = [line.split()[-1] for line in open('/proc/self/maps') if 'libpython' in line];"
             "print(sys.prefix, numpy.__file__, maps[0])")
    command = [str(tree / "bin" / "run_in_env"), "python", "-c", probe]
    # Hide this interpreter's installation and the repository (a mount namespace): the
    # tree must not fall back on them. Root with CAP_SYS_ADMIN (CI, this machine) can.
    empty = tmp_path / "empty"
    empty.mkdir()
    hide = ["unshare", "-m", "sh", "-c", f"mount --bind {empty} {sys.base_prefix} && "
            f"mount --bind {empty} {REPO} && exec \"$0\" \"$@\""]
    tried = subprocess.run([*hide, "true"], capture_output=True, text=True)
    can_hide = tried.returncode == 0
    if not can_hide and may_mount():
        pytest.fail(f"unshare -m failed although this is root with CAP_SYS_ADMIN: {tried.stderr}")
    result = subprocess.run([*hide, *command] if can_hide else command, capture_output=True,
                            text=True, env={"PATH": "/usr/bin:/bin", "HOME": str(tmp_path)})
    assert result.returncode == 0, result.stderr
    prefix, numpy_file, libpython = result.stdout.split()
    real_tree = str(tree.resolve())
    assert prefix == real_tree
    assert numpy_file.startswith(real_tree) and libpython.startswith(real_tree)
    if not can_hide:  # checked with the installation in sight: say so
        pytest.skip("the tree ran and loaded its own files, but this interpreter's "
                    f"installation could not be hidden (unshare -m: {tried.stderr.strip()})")


def may_mount() -> bool:
    """Whether this process may make a mount namespace and bind mounts: root with
    CAP_SYS_ADMIN (bit 21) in its effective capabilities."""
    status = Path("/proc/self/status").read_text()
    caps = re.search(r"^CapEff:\s*([0-9a-fA-F]+)", status, re.MULTILINE)
    return os.geteuid() == 0 and caps is not None and bool(int(caps.group(1), 16) >> 21 & 1)


@pytest.fixture
def vine_run(tmp_path: Path) -> Iterator[tuple[Any, Any]]:
    """A manager and three 1-core local workers with features w0..w2; all stopped after."""
    import ndcctools.taskvine as vine
    import psutil

    from datavine.config import LocalWorkersConfig
    from datavine.deploy.local_workers import LocalWorkers

    manager = vine.Manager(port=0, run_info_path=str(tmp_path / "vine-run-info"))
    workers = LocalWorkers(LocalWorkersConfig(workers=0, idle_timeout_s=60), manager.port,
                           tmp_path, password_file=None)
    for i in range(3):
        workers.start(1, features=(f"w{i}",))
    try:
        yield manager, workers
    finally:
        descendants = [c for p in workers.procs if psutil.pid_exists(p.pid)
                       for c in psutil.Process(p.pid).children(recursive=True)]
        workers.stop()
        del manager
        for proc in descendants:  # libraries run in their own process groups
            if proc.is_running():
                proc.kill()


def wait_all(manager: Any, count: int, timeout_s: float = 120) -> list[Any]:
    done: list[Any] = []
    deadline = time.monotonic() + timeout_s
    while len(done) < count:
        assert time.monotonic() < deadline, f"only {len(done)} of {count} tasks came back"
        task = manager.wait(2)
        if task is not None:
            done.append(task)
    return done


def probe_library(extra_mb: float) -> dict[str, Any]:
    """Runs in the library: where it runs, and memcap inside a real library process."""
    import sys

    import numpy

    from datavine.worker.memcap import run_capped

    baseline = run_capped(int, cap_mb=None).baseline_mb
    cap = baseline + extra_mb
    hog = run_capped(lambda: numpy.ones(300 * 2**20 // 8).sum(), cap_mb=cap)
    fine = run_capped(lambda: int(numpy.arange(10).sum()), cap_mb=cap)
    return {"executable": sys.executable, "numpy": numpy.__file__, "hog": hog.exceeded,
            "fine": fine.value, "fine_ms": fine.wall_s * 1e3, "baseline_mb": baseline}


@pytest.mark.taskvine
def test_tasks_and_a_library_run_inside_the_shipped_environment(
        real_packed: PackedEnv, vine_run: tuple[Any, Any], tmp_path: Path) -> None:
    import cloudpickle
    import ndcctools.taskvine as vine

    manager, _ = vine_run
    env = declare_environment(manager, real_packed)

    def probe(worker: int) -> None:
        task = vine.Task("python -c 'import sys, numpy; print(sys.prefix, numpy.__file__)'")
        task.set_cores(1)
        task.add_feature(f"w{worker}")
        use_environment(task, env)
        manager.submit(task)

    # As the runtime does (DatavineLibrary._stage_environment): one worker holds the
    # tarball before the others ask, so they fetch it from that peer. Sent to all at once,
    # TaskVine counts the tarball as held before the first worker stored it, a peer fetch
    # fails and the manager sends a second copy (2x egress in some runs: benchmarks/README,
    # environment).
    probe(0)
    done = wait_all(manager, 1)
    probe(1)
    probe(2)
    for task in done + wait_all(manager, 2):
        assert task.successful(), (task.result, task.output)
        prefix, numpy_file = task.output.split()
        assert prefix.startswith(str(tmp_path)) and "/cache/" in prefix  # a worker's cache
        assert numpy_file.startswith(prefix)
    sent = manager.stats.bytes_sent
    assert sent <= 1.2 * real_packed.size, f"the manager sent {sent} B for 3 workers"

    cloudpickle.register_pickle_by_value(sys.modules[__name__])  # tests/ is not shipped
    try:
        library = manager.create_library_from_functions(
            "envlib", probe_library, add_env=False, exec_mode="direct")
    finally:
        cloudpickle.unregister_pickle_by_value(sys.modules[__name__])
    library.set_cores(1)
    library.set_env_var("OPENBLAS_NUM_THREADS", "1")
    use_environment(library, env)
    manager.install_library(library)
    call = vine.FunctionCall("envlib", "probe_library", 100)
    call.set_cores(1)
    call.add_feature("w0")
    manager.submit(call)
    (done,) = wait_all(manager, 1)
    assert done.successful(), (done.result, done.output)
    out = call.output
    assert "/cache/" in out["executable"] and out["numpy"].startswith(str(tmp_path))
    assert out["hog"] is True and out["fine"] == 45  # killed over its cap; the next call fine
    print(f"in the library: baseline {out['baseline_mb']:.0f} MB, a capped trivial call "
          f"{out['fine_ms']:.1f} ms")
