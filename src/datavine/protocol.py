"""The wire between the manager and the library on its workers, in one place: what a bundle
call carries (:class:`BundleSpec`), what comes back (:class:`BundleResult`) and the names of
what a worker reports (:class:`Status`; per-category timing, memory peak, reads).

Both sides import this module and nothing else defines the wire. Records cross it encoded:
``encode()`` makes a plain dict (``"protocol"``: :data:`PROTOCOL`, then one entry per field,
an enum as its string), which the manager pickles with cloudpickle (a spec holds the task
callables) and TaskVine carries back as the call's output; ``decode()`` checks it where it
arrives: the protocol version, every field present and none unknown, and the type of each
field (scalars and containers; what a container holds of the edges -- dask keys
(:data:`Key`), user values and task nodes (``Any``) -- passes as it is, and so do the
fields of a :class:`ReadRecordDict`). A mismatch is a
:class:`ProtocolError` that names the field and the sender, e.g. ``result from worker w-3
lacks field 'stored' (protocol 1)``: a worker running another datavine than the manager.

The worker answers a spec it cannot read with a result of status :attr:`Status.PROTOCOL`
(its message says why), so the manager's error names both sides.

Standard library only (and :mod:`datavine.errors`): imported on workers.
"""

from __future__ import annotations

import dataclasses
import enum
import functools
import pickle
import types
from collections.abc import Callable, Hashable, Mapping
from dataclasses import dataclass, field
from typing import (
    Any,
    ClassVar,
    NotRequired,
    TypedDict,
    TypeVar,
    Union,
    get_args,
    get_origin,
    get_type_hints,
    is_typeddict,
)

from datavine.errors import DatavineError

PROTOCOL = 7  # bumped whenever a field of BundleSpec or BundleResult changes


class ProtocolError(DatavineError):
    """A record that crossed the wire is not one this side reads (another datavine there)."""


class Status(enum.StrEnum):
    """What became of a bundle on its worker (:attr:`BundleResult.status`)."""

    OK = "ok"
    ERROR = "error"  # a task raised (its exception and traceback come back), or the child died
    MEMORY = "memory"  # over its memory cap, or killed by SIGKILL below it (``oom``)
    LOAD = "load"  # the spec could not be unpickled here (a module missing, mostly)
    INPUT = "input"  # an OSError while a file read through a shard was open: retry elsewhere
    TIME = "time"  # a task ran past its time limit and was stopped
    LOST = "lost"  # an input another bundle left on a worker did not arrive
    PROTOCOL = "protocol"  # the spec was not one this worker's datavine reads


Key = Hashable  # a dask key: passes the checks as it is (an edge, like the values)
Timing = dict[str, tuple[int, float]]  # task category -> (tasks run, seconds)


class Pickled:
    """A value as the pickle a bundle sent it back in (a :class:`BundleResult`'s
    ``values``): the manager keeps it so until the value itself is wanted (:func:`loaded`:
    a run's outputs, a result hook's values). A spec that sends it on to another bundle
    (:attr:`BundleSpec.inputs`) carries these bytes as they are, unpickled where that bundle
    runs: the manager neither unpickles nor pickles it again (a chunk's histograms in the
    scale test: ~0.2 ms of the manager's CPU each way, per bundle). Loaded once: the
    run's outputs and a result hook get the same object, as when every value was unpickled
    on arrival; a bundle it goes to gets the bytes as they came (not what a hook made of
    the object since)."""

    __slots__ = ("_value", "blob")

    def __init__(self, blob: bytes) -> None:
        self.blob = blob

    def __reduce__(self) -> tuple[Callable[[bytes], object], tuple[bytes]]:
        return pickle.loads, (self.blob,)

    def load(self) -> object:
        try:
            return self._value
        except AttributeError:
            self._value: object = pickle.loads(self.blob)
            return self._value


def loaded(value: object) -> object:
    """``value`` itself: a :class:`Pickled` one unpickled, any other as it is."""
    return value.load() if isinstance(value, Pickled) else value


class ReadRecordDict(TypedDict):
    """One input a bundle opened (:class:`datavine.io.reading.ReadRecord`, as a dict): where
    from, how many bytes, after how many failovers (``errors``: (server, error) of each)."""

    lfn: str
    server: str  # shard name, "origin", "local" or "direct"
    rack: str | None
    bytes: int
    failovers: int
    errors: tuple[tuple[str, str], ...]
    # the worker's column cache (datavine.io.column_cache), protocol 3: decoded bytes served
    # from it and decoded from the file; ``dropped``: the file's columns all left it
    cached: NotRequired[int]
    decoded: NotRequired[int]
    dropped: NotRequired[bool]
    # bytes the worker's disk served instead of the server (datavine.io.disk_cache), protocol 4
    disk: NotRequired[int]
    # of ``bytes``, those a prefetch read ahead of the bundle (worker/prefetch.py), protocol 6
    prefetched: NotRequired[int]
    # seconds the server took for the bytes not read ahead (datavine.io.source.timed),
    # protocol 7: the shards' pace (datavine.scheduler.shard_pace)
    read_s: NotRequired[float]


@dataclass(frozen=True)
class BundleSpec:
    """One bundle as the worker runs it (the call's other arguments -- memory cap, modules
    to preload, time limit -- are the library function's own)."""

    nodes: list[tuple[Key, Any]] = field(default_factory=list)  # (key, task node), in order
    inputs: dict[Key, Any] = field(default_factory=dict)  # values needed from outside, inline
    input_files: dict[Key, str] = field(default_factory=dict)  # key -> file in the sandbox
    outputs: list[Key] = field(default_factory=list)  # keys to send back, by priority
    store: dict[Key, str] = field(default_factory=dict)  # output key -> file kept on the worker
    inline_max: int = 0  # a stored output of at most this many bytes comes back inline too
    categories: dict[Key, str] = field(default_factory=dict)  # key -> task category
    # a datavine.io.shards.ShardMap for datavine.io.reading, or None (this module imports
    # nothing of datavine's but its errors)
    shardmap: object = None
    limits: dict[Key, float] = field(default_factory=dict)  # key -> time limit (seconds)
    # shards this copy reads around (their next in line serves it): a backup copy of a
    # straggler does not wait on the shard its first copy may be slow on
    avoid: tuple[str, ...] = ()
    # the worker's column cache (datavine.io.column_cache), protocol 3: its bound for this
    # bundle (MB, a share of the bundle's cap; 0: keep nothing) and the cluster's cache
    # epoch (a newer one empties it: cluster.drop_caches())
    cache_mb: float = 0.0
    cache_epoch: int = 0
    # the RSS the bundle's process may keep after it, cache included (MB; 0: no bound): a
    # capped child idling above its share of the next cap would be replaced, cache and all
    cache_rss_mb: float = 0.0
    # the bound on the worker's disk cache of input bytes (MB; 0: off), protocol 4
    # (datavine.io.disk_cache: RunConfig.input_cache_mb)
    input_cache_mb: float = 0.0
    # the bound on what the worker reads ahead for its next bundle while this one computes
    # (MB; 0: off), protocol 6 (datavine.worker.prefetch: RunConfig.prefetch_mb)
    prefetch_mb: float = 0.0

    what: ClassVar[str] = "bundle spec"

    @property
    def keys(self) -> list[Key]:
        return [key for key, _ in self.nodes]

    def encode(self) -> dict[str, object]:
        return _encode(self)

    @classmethod
    def decode(cls, data: object, sender: str = "the manager") -> BundleSpec:
        """The spec in ``data`` (as :meth:`encode` made it), checked; ProtocolError names
        the field at fault and ``sender``."""
        return _decode(cls, data, f"{cls.what} from {sender}")


@dataclass(frozen=True)
class BundleResult:
    """What a worker reports of one bundle. Every status fills ``status`` and the stamp
    (``worker``, ``rack``, ``host``, ``pid``, ``wall_s``, ``peak_mb``); the rest depends on
    it: ``OK`` the outputs (inline ``values``, the sizes of those ``stored`` in temp files)
    and ``timing``; ``ERROR`` the task at fault (``key``), its pickled ``exception``,
    ``message`` and ``traceback``; ``MEMORY`` the cap and peak (``oom``: SIGKILLed below
    the cap); ``INPUT`` the shard that failed (``server``); ``TIME`` the task and its
    ``limit_s``; ``LOST`` the input that did not arrive (``key``)."""

    status: Status
    values: dict[Key, bytes] = field(default_factory=dict)  # outputs sent back, pickled
    stored: dict[Key, int] = field(default_factory=dict)  # outputs left in temp files: bytes
    timing: Timing = field(default_factory=dict)
    reads: list[ReadRecordDict] = field(default_factory=list)
    key: Key | None = None  # the task at fault (None: the bundle as a whole)
    message: str = ""
    traceback: str = ""
    exception: bytes | None = None  # the task's exception, pickled (None: not picklable)
    os_error: bool = False  # the exception was an input error (an OSError reading a file)
    server: str | None = None  # INPUT: the shard that failed under the read
    limit_s: float | None = None  # TIME: the limit the task ran past
    peak_mb: float = 0.0  # the bundle's memory peak
    # the column cache its process held when it started (MB), a part of ``peak_mb`` that is
    # not the bundle's own: what the memory policy learns leaves it out (scheduler/memory.py)
    cache_mb: float = 0.0
    cap_mb: float | None = None  # the cap it ran under (None: uncapped)
    oom: bool = False  # MEMORY: killed by SIGKILL below its cap (an out-of-memory killer)
    crashed: bool = False  # ERROR: the bundle's process died (a signal), no task raised
    worker: str | None = None  # the worker's name (DATAVINE_WORKER_ID), if it has one
    rack: str | None = None
    host: str = ""
    pid: int = 0  # the library's process
    wall_s: float = 0.0  # the call's time in the library

    what: ClassVar[str] = "result"

    @property
    def ok(self) -> bool:
        return self.status is Status.OK

    def encode(self) -> dict[str, object]:
        return _encode(self)

    @classmethod
    def decode(cls, data: object, worker: str | None = None) -> BundleResult:
        """The result in ``data`` (as :meth:`encode` made it), checked; ProtocolError names
        the field at fault and the worker (the name it gives, else ``worker``: its address)."""
        name = data.get("worker") if isinstance(data, Mapping) else None
        sender = f"worker {name if isinstance(name, str) and name else worker or '?'}"
        return _decode(cls, data, f"{cls.what} from {sender}")


Record = TypeVar("Record", BundleSpec, BundleResult)


def _encode(record: BundleSpec | BundleResult) -> dict[str, object]:
    out: dict[str, object] = {"protocol": PROTOCOL}
    for name, _, _, _ in _plan(type(record))[1]:
        value = getattr(record, name)
        out[name] = str(value) if isinstance(value, enum.Enum) else value
    return out


def _decode(cls: type[Record], data: object, what: str) -> Record:
    """The record of type ``cls`` in ``data``, checked (see the module docstring) in one pass
    over precomputed checks; what is wrong is named by :func:`_refuse`."""
    names, fields = _plan(cls)
    if not (isinstance(data, Mapping) and data.get("protocol") == PROTOCOL
            and data.keys() == names):
        _refuse(cls, data, what)
    assert isinstance(data, Mapping)  # _refuse raised otherwise
    values: dict[str, Any] = {}  # the fields' values, checked: cls(**values) takes them
    for name, convert, check, plain in fields:
        value = data[name]
        if type(value) in plain:  # a scalar of its type, or None where allowed: no call
            pass
        elif convert is not None:
            try:
                value = convert(value)
            except ValueError:
                known = ", ".join(str(m.value) for m in convert)
                raise ProtocolError(f"{what}: field {name!r} is {value!r}, not one of {known} "
                                    f"(protocol {PROTOCOL})") from None
        elif not check(value):
            raise ProtocolError(f"{what}: field {name!r} is {_shown(value)}, not "
                                f"{_type_name(_hints(cls)[name])} (protocol {PROTOCOL})")
        values[name] = value
    # every field is there, checked: set them as the dataclass's __init__ would, without its
    # per-field object.__setattr__ (half of a result's decoding, for every bundle)
    record = object.__new__(cls)
    record.__dict__.update(values)
    return record


def _refuse(cls: type, data: object, what: str) -> None:
    """Raise ProtocolError naming why ``data`` is not a record of ``cls`` as this side
    reads it: not a mapping, no or another protocol version, a field unknown or missing."""
    if not isinstance(data, Mapping):
        raise ProtocolError(f"{what} is a {type(data).__name__}, not a record of protocol "
                            f"{PROTOCOL}")
    if "protocol" not in data:
        raise ProtocolError(f"{what} names no protocol version (this side speaks protocol "
                            f"{PROTOCOL}): install the same datavine on the workers and the "
                            "manager")
    version = data["protocol"]
    if version != PROTOCOL:
        raise ProtocolError(f"{what} speaks protocol {version!r}, this side protocol "
                            f"{PROTOCOL}: install the same datavine on the workers and the "
                            "manager")
    hints = _hints(cls)
    for name in data:
        if name != "protocol" and name not in hints:
            raise ProtocolError(f"{what} has unknown field {name!r} (protocol {PROTOCOL})")
    for name in hints:
        if name not in data:
            raise ProtocolError(f"{what} lacks field {name!r} (protocol {PROTOCOL})")


_HINTS: dict[type, dict[str, object]] = {}
# per field: its name, the enum that converts it (None: not an enum), its type's check, and
# the types a value needs no check for (:func:`_plain`)
_Field = tuple[str, type[enum.Enum] | None, "Check", frozenset[type]]


_PLANS: dict[type, tuple[frozenset[str], tuple[_Field, ...]]] = {}


def _plan(cls: type) -> tuple[frozenset[str], tuple[_Field, ...]]:
    """The keys of an encoded record of ``cls`` and how each field is checked (built once:
    a result is decoded for every bundle)."""
    if cls not in _PLANS:
        fields: list[_Field] = []
        for name, hint in _hints(cls).items():
            if isinstance(hint, type) and issubclass(hint, enum.Enum):
                fields.append((name, hint, _anything, frozenset()))
            else:
                fields.append((name, None, _checker(hint), _plain(hint)))
        _PLANS[cls] = (frozenset(["protocol", *(name for name, _, _, _ in fields)]),
                       tuple(fields))
    return _PLANS[cls]


_SCALARS: dict[object, frozenset[type]] = {
    str: frozenset({str}), int: frozenset({int}), float: frozenset({float, int}),
    bool: frozenset({bool}), bytes: frozenset({bytes}), type(None): frozenset({type(None)})}


def _plain(hint: object) -> frozenset[type]:
    """The exact types whose values fit ``hint`` with no further look: its scalars (an int
    for a float; a bool is its own type, so it never passes for an int), and None where it
    is allowed. A container always goes through its check. Pure."""
    if get_origin(hint) in (Union, types.UnionType):
        return frozenset().union(*(_plain(arg) for arg in get_args(hint)))
    return _SCALARS.get(hint, frozenset())


def _hints(cls: type) -> dict[str, object]:
    """The record's fields and their types (resolved once)."""
    if cls not in _HINTS:
        resolved = get_type_hints(cls)
        _HINTS[cls] = {f.name: resolved[f.name] for f in dataclasses.fields(cls)}
    return _HINTS[cls]


def _fits(value: object, hint: object) -> bool:
    """Does ``value`` have type ``hint``? Containers are checked element by element, down
    to ``Any`` and :data:`Key`; an int passes for a float, a bool for neither; a TypedDict is
    a dict with str keys."""
    return _checker(hint)(value)


Check = Callable[[object], bool]


def _anything(value: object) -> bool:
    return True


@functools.cache
def _checker(hint: object) -> Check:
    """The test of :func:`_fits` for ``hint``, built once per type: a result is checked
    for every bundle, and reading the type's structure each time was most of that cost."""
    return _build_checker(hint)


def _build_checker(hint: object) -> Check:
    if hint is Any or hint is Key:
        return lambda value: True
    if hint is None or hint is type(None):
        return lambda value: value is None
    origin, args = get_origin(hint), get_args(hint)
    if origin in (Union, types.UnionType):
        if type(None) in args:  # an optional: None, else the rest
            rest = _checker(Union[tuple(a for a in args if a is not type(None))])  # noqa: UP007
            return lambda value: value is None or rest(value)
        options = tuple(_checker(arg) for arg in args)
        return lambda value: any(check(value) for check in options)
    if hint is float:
        return lambda value: isinstance(value, (int, float)) and not isinstance(value, bool)
    if hint is int:
        return lambda value: isinstance(value, int) and not isinstance(value, bool)
    if is_typeddict(hint):
        return lambda value: isinstance(value, dict) and all(isinstance(k, str) for k in value)
    if origin is None:
        if not isinstance(hint, type):
            return lambda value: False
        kind = hint
        return lambda value: isinstance(value, kind)
    if origin is dict:
        key_ok, value_ok = _checker(args[0]), _checker(args[1])
        return lambda value: isinstance(value, dict) and all(
            key_ok(k) and value_ok(v) for k, v in value.items())
    if origin is list:
        item_ok = _checker(args[0])
        return lambda value: isinstance(value, list) and all(item_ok(v) for v in value)
    if origin is tuple:
        if len(args) == 2 and args[1] is Ellipsis:
            item_ok = _checker(args[0])
            return lambda value: isinstance(value, tuple) and all(item_ok(v) for v in value)
        each = tuple(_checker(arg) for arg in args)
        return lambda value: (isinstance(value, tuple) and len(value) == len(each)
                              and all(ok(v) for ok, v in zip(each, value, strict=True)))
    if isinstance(origin, type):
        container = origin
        return lambda value: isinstance(value, container)
    return lambda value: False


def _type_name(hint: object) -> str:
    if isinstance(hint, type) and not get_args(hint):
        return hint.__name__
    return str(hint).replace("typing.", "")


def _shown(value: object) -> str:
    text = repr(value)
    return f"{type(value).__name__} {text if len(text) <= 60 else text[:57] + '...'}"
