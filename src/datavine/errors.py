"""Exceptions datavine raises; each message names the task, file or setting at fault."""

from __future__ import annotations

from collections.abc import Hashable


class DatavineError(RuntimeError):
    """Base class of datavine's own errors."""


class ConfigError(ValueError):
    """A setting has a value datavine cannot use; the message names the setting."""


class TaskvineMissingError(DatavineError):
    """ndcctools.taskvine is not importable."""

    def __init__(self, cause: Exception) -> None:
        super().__init__(
            "ndcctools.taskvine is not importable: build it with scripts/build_taskvine.sh "
            f"(or run scripts/setup.sh), then use .venv/bin/python ({cause})"
        )


class RemoteTaskError(DatavineError):
    """A dask task failed on a worker and its exception could not be brought back as is."""

    def __init__(self, key: Hashable | None, message: str, remote_traceback: str,
                 where: str = "") -> None:
        self.key = key
        self.remote_traceback = remote_traceback
        at = f" on {where}" if where else ""
        super().__init__(f"task {key!r} failed{at}: {message}\n--- remote traceback ---\n"
                         f"{remote_traceback}")


class BundleFailedError(DatavineError):
    """A bundle of tasks kept failing outside user code (lost workers, crashed library)."""

    def __init__(self, keys: list[Hashable], attempts: int, reason: str) -> None:
        self.keys = keys
        shown = ", ".join(repr(k) for k in keys[:3]) + (" ..." if len(keys) > 3 else "")
        super().__init__(f"tasks {shown} ({len(keys)} in all) failed {attempts} times: {reason}")


class MemoryCapError(DatavineError):
    """A task exceeded its memory cap at the ceiling of the memory policy."""

    def __init__(self, keys: list[Hashable], category: str, peak_mb: float, cap_mb: float,
                 reason: str) -> None:
        self.keys = keys
        self.category = category
        self.peak_mb = peak_mb
        self.cap_mb = cap_mb
        shown = ", ".join(repr(k) for k in keys[:3]) + (" ..." if len(keys) > 3 else "")
        super().__init__(f"task(s) {shown} of category {category!r} used {peak_mb:.0f} MB, "
                         f"over the cap of {cap_mb:.0f} MB: {reason}")


class NoWorkersError(DatavineError):
    """Work was waiting and no worker connected within the timeout."""


class RunTimeoutError(DatavineError):
    """A run did not finish within its time limit."""


class LibraryFailedError(DatavineError):
    """datavine's TaskVine library kept dying on workers (the message quotes its log)."""


class TaskLoadError(DatavineError):
    """A worker could not load a task sent to it (a module missing there, most often)."""


class EnvironmentStageError(DatavineError):
    """The packed environment did not reach a first worker."""


class TaskTimeLimitError(DatavineError):
    """A task ran past its category's time limit (``RunConfig.time_limits``) on every try."""

    def __init__(self, key: Hashable, category: str, limit_s: float, attempts: int,
                 where: str) -> None:
        self.key = key
        self.category = category
        self.limit_s = limit_s
        super().__init__(f"task {key!r} of category {category!r} ran past its time limit of "
                         f"{limit_s:g} s {attempts} time(s) (last on {where}); it was killed. "
                         "Raise RunConfig.time_limits[category] if it needs longer")


class ManagerStartError(DatavineError):
    """The TaskVine manager could not start (its port is taken, most often)."""
