"""The private internals of TaskVine's Python bindings that datavine uses, behind one adapter.

datavine drives TaskVine through more than the bindings publish: the manager's C pointer
and its table of tasks, ``Manager._free``, a ``File``'s C pointer, the raw C functions
(``cvine._cvine``), ``FunctionCall.submit_finalize`` and the fields it sets, the
``declare_file`` calls inside ``create_library_from_functions``, the library's code, cctools'
debug flags in the bindings' own library, and the file a worker keeps a call's standard
output in. Each is used here only (:class:`Internals`), and each is an assumption with a
name (:data:`ASSUMPTIONS`): :func:`broken` tests them all against the bindings in use, the
capability record reports those that fail (``datavine doctor``), and
tests/test_taskvine_internals.py has one test per assumption, so that a TaskVine upgrade
fails one named test instead of a run.

The TaskVine port (:mod:`datavine.manager.taskvine_port`, the one module that imports
TaskVine) hands the modules in.
"""

from __future__ import annotations

import contextlib
import ctypes
import inspect
import pickle
from collections.abc import Callable, Iterator
from pathlib import Path
from types import ModuleType
from typing import Protocol, cast

from datavine.manager.bundle_calls import VineC
from datavine.manager.taskvine_types import VineFile, VineManager, VineTask
from datavine.worker.payload import REPLY_HEAD_MAX, reply_frame

# where a call's standard output is in its sandbox (vine_process.c): a bundle's result
REPLY_FILE = ".taskvine.stdout"
QUEUE_MARK = "was cancelled before it started"  # in the library code of patch 0015
QUIET_DEBUG_FLAGS = (b"notice", b"error", b"fatal")  # kept when the debug log is off


class _VineObject(Protocol):
    """A file of the bindings' (``ndcctools.taskvine.File``): its C pointer."""

    @property
    def _file(self) -> object: ...


class _ManagerInside(Protocol):
    """What is read inside the bindings' ``Manager``: its C pointer, and its table of the
    tasks submitted through the bindings (``Manager.wait`` takes them out of it)."""

    @property
    def _taskvine(self) -> object: ...

    @property
    def _task_table(self) -> dict[int, object]: ...

    def _free(self) -> None: ...


def raw_c(vine: ModuleType) -> VineC:
    """The C functions themselves (the module ``cvine`` wraps each in a Python function)."""
    cvine = vine.cvine
    return cast(VineC, getattr(cvine, "_cvine", cvine))


def in_memory_calls(vine: ModuleType) -> type:
    """TaskVine's ``FunctionCall`` with its arguments and its result kept in the manager's
    memory (TaskVine buffers) instead of two files in the staging folder.

    The bindings write each call's arguments to a file (created, checksummed by reading it
    back, sent, unlinked) and have its result written to another (created in the wait loop,
    opened again to be read): on this host a file created costs the manager ~0.3-0.6 ms, the
    largest part of its own cost per bundle (benchmarks/README.md, manager profile). A
    buffer travels the same way on the wire (a ``put`` of the bytes; the result by
    ``getfile``) and the library reads and writes the same ``infile`` and ``outfile``."""

    class InMemoryCall(vine.FunctionCall):  # type: ignore[name-defined]
        _event: dict[str, object] | None  # the call's arguments, until submitted

        def submit_finalize(self) -> None:
            manager = self.manager
            library = self.get_library_required()
            if not manager.check_library_exists(library):
                raise ValueError(f"invalid library name '{library}'")
            # plain data (the bundle is bytes already): pickle's C pickler, not cloudpickle's
            event = pickle.dumps(self._event, protocol=pickle.HIGHEST_PROTOCOL)
            self._input_file = manager.declare_buffer(event, cache=False, peer_transfer=True)
            self._output_file = manager.declare_buffer(None, cache=False,
                                                       peer_transfer=False)
            self._event = None
            self.add_input(self._input_file, "infile")
            self.add_output(self._output_file, "outfile")

    return InMemoryCall


class Internals:
    """The private parts of one TaskVine's bindings (``vine``: ``ndcctools.taskvine``;
    ``library_code``: ``ndcctools.poncho.library_network_code``, None when absent)."""

    def __init__(self, vine: ModuleType, library_code: ModuleType | None = None) -> None:
        self.vine = vine
        self.library_code = library_code
        self.c = raw_c(vine)

    @staticmethod
    def manager_pointer(manager: VineManager) -> object:
        return cast(_ManagerInside, manager)._taskvine

    @staticmethod
    def take_task(manager: VineManager, task_id: int) -> VineTask | None:
        """The bindings' object of a task ``vine_wait`` returned, taken out of their table as
        ``Manager.wait`` does (it frees the task when it is dropped)."""
        table = cast(_ManagerInside, manager)._task_table
        return cast("VineTask | None", table.pop(task_id, None))

    @staticmethod
    def free_manager(manager: VineManager) -> None:
        """Delete a TaskVine manager now (the bindings do it whenever the garbage collector
        gets to it)."""
        cast(_ManagerInside, manager)._free()

    @staticmethod
    def file_pointer(file: object) -> object:
        return cast(_VineObject, file)._file

    @staticmethod
    @contextlib.contextmanager
    def unshared_library_files(manager: VineManager) -> Iterator[None]:
        """While ``create_library_from_functions`` declares the library's own files (its code
        and pickled context, a few KB), declare them not shared between workers: the manager
        sends them to each worker. Shared, a worker fetched them from a peer that had them a
        millisecond earlier, and a worker that cannot reach that peer waited for TCP's
        connect timeout (~130 s) with its library never started
        (RunConfig.library_from_peers)."""
        declare = manager.declare_file

        def unshared(path: str, cache: bool = False, peer_transfer: bool = True,
                     unlink_when_done: bool = False) -> VineFile:
            return declare(path, cache=cache, peer_transfer=False,
                           unlink_when_done=unlink_when_done)

        manager.declare_file = unshared
        try:
            yield
        finally:
            del manager.declare_file  # the class's method again

    def reply_reader(self) -> Callable[[object], bytes | None]:
        """A reader of a returned call's standard output as bytes, NUL bytes included: the
        bindings return it as a C string, which ends at the first NUL. TaskVine keeps it in a
        buffer of its length plus a NUL (``vine_manager.c``'s ``get_stdout``), and a reply's
        head (:func:`datavine.worker.payload.reply_frame`, no NUL in it) names the length of
        what follows, so the reader asks ``vine_task_get_stdout`` for the pointer (through
        ctypes, from the bindings' own library), reads at most the head up to the first NUL
        (``strnlen``), then the length it names; output with no such head (text) is read up
        to its NUL. It is only read for a call TaskVine returned whole (its result success:
        an output cut short or over TaskVine's limit is not)."""
        lib = ctypes.CDLL(str(self.library_file))
        stdout = lib.vine_task_get_stdout
        stdout.restype, stdout.argtypes = ctypes.c_void_p, [ctypes.c_void_p]
        strnlen = ctypes.CDLL(None).strnlen
        strnlen.restype = ctypes.c_size_t
        strnlen.argtypes = [ctypes.c_void_p, ctypes.c_size_t]
        string_at = ctypes.string_at

        def read(task: object) -> bytes | None:
            at = stdout(int(cast(int, task)))
            if not at:
                return None
            head = string_at(at, strnlen(at, REPLY_HEAD_MAX))
            frame = reply_frame(head)
            return string_at(at) if frame is None else string_at(at, frame[0] + frame[1])

        return read

    def call_class(self) -> type:
        return in_memory_calls(self.vine)

    def library_queues_calls(self) -> bool:
        """Whether the direct-mode library the manager ships queues calls in its pipe
        (patch 0015), read from its code."""
        try:
            return self.library_code is not None and QUEUE_MARK in inspect.getsource(
                self.library_code)
        except (OSError, TypeError):
            return False

    @property
    def library_file(self) -> Path:
        """The shared library of the bindings (``_cvine``)."""
        return Path(cast(ModuleType, self.c).__file__ or "")

    def quiet_debug_log(self) -> None:
        """Keep only TaskVine's notices and errors in its debug log (``vine-logs/debug``).

        Creating a manager turns cctools' debug log on with every flag: a line for every
        message to and from every worker, formatted and written in the manager's loop. The
        bindings do not wrap cctools' debug flags, but their own library exports them
        (``cctools_debug_flags_clear``/``_set``, process-wide), so they are called there. A
        build without the symbols keeps its full log."""
        import ctypes

        try:
            lib = ctypes.CDLL(str(self.library_file))
            clear, set_flag = lib.cctools_debug_flags_clear, lib.cctools_debug_flags_set
        except (OSError, AttributeError):
            return
        clear()
        for flag in QUIET_DEBUG_FLAGS:
            set_flag(flag)


# --- the assumptions, each with a name -------------------------------------------------------
C_FUNCTIONS = tuple(name for name in dir(VineC) if name.startswith("vine_"))


def _source(obj: object) -> str:
    try:
        return inspect.getsource(cast(Callable[..., object], obj))
    except (OSError, TypeError):
        return ""


def _needs(where: str, source: str, *parts: str) -> str | None:
    lacking = [p for p in parts if p not in source]
    return f"{where} has no {', '.join(lacking)}" if lacking else None


def _c_functions(it: Internals, worker: Path | None) -> str | None:
    lacking = [n for n in C_FUNCTIONS if not callable(getattr(it.c, n, None))]
    return f"cvine._cvine lacks {', '.join(lacking)}" if lacking else None


def _manager_fields(it: Internals, worker: Path | None) -> str | None:
    manager = it.vine.Manager
    return (_needs("Manager.__init__", _source(manager.__init__), "self._taskvine",
                   "self._task_table")
            or _needs("Manager.wait_for_tag", _source(manager.wait_for_tag),
                      "vine_wait_for_tag(self._taskvine", "self._task_table[",
                      "vine_task_get_id"))


def _manager_free(it: Internals, worker: Path | None) -> str | None:
    return None if callable(getattr(it.vine.Manager, "_free", None)) else "no Manager._free"


def _file_pointer(it: Internals, worker: Path | None) -> str | None:
    return _needs("File.__init__", _source(it.vine.File.__init__), "self._file")


def _library_files(it: Internals, worker: Path | None) -> str | None:
    manager = it.vine.Manager
    params = inspect.signature(manager.declare_file).parameters
    lacking = [p for p in ("path", "cache", "peer_transfer", "unlink_when_done")
               if p not in params]
    if lacking:
        return f"Manager.declare_file takes no {', '.join(lacking)}"
    return _needs("Manager.create_library_from_functions",
                  _source(manager.create_library_from_functions), "self.declare_file(")


def _library_options(it: Internals, worker: Path | None) -> str | None:
    params = inspect.signature(it.vine.Manager.create_library_from_functions).parameters
    lacking = [p for p in ("add_env", "exec_mode", "library_context_info") if p not in params]
    return (f"Manager.create_library_from_functions takes no {', '.join(lacking)}"
            if lacking else None)


def _function_call(it: Internals, worker: Path | None) -> str | None:
    call = it.vine.FunctionCall
    return (_needs("FunctionCall.__init__", _source(call.__init__), "self._event")
            or _needs("FunctionCall.submit_finalize", _source(call.submit_finalize),
                      "get_library_required", "check_library_exists", "self._input_file",
                      "self._output_file", '"infile"', '"outfile"')
            or _needs("FunctionCall.output", _source(call.output.fget), "_output_file"))


def _debug_flags(it: Internals, worker: Path | None) -> str | None:
    import ctypes

    try:
        lib = ctypes.CDLL(str(it.library_file))
        lib.cctools_debug_flags_clear, lib.cctools_debug_flags_set  # noqa: B018
    except (OSError, AttributeError) as exc:
        return f"{it.library_file.name}: {exc}"
    return None


def _call_stdout(it: Internals, worker: Path | None) -> str | None:
    if worker is None:
        return None  # no vine_worker here to read: the workers are elsewhere
    try:
        found = REPLY_FILE.encode() in worker.read_bytes()
    except OSError as exc:
        return f"cannot read {worker}: {exc.strerror}"
    return None if found else f"{worker} keeps no call's output in {REPLY_FILE}"


def _call_reply(it: Internals, worker: Path | None) -> str | None:
    try:
        it.reply_reader()
    except (OSError, AttributeError) as exc:
        return f"{it.library_file.name}: {exc}"
    return None


# name -> check(internals, the vine_worker binary or None): None when it holds, else what
# was found instead
ASSUMPTIONS: dict[str, Callable[[Internals, Path | None], str | None]] = {
    "c-functions": _c_functions,
    "manager-fields": _manager_fields,
    "manager-free": _manager_free,
    "file-pointer": _file_pointer,
    "library-files-declared": _library_files,
    "library-options": _library_options,
    "function-call-fields": _function_call,
    "debug-flags": _debug_flags,
    "call-output-file": _call_stdout,
    "call-reply-bytes": _call_reply,
}


def broken(it: Internals, worker: Path | None) -> dict[str, str]:
    """Each assumption that does not hold for these bindings, with what was found."""
    out = {}
    for name, check in ASSUMPTIONS.items():
        try:
            problem = check(it, worker)
        except Exception as exc:  # an upgrade may break a check itself: that is a finding
            problem = f"{type(exc).__name__}: {exc}"
        if problem:
            out[name] = problem
    return out
