"""Worker side: the file in which a bundle leaves its large outputs on its worker.

The values one bundle keeps for other bundles (:mod:`datavine.scheduler.intermediates`) go to
one file in the call's sandbox, which TaskVine keeps in the worker's cache and hands to the
calls that consume them, on that worker or on its peers. The file is written and read at
memory speed:

* each value is pickled once, with protocol 5 and its large buffers *out of band* (a numpy
  array's memory is not copied into the pickle: the file gets the array's bytes straight
  from it), not cloudpickled and then pickled again inside a dict;
* a consumer maps the file (``mmap``, copy-on-write) and unpickles a value with its buffers
  taken from the mapping: an array comes back as a view of the page cache, not a copy, and
  stays writable (a task may change its inputs in place: the change stays in its process).

Measured here on 32 MiB (two 16 MiB arrays, benchmarks/README.md "traffic"): cloudpickle
per value + pickle of the dict + write ~30 ms, ``pickle.load`` + ``cloudpickle.loads`` in a
fresh process ~60 ms; this format ~5 ms to write and ~1 ms to map and sum.

Layout: ``MAGIC``, then per value its pickle stream and its buffers (each buffer at a
64-byte boundary, so numpy's alignment holds in the mapping), then the index (a pickle:
key -> (offset, length of the stream, ((offset, length) of each buffer, ...))), its length
and ``MAGIC`` again. The index at the end lets the writer stream every value out once.

Imported on workers (and by the manager to read a file it fetched): keep its imports light.
"""

from __future__ import annotations

import mmap
import os
import pickle
import struct
from collections.abc import Collection, Hashable, Iterator, Mapping
from dataclasses import dataclass, field

from datavine.worker import payload

Key = Hashable
MAGIC = b"DVVALS1\n"
ALIGN = 64
_TRAILER = struct.Struct("<Q8s")  # the index's length, MAGIC
_PAD = bytes(ALIGN)

Index = dict[Key, tuple[int, int, tuple[tuple[int, int], ...]]]


class ValueFileError(ValueError):
    """A file that is not a whole value file (cut short, or of another format)."""


@dataclass
class Pickled:
    """One value pickled with its large buffers out of band (nothing copied yet)."""

    stream: bytes
    buffers: list[pickle.PickleBuffer] = field(default_factory=list)

    @property
    def nbytes(self) -> int:
        return len(self.stream) + sum(memoryview(b).nbytes for b in self.buffers)


def pickled(value: object) -> Pickled:
    """Pickle ``value`` (:func:`datavine.worker.payload.dumps`), its buffers left out of
    band (in band when one is not contiguous: it could not be written as it is)."""
    buffers: list[pickle.PickleBuffer] = []
    stream = payload.dumps(value, buffer_callback=buffers.append)
    if not all(memoryview(b).contiguous for b in buffers):
        return Pickled(payload.dumps(value))
    return Pickled(stream, buffers)


def _pieces(values: Mapping[Key, Pickled]) -> Iterator[bytes | memoryview]:
    """The file's bytes, piece by piece (the buffers' pieces are the values' own memory)."""
    index: Index = {}
    at = len(MAGIC)
    yield MAGIC
    for key, value in values.items():
        index_of_buffers = []
        stream_at = at
        yield value.stream
        at += len(value.stream)
        for buffer in value.buffers:
            raw = buffer.raw()
            pad = -at % ALIGN
            if pad:
                yield _PAD[:pad]
                at += pad
            index_of_buffers.append((at, raw.nbytes))
            yield raw
            at += raw.nbytes
        index[key] = (stream_at, len(value.stream), tuple(index_of_buffers))
    blob = pickle.dumps(index, protocol=pickle.HIGHEST_PROTOCOL)
    yield blob
    yield _TRAILER.pack(len(blob), MAGIC)


def write_values(path: str, values: Mapping[Key, Pickled]) -> None:
    """Write ``values`` (key -> :func:`pickled`) to a new file at ``path`` (an empty mapping
    makes a valid file that holds nothing)."""
    with open(path, "wb") as f:
        for piece in _pieces(values):
            f.write(piece)


class ValueFile:
    """A value file's mapping, read value by value (``load``); the mapping lives as long as
    the values taken from it."""

    def __init__(self, data: mmap.mmap | bytearray | bytes, name: str = "value file") -> None:
        self.name = name
        self._view = memoryview(data)
        size = self._view.nbytes
        if size < len(MAGIC) + _TRAILER.size or bytes(self._view[:len(MAGIC)]) != MAGIC:
            raise ValueFileError(f"{name} is not a datavine value file ({size} bytes)")
        length, magic = _TRAILER.unpack(self._view[size - _TRAILER.size:])
        start = size - _TRAILER.size - length
        if magic != MAGIC or start < len(MAGIC):
            raise ValueFileError(f"{name} is cut short ({size} bytes)")
        try:
            index = pickle.loads(self._view[start:size - _TRAILER.size])
        except Exception as exc:  # the trailer of another file, or none
            raise ValueFileError(f"{name} is cut short ({size} bytes): {exc!r}") from None
        if not isinstance(index, dict):
            raise ValueFileError(f"{name} has no index ({size} bytes)")
        self.index: Index = index
        self._end = start

    @classmethod
    def open(cls, path: str) -> ValueFile:
        """Map the file at ``path`` copy-on-write: values read from it are views of the page
        cache until a task writes to them."""
        fd = os.open(path, os.O_RDONLY)
        try:
            if os.fstat(fd).st_size == 0:
                raise ValueFileError(f"{path} is empty")
            data = mmap.mmap(fd, 0, access=mmap.ACCESS_COPY)
        finally:
            os.close(fd)
        return cls(data, path)

    def keys(self) -> Collection[Key]:
        return self.index.keys()

    def load(self, key: Key) -> object:
        """The value of ``key`` (KeyError when the file does not hold it)."""
        at, length, buffers = self.index[key]
        for offset, nbytes in ((at, length), *buffers):
            if offset + nbytes > self._end:
                raise ValueFileError(f"{self.name} is cut short at {key!r}")
        return pickle.loads(self._view[at:at + length],
                            buffers=[self._view[o:o + n] for o, n in buffers])


def loads_values(data: bytes, keys: Collection[Key] | None = None) -> dict[Key, object]:
    """The values in a value file's bytes (all, or those of ``keys`` it holds), as writable
    copies: the manager's way to read a file it fetched."""
    opened = ValueFile(bytearray(data))
    return {k: opened.load(k) for k in opened.index if keys is None or k in keys}
