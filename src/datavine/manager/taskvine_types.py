"""What datavine calls on TaskVine's objects, as types: ``ndcctools.taskvine`` ships none.

Structural types (protocols) for the parts of a ``Manager``, a task (``Task``,
``FunctionCall``, ``LibraryTask``) and a ``File`` that the TaskVine port
(:mod:`datavine.manager.taskvine_port`) and the environment (:mod:`datavine.manager.environment`)
use; each names only what is called, with the types TaskVine's Python bindings return.
A TaskVine object matches them as it is. No TaskVine here, and nothing that imports it (the
port alone does): this module only describes.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Protocol


class VineFile(Protocol):
    """A TaskVine file (``ndcctools.taskvine.File``): passed around as it is; datavine only
    reads a fetched temp's bytes."""

    def contents(self) -> bytes: ...


class VineStats(Protocol):
    """The counters of ``Manager.stats`` that datavine reads."""

    @property
    def workers_connected(self) -> int: ...

    @property
    def workers_joined(self) -> int: ...

    @property
    def workers_removed(self) -> int: ...

    @property
    def total_cores(self) -> int: ...

    @property
    def bytes_sent(self) -> int: ...

    @property
    def bytes_received(self) -> int: ...


class VineTask(Protocol):
    """A TaskVine task (a ``Task``, a ``FunctionCall``, a ``LibraryTask``): what datavine sets
    before submitting one, and reads once ``Manager.wait`` returned it."""

    @property
    def id(self) -> int: ...

    @property
    def command(self) -> str: ...

    @property
    def state(self) -> object: ...

    @property
    def output(self) -> object: ...  # a call's return value; a task's standard output

    @property
    def result(self) -> str: ...  # TaskVine's result string ("success", "max retries", ...)

    @property
    def exit_code(self) -> int | None: ...

    @property
    def addrport(self) -> str | None: ...

    @property
    def hostname(self) -> str | None: ...

    def successful(self) -> bool: ...

    def set_cores(self, cores: int) -> None: ...

    def set_function_slots(self, nslots: int) -> None: ...

    def set_env_var(self, name: str, value: str | None = None) -> None: ...

    def set_command(self, command: str) -> None: ...

    def add_input(self, file: object, remote_name: str) -> None: ...

    def add_output(self, file: object, remote_name: str) -> None: ...

    def add_feature(self, name: str) -> None: ...

    def add_execution_context(self, context: object) -> None: ...


class VineManager(Protocol):
    """A TaskVine manager (``ndcctools.taskvine.Manager``): what datavine calls on it."""

    # an attribute rather than a method: Internals.unshared_library_files replaces it for a while
    declare_file: Callable[..., VineFile]  # (path, cache=, peer_transfer=, unlink_when_done=)

    @property
    def port(self) -> int: ...

    @property
    def stats(self) -> VineStats: ...

    def set_password_file(self, file: str) -> None: ...

    def tune(self, name: str, value: float) -> None: ...

    def status(self, request: str) -> list[object] | None: ...  # the JSON list of dicts

    def submit(self, task: VineTask) -> int: ...

    def wait(self, timeout: int) -> VineTask | None: ...

    def cancel_by_task_id(self, id: int) -> object: ...

    def declare_temp(self) -> VineFile: ...

    def declare_untar(self, tarball: VineFile, cache: bool | str = False,
                      peer_transfer: bool = True) -> VineFile: ...

    def fetch_file(self, file: VineFile) -> object: ...

    def undeclare_file(self, file: object) -> None: ...

    def block_host(self, host: str) -> None: ...

    def unblock_host(self, host: str | None = None) -> None: ...

    def disable_peer_transfers(self) -> None: ...

    def create_library_from_functions(
            self, library_name: str, *function_list: Callable[..., object],
            add_env: bool = True, exec_mode: str = "fork",
            library_context_info: list[object] | None = None) -> VineTask: ...

    def install_library(self, task: VineTask) -> None: ...

    def remove_library(self, name: str) -> None: ...

    def _free(self) -> None: ...
