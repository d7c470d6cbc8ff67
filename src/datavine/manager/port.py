"""What a run drives: the interface between the run loop and the manager's shell.

:class:`datavine.manager.execution.GraphRun` drives one run through a :class:`RunPort` and
nothing else: TaskVine's side of the calls (:class:`CallPort`, implemented by
:class:`datavine.manager.taskvine_port.TaskVinePort`), the library's lifecycle
(:class:`LibraryPort`, :class:`datavine.manager.library.DatavineLibrary`) and the watch on the
workers (:class:`WorkerPort`, :class:`datavine.manager.worker_watch.WorkerWatch`), composed by
:class:`datavine.manager.runtime.Runtime`; ``tests/fake_runtime.py`` is a fake of the whole.
A run hands the values it delivers to a :data:`ResultHook` (the coffea executor's progress
and partial merge subscribe one through :meth:`Runtime.subscribe_results
<datavine.manager.runtime.Runtime.subscribe_results>`).

No TaskVine here, and nothing that imports it: the protocols only name what is called.
"""

from __future__ import annotations

from collections.abc import Callable, Hashable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Protocol, runtime_checkable

if TYPE_CHECKING:
    from datavine.scheduler.learned import Learned
    from datavine.scheduler.network import LibraryState
    from datavine.scheduler.summary import RunSummary

Key = Hashable
# (keys of the tasks that finished, {key: value} of the values delivered with them)
ResultHook = Callable[[list[Key], dict[Key, object]], None]


@dataclass
class Finished:
    """A bundle's call as TaskVine returned it: the status dict the library sent
    (``result``), or why there is none (``failure``: the library or its worker died), and
    the worker it ran on."""

    id: int
    result: dict[str, object] | None
    addrport: str | None
    failure: str = ""


class CallPort(Protocol):
    """TaskVine's side of a run: bundles in as function calls of the library, results out,
    the temp files that hold values on workers, and the pool's size."""

    @property
    def port(self) -> int:
        """The manager's port (in the run's messages)."""
        ...

    def submit_bundle(self, payload: bytes, cap_mb: float | None, preload: tuple[str, ...],
                      limit_s: float | None, features: Sequence[str] = (),
                      fetch: Mapping[str, object] | None = None,
                      store: Mapping[str, object] | None = None) -> int:
        """Submit one bundle as a call of the library (``fetch`` / ``store``: file name in
        the call's sandbox -> temp file it reads / writes); returns its task id."""
        ...

    def wait(self, timeout_s: int) -> Finished | None:
        """The next bundle call that finished within ``timeout_s``, or None."""
        ...

    def cancel(self, task_id: int) -> None:
        """Withdraw a call that is not running."""
        ...

    def call_state(self, task_id: int) -> str:
        """TaskVine's state of a call: READY, RUNNING, ... ('' once it is gone)."""
        ...

    def call_worker(self, task_id: int) -> str | None:
        """The address of the worker a call runs on, if any."""
        ...

    def call_places(self, task_ids: Iterable[int]) -> Mapping[int, tuple[str, str | None]]:
        """Each call's state and, once it is not READY, its worker's address (None where
        unknown), read in one go (a pool sample reads every call out)."""
        ...

    def declare_temp(self) -> object:
        """A temp file (opaque to the run): made by a call, kept in its worker's cache."""
        ...

    def fetch(self, file: object) -> bytes | None:
        """The bytes of a temp file (blocking), or None when no worker has them."""
        ...

    def undeclare(self, file: object) -> None:
        """Forget a file: workers delete their replicas."""
        ...

    def file_bytes(self) -> tuple[int, int]:
        """File bytes the manager sent and received so far."""
        ...

    def pool_size(self) -> tuple[int, int]:
        """(workers, cores) connected."""
        ...

    def connected_workers(self) -> int:
        ...

    def network_fallback(self, block: Sequence[str], unblock: Sequence[str],
                         peers_off: bool) -> None:
        """Block hosts, unblock others, turn peer transfers off."""
        ...

    def dumps(self, spec: Mapping[str, object]) -> bytes:
        """A bundle as the bytes a call carries."""
        ...


class LibraryPort(Protocol):
    """The datavine library on the workers: installed, restarted, watched."""

    def ensure_library(self) -> str:
        """The installed library's name (installed now when there is none)."""
        ...

    def check_library(self) -> None:
        """Raise once the library keeps dying on workers."""
        ...

    def restart_library(self, calls: tuple[int, ...] = ()) -> None:
        """Stop every instance of the library, with the calls running in them."""
        ...

    def library_states(self, now: float) -> Mapping[str, LibraryState]:
        """Each connected worker's library (address -> state)."""
        ...


class WorkerPort(Protocol):
    """The workers as they come and go."""

    def drop_lost_workers(self) -> tuple[set[str], set[str]]:
        """(names, addresses) of the workers that left since the last look."""
        ...

    def requeued(self, now: float) -> list[int]:
        """Task ids TaskVine put back in its queue by itself since the last look."""
        ...


@runtime_checkable
class RunPort(CallPort, LibraryPort, WorkerPort, Protocol):
    """Everything a run drives, and what the manager learned across runs (``learned``,
    handed to each run); a run leaves its summary in ``last_summary``. ``isinstance(x,
    RunPort)`` checks that ``x`` has every member (not their signatures: mypy does)."""

    learned: Learned
    last_summary: RunSummary | None
