"""A run's bundles as calls of the datavine library, made with TaskVine's C functions.

The bindings' ``FunctionCall`` costs the manager ~30-60 us a call in Python alone (a uuid,
a dozen attribute lookups, a library check, a ``File`` object per buffer, a table of Python
tasks that ``Manager.wait`` walks with a look at whether the manager is empty, which visits
every library task) and gives every call an output buffer, which TaskVine fetches from the
worker with a ``getfile`` round trip and unlinks there. :class:`BundleCalls` makes the same
call from the C functions that the bindings wrap (a task running the library's function, its
arguments in a buffer, its features and files) without an output file: the library writes
the result as the call's standard output, which the worker sends with its completion
message (:mod:`datavine.worker.payload`'s reply; read as bytes by the port's reader). It
keeps each call's task and argument buffer until TaskVine returns the call, then frees
both.

TaskVine's functions come from the TaskVine port (:mod:`datavine.manager.taskvine_port`,
the one module that imports TaskVine), as a module object: :class:`VineC` names what is
called.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from typing import Protocol


class VineC(Protocol):
    """The C functions of TaskVine's bindings (``ndcctools.taskvine.cvine``) used here;
    ``object`` is one of their pointers (a task, a file, the manager)."""

    def vine_task_create(self, command: str, /) -> object: ...
    def vine_task_set_library_required(self, task: object, name: str, /) -> None: ...
    def vine_task_set_cores(self, task: object, cores: int, /) -> None: ...
    def vine_task_add_feature(self, task: object, name: str, /) -> int: ...
    def vine_task_add_input(self, task: object, file: object, name: str, flags: int, /) -> int: ...
    def vine_task_add_output(self, task: object, file: object, name: str,
                             flags: int, /) -> int: ...
    def vine_declare_buffer(self, manager: object, data: bytes, cache: int,
                            flags: int, /) -> object: ...
    def vine_undeclare_file(self, manager: object, file: object, /) -> None: ...
    def vine_submit(self, manager: object, task: object, /) -> int: ...
    def vine_cancel_by_task_id(self, manager: object, task_id: int, /) -> int: ...
    def vine_wait_for_tag(self, manager: object, tag: str | None, timeout: int, /) -> object: ...
    def vine_task_delete(self, task: object, /) -> None: ...
    def vine_task_get_id(self, task: object, /) -> int: ...
    def vine_task_get_state(self, task: object, /) -> str: ...
    def vine_task_get_result(self, task: object, /) -> int: ...
    def vine_result_string(self, result: int, /) -> str: ...
    def vine_task_get_exit_code(self, task: object, /) -> int: ...
    def vine_task_get_addrport(self, task: object, /) -> str | None: ...
    def vine_task_get_hostname(self, task: object, /) -> str | None: ...


@dataclass(frozen=True)
class Flags:
    """TaskVine's constants for a call (from the bindings): its argument buffer's cache
    level (the call's own) and a mount's transfer flag; ``success``: a task's result code
    when it ran."""

    task_level: int
    always: int
    success: int


@dataclass(slots=True)
class _Call:
    task: object  # the C task
    arguments: object  # its argument buffer
    withdrawn: bool = False  # cancelled: nobody waits for its end


@dataclass(frozen=True)
class Ended:
    """A bundle's call as TaskVine returned it: whether it ran to the end (``ok``: TaskVine's
    result is success and the library's exit code 0), what it replied (its standard
    output), where, and TaskVine's word on it (``result``, lower case)."""

    id: int
    ok: bool
    reply: bytes | None
    addrport: str | None
    hostname: str
    result: str
    exit_code: int
    withdrawn: bool = False


class BundleCalls:
    """The calls of one manager (``manager``: its C pointer) to the datavine library (see
    the module docstring); ``reply`` reads a returned call's standard output as bytes."""

    def __init__(self, c: VineC, manager: object, flags: Flags, function: str,
                 reply: Callable[[object], bytes | None]) -> None:
        self._c = c
        self._reply = reply
        self._manager = manager
        self._flags = flags
        self._function = function  # the library's function every call runs
        self._calls: dict[int, _Call] = {}

    def __contains__(self, task_id: int) -> bool:
        return task_id in self._calls

    def submit(self, library: str, arguments: bytes, features: Iterable[str] = (),
               fetch: Mapping[str, object] | None = None,
               store: Mapping[str, object] | None = None) -> int:
        """Submit a one-core call of ``library``'s function with ``arguments`` (the pickled
        event the library reads from its ``infile``); ``fetch`` / ``store``: name in the
        call's sandbox -> C file it reads / writes. Returns its task id."""
        c, m, flags = self._c, self._manager, self._flags
        task = c.vine_task_create(self._function)
        buffer = c.vine_declare_buffer(m, arguments, flags.task_level, 0)  # peers may send it
        call = _Call(task, buffer)
        try:
            c.vine_task_set_library_required(task, library)
            c.vine_task_set_cores(task, 1)
            ok = c.vine_task_add_input(task, buffer, "infile", flags.always)
            for name, file in (fetch or {}).items():
                ok = ok and c.vine_task_add_input(task, file, name, flags.always)
            for name, file in (store or {}).items():
                ok = ok and c.vine_task_add_output(task, file, name, flags.always)
            for feature in features:
                c.vine_task_add_feature(task, feature)
            task_id = c.vine_submit(m, task) if ok else 0
        except BaseException:
            self._free(call)
            raise
        if not task_id:
            self._free(call)
            raise ValueError("TaskVine refused a bundle's call (an invalid file or library)")
        self._calls[task_id] = call
        return task_id

    def state(self, task_id: int) -> str:
        """TaskVine's state of a call (READY, RUNNING, ...; '' once returned)."""
        call = self._calls.get(task_id)
        return self._c.vine_task_get_state(call.task) if call is not None else ""

    def worker(self, task_id: int) -> str | None:
        """The address of the worker a call was sent to, if any."""
        call = self._calls.get(task_id)
        return self._c.vine_task_get_addrport(call.task) if call is not None else None

    def places(self, task_ids: Iterable[int]) -> dict[int, tuple[str, str | None]]:
        """Each call's state and, once it left the queue (not READY), its worker's address,
        in one go: a pool sample reads every call out (a few hundred at 256 workers), and
        read one by one through the port's layers that was most of the sample's cost. A
        call that is not TaskVine's any more reads ('', None)."""
        calls, state, addrport = self._calls, self._c.vine_task_get_state, \
            self._c.vine_task_get_addrport
        out: dict[int, tuple[str, str | None]] = {}
        for task_id in task_ids:
            call = calls.get(task_id)
            if call is None:
                out[task_id] = ("", None)
                continue
            now = state(call.task)
            out[task_id] = (now, None if now == "READY" else addrport(call.task))
        return out

    def cancel(self, task_id: int) -> None:
        """Withdraw a call: TaskVine returns it later (as cancelled), and it is freed then."""
        call = self._calls.get(task_id)
        if call is None:
            return
        if self._c.vine_cancel_by_task_id(self._manager, task_id):
            call.withdrawn = True
        else:  # not TaskVine's any more: nothing will return it
            del self._calls[task_id]
            self._free(call)

    def take(self, task: object) -> Ended | None:
        """What became of the call ``task`` (a pointer ``vine_wait`` returned), which is
        freed; None when it is not one of these calls (a task of the bindings')."""
        c = self._c
        task_id = c.vine_task_get_id(task)
        call = self._calls.pop(task_id, None)
        if call is None:
            return None
        try:
            result, exit_code = c.vine_task_get_result(task), c.vine_task_get_exit_code(task)
            ok = result == self._flags.success and exit_code == 0
            return Ended(task_id, ok, self._reply(task) if ok else None,
                         c.vine_task_get_addrport(task), c.vine_task_get_hostname(task) or "?",
                         c.vine_result_string(result).lower().replace("_", " "), exit_code,
                         call.withdrawn)
        finally:
            self._free(call)

    def forget(self) -> None:
        """Drop every call without freeing it: the manager that holds them is gone."""
        self._calls.clear()

    def _free(self, call: _Call) -> None:
        self._c.vine_undeclare_file(self._manager, call.arguments)
        self._c.vine_task_delete(call.task)
