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

The reply (:func:`reply_text`, :func:`read_reply`): the library writes a call's result as the
call's standard output, which TaskVine's worker sends to the manager with its completion
message (inline up to 1 KB, else at the manager's request), so the manager fetches no result
file. TaskVine keeps a standard output as a C string: the pickle goes as base64 (no NUL
byte), and TaskVine keeps at most 1 GB of it (:data:`REPLY_MAX`).

Standard library and cloudpickle only: imported on workers.
"""

from __future__ import annotations

import binascii
import io
import os
import pickle
import types
from collections import OrderedDict
from collections.abc import Mapping

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


def decode(payload: bytes) -> object:
    """The spec's record (a dict, as :meth:`BundleSpec.encode` made it) in ``payload``."""
    return pickle.loads(payload)


REPLY_MAX = 1 << 30  # TaskVine's manager keeps at most 1 GB of a task's standard output


def reply_text(record: Mapping[str, object]) -> bytes:
    """A call's encoded result as the text its standard output carries (base64 of its
    pickle: plain data, so pickle's C pickler)."""
    try:
        blob = pickle.dumps(record, protocol=pickle.HIGHEST_PROTOCOL)
    except Exception:  # a key pickle cannot name (dask keys are plain, but)
        blob = cloudpickle.dumps(record, protocol=pickle.HIGHEST_PROTOCOL)
    return binascii.b2a_base64(blob, newline=False)


def read_reply(text: str | None) -> object:
    """The encoded result in a call's standard output (:func:`reply_text`'s); ValueError
    when there is none or it is cut."""
    if not text:
        raise ValueError("it sent an empty reply")
    try:
        return pickle.loads(binascii.a2b_base64(text))
    except (binascii.Error, pickle.UnpicklingError, EOFError) as exc:
        raise ValueError(f"its reply of {len(text)} bytes does not read: {exc}") from None


class _Pickler(cloudpickle.Pickler):  # type: ignore[misc]  # cloudpickle ships no types
    """cloudpickle's pickler, with functions and classes replaced by their run's pickles."""

    def __init__(self, file: io.BytesIO, encoder: BundleEncoder) -> None:
        super().__init__(file, protocol=pickle.HIGHEST_PROTOCOL)
        self._encoder = encoder

    def reducer_override(self, obj: object) -> object:
        if isinstance(obj, (types.FunctionType, type)) and obj is not shared:
            return self._encoder.reduce(obj)
        return super().reducer_override(obj)


class BundleEncoder:
    """Pickles the bundles of one run (see the module docstring): make one per run."""

    def __init__(self) -> None:
        self.run = os.urandom(8)  # names this run's objects on the workers
        # id -> (the object, kept so its id is not reused, its number, its pickle)
        self._known: dict[int, tuple[object, int, bytes]] = {}

    def reduce(self, obj: object) -> tuple[object, tuple[bytes, int, bytes]]:
        """The reduction that stands for ``obj`` in a payload: :func:`shared` of its
        pickle, made the first time this run meets it."""
        entry = self._known.get(id(obj))
        if entry is None or entry[0] is not obj:
            entry = (obj, len(self._known), cloudpickle.dumps(obj, pickle.HIGHEST_PROTOCOL))
            self._known[id(obj)] = entry
        return shared, (self.run, entry[1], entry[2])

    def dumps(self, record: Mapping[str, object]) -> bytes:
        """The payload of a bundle's encoded spec (``BundleSpec.encode()``)."""
        out = io.BytesIO()
        _Pickler(out, self).dump(record)
        return out.getvalue()

    @property
    def known(self) -> int:
        """How many functions and classes this run pickled so far."""
        return len(self._known)
