"""A bundle's call on the wire: its payload (the bytes of its
:class:`datavine.protocol.BundleSpec`, with the functions and classes a run sends again and
again pickled once per run) and its reply (the encoded :class:`datavine.protocol.BundleResult`
as text).

The manager pickles every bundle of a run with one :class:`BundleEncoder`. Each function
and class it meets (the tasks' callables, a processor's class, ...) is pickled with
cloudpickle the first time only, and every payload that holds it carries that pickle as it
is, named by the run and a number (:func:`shared`): pickling a function by value was most of
the manager's cost of encoding a bundle (~20-60 us of ~30-70; benchmarks/README.md, workers).
On the worker, :func:`shared` unpickles each of them once per run and library process and
hands the same object to the later bundles of the run, as an imported module's function is
one object. A payload is a plain pickle (``pickle.loads`` reads it; :func:`decode` is that),
so a payload pickled whole with cloudpickle, as before, reads the same.

Scope: a function is pickled when the run first sends it, so a function changed between two
runs (its code, or a global it reads by value) is sent again in the second; the worker's
objects are named by the run, so a second run never finds the first one's. Functions that
reach each other through their globals are pickled apart (each with what it needs).

The reply (:func:`reply_bytes`, :func:`read_reply`): the library writes a call's result as
the call's standard output, which TaskVine's worker sends to the manager with its
completion message when it is at most 1 KB (:data:`INLINE_MAX`), else at the manager's
request (a round trip), so the manager fetches no result file (and the library's output
file, which poncho pickles the function's return value into, holds a mark only:
``remote.REPLIED``). A larger result's pickle goes as it is, behind a short text head that
names its length (:func:`reply_frame`): TaskVine keeps a standard output as a C string,
which ends at the first NUL byte for whoever reads it as one (the bindings do), so the
manager reads it by that length (``Internals.reply_reader``). A small one goes without NUL
bytes (:func:`escape`: NUL and 0x01 as two bytes each, ~5% more on a result's pickle),
because the worker sends what it sends inline as a C string (cut at its first NUL, the rest
of the stream read as the output): so it stays inline (base64, a third more, took a small
result over 1 KB and into the round trip). Base64 text, what an earlier datavine sent,
still reads. TaskVine keeps at most 1 GB of it (:data:`REPLY_MAX`).

Standard library and cloudpickle only: imported on workers.
"""

from __future__ import annotations

import binascii
import io
import os
import pickle
import types
from collections import OrderedDict
from collections.abc import Callable, Mapping
from typing import cast

import cloudpickle

# the objects a worker keeps, most recent last: a run sends a few dozen at most; the bound
# is there for a library that serves run after run
WORKER_KEEPS = 512
_SHARED: OrderedDict[tuple[bytes, int], object] = OrderedDict()


def shared(run: bytes, number: int, blob: bytes) -> object:
    """The object ``blob`` (its cloudpickle) pickles, loaded once per (``run``, ``number``)
    in this process (a payload's reference to a run's function or class; see the module
    docstring)."""
    key = (run, number)
    found = _SHARED.get(key)
    if found is None:
        found = cloudpickle.loads(blob)
        _SHARED[key] = found
        if len(_SHARED) > WORKER_KEEPS:
            _SHARED.popitem(last=False)
    else:
        _SHARED.move_to_end(key)
    return found


def call_arguments(sandbox: str) -> tuple[tuple[object, ...], dict[str, object]] | None:
    """(args, kwargs) of the library call waiting in ``sandbox``, from the ``infile`` that
    TaskVine put there (poncho's event: ``fn_args``, ``fn_kwargs``); None when it is gone
    (cancelled) or not such an event."""
    try:
        with open(os.path.join(sandbox, "infile"), "rb") as f:
            event = cloudpickle.load(f)
    except Exception:  # removed (cancelled), cut, or not ours to read
        return None
    if not isinstance(event, dict):
        return None
    args, kwargs = event.get("fn_args") or (), event.get("fn_kwargs") or {}
    if not isinstance(args, (tuple, list)) or not isinstance(kwargs, dict):
        return None
    return tuple(args), kwargs


def decode(payload: bytes) -> object:
    """The spec's record (a dict, as :meth:`BundleSpec.encode` made it) in ``payload``."""
    return pickle.loads(payload)


REPLY_MAX = 1 << 30  # TaskVine's manager keeps at most 1 GB of a task's standard output
INLINE_MAX = 1024  # TaskVine's worker sends at most this much with its completion message
REPLY_HEAD = b"DVR1 "  # a reply's head: this, the pickle's length in decimal, a newline
REPLY_HEAD_MAX = 24  # bytes enough for any head (no NUL in it)
ESCAPED_HEAD = b"DVE1\n"  # a small reply's head: the pickle follows, escaped
_ESC, _ESC_NUL, _ESC_ESC = b"\x01", b"\x01\x02", b"\x01\x03"


def dumps(value: object,
          buffer_callback: Callable[[pickle.PickleBuffer], object] | None = None) -> bytes:
    """``value`` pickled (protocol 5): by pickle's C pickler when it can (a result's record,
    a chunk's histograms: ~2.5x faster), else by cloudpickle (what pickle names by reference
    but this process cannot import: a class or function that came by value, a lambda).
    Either reads with ``pickle.loads``."""
    try:
        return pickle.dumps(value, protocol=5, buffer_callback=buffer_callback)
    except Exception:
        return cast(bytes, cloudpickle.dumps(value, protocol=5,
                                             buffer_callback=buffer_callback))


def escape(data: bytes) -> bytes:
    """``data`` without NUL bytes: 0x01 as 0x01 0x03, then NUL as 0x01 0x02 (pure)."""
    return data.replace(_ESC, _ESC_ESC).replace(b"\0", _ESC_NUL)


def unescape(data: bytes) -> bytes:
    """:func:`escape` undone (pure)."""
    return data.replace(_ESC_NUL, b"\0").replace(_ESC_ESC, _ESC)


def reply_bytes(record: Mapping[str, object]) -> bytes:
    """A call's encoded result as its standard output carries it (see the module
    docstring): its pickle behind a head naming its length, or escaped when that fits in
    :data:`INLINE_MAX` bytes."""
    blob = dumps(record)
    framed = b"%s%d\n%s" % (REPLY_HEAD, len(blob), blob)
    return framed if len(framed) > INLINE_MAX else ESCAPED_HEAD + escape(blob)


def reply_frame(head: bytes) -> tuple[int, int] | None:
    """(length of the head, length of the pickle after it) that the first bytes of a reply
    (``head``, up to :data:`REPLY_HEAD_MAX`) name; None when they are no framed reply's
    head (an escaped reply, base64 text: both end at their first NUL)."""
    if not head.startswith(REPLY_HEAD):
        return None
    end = head.find(b"\n", len(REPLY_HEAD))
    digits = head[len(REPLY_HEAD):end]
    if end < 0 or not digits.isdigit() or int(digits) > REPLY_MAX:
        return None
    return end + 1, int(digits)


def read_reply(data: bytes | str | None) -> object:
    """The encoded result in a call's standard output (:func:`reply_bytes`'s, or an earlier
    datavine's base64 text); ValueError when there is none or it is cut."""
    if not data:
        raise ValueError("it sent an empty reply")
    raw = data.encode("utf-8", "surrogateescape") if isinstance(data, str) else data
    frame = reply_frame(raw[:REPLY_HEAD_MAX])
    try:
        if frame is not None:
            if len(raw) != frame[0] + frame[1]:
                raise ValueError(f"its reply of {len(raw)} bytes names "
                                 f"{frame[0] + frame[1]} bytes")
            return pickle.loads(memoryview(raw)[frame[0]:])
        if raw.startswith(ESCAPED_HEAD):
            return pickle.loads(unescape(raw[len(ESCAPED_HEAD):]))
        return pickle.loads(binascii.a2b_base64(raw))  # an earlier datavine's
    except (binascii.Error, pickle.UnpicklingError, EOFError) as exc:
        raise ValueError(f"its reply of {len(raw)} bytes does not read: {exc}") from None


class _Pickler(cloudpickle.Pickler):  # type: ignore[misc]  # cloudpickle ships no types
    """cloudpickle's pickler, with functions and classes replaced by their run's pickles."""

    def __init__(self, file: io.BytesIO, encoder: BundleEncoder) -> None:
        super().__init__(file, protocol=pickle.HIGHEST_PROTOCOL)
        self._encoder = encoder

    def reducer_override(self, obj: object) -> object:
        # called for every object but the builtin containers and scalars (a bundle's task
        # nodes, their arguments): cloudpickle's own reduces only functions and classes,
        # so anything else is NotImplemented at once, one Python call fewer each
        if not isinstance(obj, (types.FunctionType, type)):
            return NotImplemented
        if obj is shared:
            return super().reducer_override(obj)
        return self._encoder.reduce(obj)


class BundleEncoder:
    """Pickles the bundles of one run (see the module docstring): make one per run."""

    def __init__(self) -> None:
        self.run = os.urandom(8)  # names this run's objects on the workers
        # id -> (the object, kept so its id is not reused, its number, its pickle)
        self._known: dict[int, tuple[object, int, bytes]] = {}
        # one pickler for the run, its memo cleared between bundles: making one per bundle
        # (cloudpickle's dispatch setup, a buffer) was a third of a payload's cost
        self._out = io.BytesIO()
        self._pickler = _Pickler(self._out, self)

    def reduce(self, obj: object) -> tuple[object, tuple[bytes, int, bytes]]:
        """The reduction that stands for ``obj`` in a payload: :func:`shared` of its
        pickle, made the first time this run meets it."""
        entry = self._known.get(id(obj))
        if entry is None or entry[0] is not obj:
            entry = (obj, len(self._known), cloudpickle.dumps(obj, pickle.HIGHEST_PROTOCOL))
            self._known[id(obj)] = entry
        return shared, (self.run, entry[1], entry[2])

    def dumps(self, record: Mapping[str, object]) -> bytes:
        """The payload of a bundle's encoded spec (``BundleSpec.encode()``): a pickle of its
        own (nothing refers to an earlier bundle's)."""
        out, pickler = self._out, self._pickler
        out.seek(0)
        out.truncate()
        pickler.clear_memo()
        pickler.globals_ref = {}  # cloudpickle's, for functions pickled by value (none here)
        pickler.dump(record)  # each dump starts a fresh frame: one cut short leaves nothing
        return out.getvalue()

    @property
    def known(self) -> int:
        """How many functions and classes this run pickled so far."""
        return len(self._known)
