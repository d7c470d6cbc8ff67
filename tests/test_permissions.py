"""Files and permissions (issue 28, item 4): each guard is tried with its attack.

Per-user folders in shared places (another user's folder, one open to all, a symlink in its
place), secrets written with their final mode from the start (umask 0, chmod unavailable, a
planted symlink), a user's password file open to others, the XCache testbed's mirror (an
input's mode never changes) and local workers' sizes. Unit level: no TaskVine runs."""

from __future__ import annotations

import contextlib
import os
import pwd
import stat
import tempfile
from collections.abc import Iterator
from pathlib import Path
from types import SimpleNamespace
from typing import cast

import pytest

from datavine.config import ConfigError, LocalWorkersConfig, ManagerConfig, RunConfig
from datavine.safe_paths import (
    UnsafePathError,
    check_private_file,
    private_dir,
    user_temp_dir,
    write_secret,
)

OTHER_UID = 65534  # nobody: a user other than the one running the tests (root)
ME = os.getuid()

needs_root = pytest.mark.skipif(os.geteuid() != 0, reason="os.chown to another user needs root")


def mode(path: Path) -> int:
    return stat.S_IMODE(os.lstat(path).st_mode)


@contextlib.contextmanager
def umask(value: int) -> Iterator[None]:
    old = os.umask(value)
    try:
        yield
    finally:
        os.umask(old)


@pytest.fixture
def no_chmod(monkeypatch: pytest.MonkeyPatch) -> None:
    """chmod of any kind fails: a secret's mode must come from its creation."""
    def refuse(*args: object, **kwargs: object) -> None:
        raise AssertionError(f"chmod called: {args}")

    for name in ("chmod", "fchmod", "lchmod"):
        if hasattr(os, name):
            monkeypatch.setattr(os, name, refuse)
    monkeypatch.setattr(Path, "chmod", refuse)


@pytest.fixture
def shared_tmp(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """A stand-in for /tmp (sticky, open to all) as the temp dir."""
    shared = tmp_path / "shared"
    shared.mkdir()
    shared.chmod(0o1777)
    monkeypatch.setattr(tempfile, "tempdir", str(shared))
    return shared


# --- per-user folders in shared places --------------------------------------------------------
def test_private_dir_is_made_0700_whatever_the_umask(tmp_path: Path) -> None:
    with umask(0):
        folder = private_dir(tmp_path / "mine")
    assert stat.S_ISDIR(os.lstat(folder).st_mode) and mode(folder) == 0o700
    assert private_dir(folder) == folder  # reused


@needs_root
def test_a_folder_another_user_made_first_is_refused_and_left_alone(shared_tmp: Path) -> None:
    planted = shared_tmp / f"datavine-{ME}"
    planted.mkdir(mode=0o700)
    os.chown(planted, OTHER_UID, OTHER_UID)
    with pytest.raises(UnsafePathError) as err:
        user_temp_dir("x509")
    message = str(err.value)
    assert str(planted) in message and f"uid {OTHER_UID}" in message and "0700" in message
    assert os.lstat(planted).st_uid == OTHER_UID and mode(planted) == 0o700
    assert not (planted / "x509").exists()


def test_a_folder_open_to_others_is_refused_not_chmodded(shared_tmp: Path) -> None:
    planted = shared_tmp / f"datavine-{ME}"
    planted.mkdir()
    planted.chmod(0o777)
    with pytest.raises(UnsafePathError, match=r"open to group or others.*0777"):
        user_temp_dir("files-1")
    assert mode(planted) == 0o777


def test_a_symlink_in_place_of_the_folder_is_refused(shared_tmp: Path, tmp_path: Path) -> None:
    elsewhere = tmp_path / "attacker"
    elsewhere.mkdir(mode=0o700)
    (shared_tmp / f"datavine-{ME}").symlink_to(elsewhere)
    with pytest.raises(UnsafePathError, match="not a directory"):
        user_temp_dir("x509")
    assert list(elsewhere.iterdir()) == []
    inner = tmp_path / "own"
    inner.mkdir(mode=0o700)
    (inner / "x509").symlink_to(elsewhere)  # one level down too
    with pytest.raises(UnsafePathError, match="not a directory"):
        private_dir(inner / "x509")


@needs_root
def test_a_coffea_item_refuses_a_planted_folder_for_its_proxy(shared_tmp: Path) -> None:
    from datavine.coffea.tasks import ItemPolicy, item_files

    planted = shared_tmp / f"datavine-{ME}"
    planted.mkdir(mode=0o755)
    os.chown(planted, OTHER_UID, OTHER_UID)
    with pytest.raises(UnsafePathError, match=str(planted)), \
            item_files(ItemPolicy(x509_proxy=b"secret proxy")):
        pass
    assert list(planted.iterdir()) == []


def test_a_coffea_item_writes_its_proxy_0600_in_its_own_folder(shared_tmp: Path) -> None:
    from datavine.coffea.tasks import ItemPolicy, item_files

    with umask(0), item_files(ItemPolicy(x509_proxy=b"secret proxy")):
        proxy = Path(os.environ["X509_USER_PROXY"])
        assert proxy.read_bytes() == b"secret proxy" and mode(proxy) == 0o600
    assert proxy.parent.parent == shared_tmp / f"datavine-{ME}"
    assert mode(proxy.parent) == mode(proxy.parent.parent) == 0o700


@needs_root
def test_a_default_proxy_another_user_put_in_tmp_is_refused(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from datavine.coffea.prepare import find_x509_proxy

    monkeypatch.setenv("TMPDIR", str(tmp_path))
    monkeypatch.delenv("X509_USER_PROXY", raising=False)
    planted = tmp_path / f"x509up_u{ME}"
    planted.write_text("someone else's proxy")
    os.chown(planted, OTHER_UID, OTHER_UID)
    with pytest.raises(UnsafePathError, match=f"uid {OTHER_UID}"):
        find_x509_proxy(None)
    planted.unlink()
    real = tmp_path / "theirs"
    real.write_text("p")
    planted.symlink_to(real)
    with pytest.raises(UnsafePathError, match="not a regular file"):
        find_x509_proxy(None)


# --- secrets written with their final mode ----------------------------------------------------
@pytest.mark.usefixtures("no_chmod")
def test_a_secret_is_0600_from_its_creation(tmp_path: Path) -> None:
    with umask(0):
        path = write_secret(tmp_path / "s", "token")
        again = write_secret(tmp_path / "s", b"new", replace=True)
    assert path == again and path.read_bytes() == b"new" and mode(path) == 0o600


def test_a_secret_is_never_written_through_a_planted_symlink(tmp_path: Path) -> None:
    victim = tmp_path / "victim"
    victim.write_text("keep")
    victim.chmod(0o644)
    link = tmp_path / "vine.password"
    link.symlink_to(victim)
    with pytest.raises(FileExistsError):
        write_secret(link, "secret")  # O_EXCL | O_NOFOLLOW: not followed, not replaced
    assert link.is_symlink() and victim.read_text() == "keep"
    write_secret(link, "secret", replace=True)  # the link itself is replaced
    assert not link.is_symlink() and link.read_text() == "secret" and mode(link) == 0o600
    assert victim.read_text() == "keep" and mode(victim) == 0o644
    dangling = tmp_path / "dangling"
    dangling.symlink_to(tmp_path / "would-be-made")
    with pytest.raises(FileExistsError):
        write_secret(dangling, "secret")
    assert not (tmp_path / "would-be-made").exists()


@pytest.mark.usefixtures("no_chmod")
def test_the_manager_password_is_made_0600_and_replaces_a_planted_link(tmp_path: Path) -> None:
    from datavine.manager.cluster import make_password_file

    victim = tmp_path / "victim"
    victim.write_text("keep")
    run_dir = tmp_path / "run"
    run_dir.mkdir()
    (run_dir / "vine.password").symlink_to(victim)
    with umask(0):
        path = make_password_file(run_dir)
    assert not path.is_symlink() and mode(path) == 0o600 and len(path.read_text()) == 64
    assert victim.read_text() == "keep"
    old = path.read_text()
    with umask(0):
        assert make_password_file(run_dir).read_text() != old  # a new one each run
    assert mode(path) == 0o600


@pytest.mark.usefixtures("no_chmod")
def test_the_box_password_is_made_0600_once(tmp_path: Path) -> None:
    from datavine.deploy.box.facility import password_file
    from datavine.deploy.box.net import Box

    box = cast(Box, SimpleNamespace(dir=tmp_path))
    with umask(0):
        path = password_file(box)
    assert mode(path) == 0o600
    first = path.read_text()
    assert password_file(box).read_text() == first  # made once, kept


def test_the_box_refuses_a_planted_or_open_password_file(tmp_path: Path) -> None:
    from datavine.deploy.box.facility import password_file
    from datavine.deploy.box.net import Box

    box = cast(Box, SimpleNamespace(dir=tmp_path))
    theirs = tmp_path / "theirs"
    theirs.write_text("a password someone else knows")
    theirs.chmod(0o600)
    (tmp_path / "vine.password").symlink_to(theirs)
    with pytest.raises(UnsafePathError, match="not a regular file"):
        password_file(box)
    (tmp_path / "vine.password").unlink()
    (tmp_path / "vine.password").write_text("old")
    (tmp_path / "vine.password").chmod(0o644)
    with pytest.raises(ConfigError, match="chmod 600"):
        password_file(box)


# --- a user's password file -------------------------------------------------------------------
@pytest.fixture
def open_password(tmp_path: Path) -> Path:
    path = tmp_path / "vine.password"
    path.write_text("s3cret")
    path.chmod(0o640)
    return path


def test_a_password_file_open_to_others_is_refused_naming_it(open_password: Path) -> None:
    with pytest.raises(ConfigError) as err:
        check_private_file(open_password, "ManagerConfig.password_file")
    message = str(err.value)
    assert str(open_password) in message and "0640" in message
    assert f"chmod 600 {open_password}" in message and "ManagerConfig.password_file" in message
    assert mode(open_password) == 0o640  # not changed behind the user's back
    open_password.chmod(0o600)
    assert check_private_file(open_password, "p") == open_password


def test_a_missing_or_odd_password_file_is_named(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match=r"nope does not exist"):
        check_private_file(tmp_path / "nope", "p")
    with pytest.raises(ConfigError, match=r"is not a file"):
        check_private_file(tmp_path, "p")


def test_a_cluster_refuses_an_open_password_file(open_password: Path, tmp_path: Path) -> None:
    from datavine.manager.cluster import Cluster

    manager = ManagerConfig(run_dir=tmp_path / "run", password_file=open_password)
    with pytest.raises(ConfigError, match=rf"{open_password}.*chmod 600"):
        Cluster(manager)
    open_password.chmod(0o600)
    Cluster(manager)  # accepted, nothing started


def test_a_facility_file_with_an_open_password_file_is_refused(open_password: Path,
                                                               tmp_path: Path) -> None:
    from datavine.deploy.facility import FacilityCluster, load_facility

    site = tmp_path / "site.toml"
    site.write_text(f'[manager]\npassword_file = "{open_password}"\n'
                    f'run_dir = "{tmp_path / "run"}"\n')
    with pytest.raises(ConfigError, match=rf"{open_password}.*0640"):
        FacilityCluster(load_facility(site))


def test_a_pool_refuses_an_open_password_file_before_starting(
        open_password: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
        capsys: pytest.CaptureFixture[str]) -> None:
    from datavine.deploy.pools import cli as pool_cli
    from datavine.deploy.pools.local import LocalFactoryPool

    def launched(self: LocalFactoryPool, scratch: Path) -> None:
        raise AssertionError("the pool was started with a password others can read")

    monkeypatch.setattr(LocalFactoryPool, "_prepare", launched)
    rc = pool_cli.main(["pool", "start", "--batch", "local", "--workers", "1", "--manager",
                        "127.0.0.1:9123", "--password", str(open_password), "--name", "p1",
                        "--pool-dir", str(tmp_path / "pools")])
    err = capsys.readouterr().err
    assert rc == 1 and str(open_password) in err and "chmod 600" in err


# --- the XCache testbed's mirror --------------------------------------------------------------
def test_the_mirror_never_changes_an_inputs_mode(tmp_path: Path) -> None:
    from datavine.apps.testbed import readable_folder

    hidden = tmp_path / "hidden"  # mode 0700: "nobody" cannot enter it
    hidden.mkdir(mode=0o700)
    private, public = hidden / "private.root", hidden / "public.root"
    private.write_bytes(b"p" * 100)
    private.chmod(0o600)
    public.write_bytes(b"q" * 10)
    public.chmod(0o644)
    with readable_folder(hidden, [private, public], "nobody") as (mirror, served):
        assert mirror != hidden
        assert mode(private) == 0o600 and mode(public) == 0o644  # inputs as they were
        copy, link = served
        assert copy.read_bytes() == private.read_bytes()
        assert os.stat(copy).st_ino != os.stat(private).st_ino
        assert os.stat(copy).st_uid == pwd.getpwnam("nobody").pw_uid  # nobody reads it
        assert mode(copy) & 0o400
        assert mode(copy) & 0o077 == 0  # and no one else
        assert os.stat(link).st_ino == os.stat(public).st_ino  # readable already: linked
    assert mode(private) == 0o600 and mode(public) == 0o644


# --- local workers' sizes ---------------------------------------------------------------------
@pytest.mark.parametrize(("kwargs", "setting"), [
    ({"memory_mb": 0}, "memory_mb"),
    ({"memory_mb": -100}, "memory_mb"),
    ({"memory_mb": 1.5}, "memory_mb"),
    ({"memory_mb": "2000"}, "memory_mb"),
    ({"memory_mb": True}, "memory_mb"),
    ({"disk_mb": 0}, "disk_mb"),
    ({"cores": 0}, "cores"),
    ({"cores": 2.0}, "cores"),
    ({"workers": -1}, "workers"),
    ({"idle_timeout_s": 0}, "idle_timeout_s"),
    ({"connect_timeout_s": 0}, "connect_timeout_s"),
])
def test_bad_local_worker_settings_are_refused_naming_them(kwargs: dict[str, object],
                                                           setting: str) -> None:
    value = next(iter(kwargs.values()))
    with pytest.raises(ConfigError, match=rf"LocalWorkersConfig\.{setting} .*{value!r}"):
        LocalWorkersConfig(**kwargs)  # type: ignore[arg-type]


def test_good_local_worker_settings_pass() -> None:
    cfg = LocalWorkersConfig(workers=0, cores=2, memory_mb=1500, disk_mb=None)
    assert cfg.memory_mb == 1500


def test_a_local_cluster_with_bad_memory_is_refused_before_it_makes_anything(
        shared_tmp: Path) -> None:
    from datavine.deploy.launch import local_cluster
    from datavine.manager.cluster import LocalCluster

    with pytest.raises(ConfigError, match=r"memory_mb .*got 0"):
        LocalCluster(workers=1, memory_mb=0)
    with pytest.raises(ConfigError, match=r"memory_mb .*got -5"):
        local_cluster(RunConfig(), ManagerConfig(run_dir=shared_tmp / "run"), memory_mb=-5)
    assert list(shared_tmp.iterdir()) == []  # no run folder, no password


def test_a_facility_files_local_workers_are_checked(tmp_path: Path) -> None:
    from datavine.deploy.facility import FacilityError, load_facility

    site = tmp_path / "site.toml"
    site.write_text("[local_workers]\nmemory_mb = 0\n")
    with pytest.raises(FacilityError, match=r"local_workers.*memory_mb.*got 0"):
        load_facility(site)


def test_pools_and_local_workers_share_one_check() -> None:
    from datavine.deploy.pools.factory import FactoryConfig

    with pytest.raises(ConfigError) as pool:
        FactoryConfig("h", 1, memory_mb=1.5)  # type: ignore[arg-type]
    with pytest.raises(ConfigError) as local:
        LocalWorkersConfig(memory_mb=1.5)  # type: ignore[arg-type]
    assert str(pool.value).replace("FactoryConfig", "X") == \
        str(local.value).replace("LocalWorkersConfig", "X")
