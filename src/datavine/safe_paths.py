"""Files and folders that must stay private: per-user folders in shared places, secrets.

The one place where datavine makes a folder under a shared directory (``/tmp``) and writes
a secret, on the manager and on the workers alike:

- :func:`private_dir` makes a folder with mode 0700, or checks the one already there with
  ``os.lstat``: a real directory (not a symlink), owned by this user, with no group or
  other bits. Anything else is an :class:`UnsafePathError` naming the path, its owner and
  its mode; such a folder is never used and never chmod-ed (another user may have made it
  first, to read what lands there or to swap it under us). :func:`user_temp_dir` is the
  per-user folder under the temp dir (``$TMPDIR/datavine-<uid>/<name>``).
- :func:`write_secret` writes a secret (a password, a token, an X509 proxy) into a file
  created with mode 0600 from the start (``os.open(..., O_CREAT | O_EXCL | O_NOFOLLOW,
  0o600)``: no window with a wider mode, whatever the umask; a symlink planted at the path
  is refused, never followed); a rewrite replaces the file by a new one, atomically.
- :func:`check_private_file` checks a secret a user gives (a password file): it must exist,
  be a readable regular file and be open to no one else, else a
  :class:`~datavine.errors.ConfigError` naming the file, its mode and the fix.
- :func:`check_own_file` checks a file found in a shared place (the default X509 proxy in
  ``/tmp``): a regular file (not a symlink) owned by this user.

Standard library only (and :mod:`datavine.errors`): imported on workers.
"""

from __future__ import annotations

import contextlib
import os
import pwd
import secrets
import stat
import tempfile
from pathlib import Path

from datavine.errors import ConfigError

__all__ = ["UnsafePathError", "check_own_file", "check_private_file", "private_dir",
           "user_temp_dir", "write_secret"]

PRIVATE_DIR_MODE = 0o700
SECRET_MODE = 0o600
SHARED_BITS = 0o077  # group and other: what a private file or folder must not have


class UnsafePathError(PermissionError):
    """A file or folder datavine would use is not safely this user's own (another owner,
    bits for group or others, a symlink); the message names the path, owner and mode."""


def describe(st: os.stat_result) -> str:
    """``owner uid 65534 (nobody), mode drwxrwxrwx (0777)``: who owns it and its mode."""
    try:
        name = f" ({pwd.getpwuid(st.st_uid).pw_name})"
    except KeyError:
        name = ""
    return (f"owner uid {st.st_uid}{name}, mode {stat.filemode(st.st_mode)} "
            f"({stat.S_IMODE(st.st_mode):04o})")


def _unsafe(path: Path, st: os.stat_result, problem: str, fix: str) -> UnsafePathError:
    return UnsafePathError(f"{path}: {problem} ({describe(st)}); datavine will not use it: "
                           f"{fix}")


def check_private_dir(path: Path) -> None:
    """Raise :class:`UnsafePathError` unless ``path`` is a real directory (``os.lstat``: a
    symlink is refused), owned by this user, with no group or other bits."""
    st = os.lstat(path)
    fix = f"remove it, or set TMPDIR to a folder of your own (this user is uid {os.getuid()})"
    if not stat.S_ISDIR(st.st_mode):
        raise _unsafe(path, st, "not a directory (a symlink or a file is in its place)", fix)
    if st.st_uid != os.getuid():
        raise _unsafe(path, st, f"owned by another user, not by uid {os.getuid()}", fix)
    if stat.S_IMODE(st.st_mode) & SHARED_BITS:
        raise _unsafe(path, st, "open to group or others", fix)


def private_dir(path: str | os.PathLike[str]) -> Path:
    """``path`` as a folder only this user can enter: made with mode 0700 (its parent must
    exist), or, when it exists, checked (:func:`check_private_dir`) and never changed."""
    path = Path(path)
    with contextlib.suppress(FileExistsError):
        os.mkdir(path, PRIVATE_DIR_MODE)  # the umask only takes bits away: never wider
    check_private_dir(path)
    return path


def user_temp_dir(name: str) -> Path:
    """``$TMPDIR/datavine-<uid>/<name>``: this user's folder ``name`` under the temp dir,
    both levels private (:func:`private_dir`), reused by later calls."""
    base = private_dir(Path(tempfile.gettempdir()) / f"datavine-{os.getuid()}")
    return private_dir(base / name)


def _create(path: Path, data: bytes) -> None:
    """Write ``data`` into a new file ``path`` of mode 0600 (FileExistsError when anything,
    a symlink included, is there)."""
    flags = os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC
    fd = os.open(path, flags, SECRET_MODE)  # the umask only takes bits away: never wider
    try:
        with os.fdopen(fd, "wb") as out:
            out.write(data)
    except BaseException:
        path.unlink(missing_ok=True)
        raise


def write_secret(path: str | os.PathLike[str], data: str | bytes, *,
                 replace: bool = False) -> Path:
    """Write ``data`` into ``path``, a file of mode 0600 from its creation on.

    Without ``replace`` the file must be new: anything at ``path`` (a file, a planted
    symlink) is a FileExistsError. With ``replace`` a new file is written beside it and
    renamed over ``path`` (readers see the old or the whole new secret; a symlink at
    ``path`` is replaced, not followed)."""
    path = Path(path)
    blob = data.encode() if isinstance(data, str) else data
    if not replace:
        _create(path, blob)
        return path
    staged = path.with_name(f".{path.name}.{secrets.token_hex(6)}")
    _create(staged, blob)
    try:
        os.replace(staged, path)
    except BaseException:
        staged.unlink(missing_ok=True)
        raise
    return path


def check_private_file(path: str | os.PathLike[str], setting: str) -> Path:
    """``path``, a secret a user gave as ``setting`` (``"ManagerConfig.password_file"``), if
    it is a readable regular file that neither group nor others may open; else a
    :class:`~datavine.errors.ConfigError` naming the setting, the file, its mode and the fix."""
    path = Path(path)
    try:
        st = os.stat(path)
    except FileNotFoundError:
        raise ConfigError(f"{setting} {path} does not exist") from None
    except OSError as exc:
        raise ConfigError(f"{setting} {path} cannot be read: {exc.strerror or exc}") from exc
    if not stat.S_ISREG(st.st_mode):
        raise ConfigError(f"{setting} {path} is not a file ({describe(st)})")
    mode = stat.S_IMODE(st.st_mode)
    if mode & SHARED_BITS:
        raise ConfigError(f"{setting} {path} is open to group or others (mode {mode:04o}, "
                          f"{stat.filemode(st.st_mode)}): a secret must be its owner's only; "
                          f"run chmod 600 {path}")
    if not os.access(path, os.R_OK):
        raise ConfigError(f"{setting} {path} cannot be read by this user (uid "
                          f"{os.getuid()}; {describe(st)})")
    return path


def check_own_file(path: Path, what: str) -> Path:
    """``path``, a file found in a shared place, if it is a regular file (``os.lstat``: not
    a symlink) owned by this user; else an :class:`UnsafePathError` naming it."""
    st = os.lstat(path)
    fix = f"remove it, or name your own {what} explicitly"
    if not stat.S_ISREG(st.st_mode):
        raise _unsafe(path, st, f"{what} is not a regular file (a symlink?)", fix)
    if st.st_uid != os.getuid():
        raise _unsafe(path, st, f"{what} is owned by another user, not by uid {os.getuid()}",
                      fix)
    return path
