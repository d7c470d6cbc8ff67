"""What a :class:`~datavine.io.source.base.Source` opens with: an uproot file or an uproot source.

Two openers, one per kind of handle a caller wants, each choosing uproot's source class (the
code that reads byte ranges and counts them) by the URL's scheme:

- :func:`open_file`: ``uproot.open`` (task code: :func:`datavine.open_input`). ``root://``
  URLs get uproot's own ``XRootDSource``: uproot's default goes through fsspec-xrootd, which
  keeps read-only file handles open for 30 s after the file is closed
  (``filehandle_cache_ttl``); the XCache then keeps the file attached, its statistics
  (``.cinfo``) are not written, and handles to a shard that has died linger. Local paths
  get a memory map (``MemmapSource``: ~30% faster reads than uproot's default fsspec).
- :func:`make_source`: the source itself, for an uproot ``handler``
  (:class:`datavine.coffea.DatavineSource`). Local paths get uproot's default
  (``FSSpecSource``), not a memory map: coffea skips bad files, and a truncated file under a
  memory map kills the process with SIGSEGV/SIGBUS instead of raising an error that names
  it.

Pass ``handler=`` to :func:`open_file` to choose otherwise. Both take ``wrap``: a function
that puts a source in front of the one chosen (the worker's disk,
:class:`datavine.io.source.disk.DiskCachedSource`), applied to the source uproot reads
through. uproot is imported on first use.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING, cast

if TYPE_CHECKING:  # uproot ships no types: to mypy these are Any
    import uproot

# an uproot source -> the uproot source to read through
Wrap = Callable[["uproot.source.chunk.Source"], "uproot.source.chunk.Source"]

XROOTD_SCHEMES = ("root://", "roots://", "xroot://")


def is_xrootd(url: str) -> bool:
    return url.startswith(XROOTD_SCHEMES)


def open_file(url: str, wrap: Wrap | None = None, **options: object) -> uproot.ReadOnlyDirectory:
    """``uproot.open(url, **options)``: ``XRootDSource`` for ``root://``, a memory map for a
    local path, unless ``handler`` is given; its source passed through ``wrap``, if any."""
    import uproot

    if is_xrootd(url):
        options.setdefault("handler", uproot.XRootDSource)
    elif "://" not in url:
        options.setdefault("handler", uproot.source.file.MemmapSource)
    if wrap is not None:
        handler = options.get("handler") or uproot.FSSpecSource
        options["handler"] = wrapped_handler(cast("type[uproot.source.chunk.Source]", handler),
                                             wrap)
    return uproot.open(url, **options)


def wrapped_handler(handler: type[uproot.source.chunk.Source],
                    wrap: Wrap) -> type[uproot.source.chunk.Source]:
    """An uproot ``handler`` (a Source class, as uproot wants) whose construction returns
    ``wrap(handler(path, **options))``."""
    import uproot

    class Wrapped(uproot.source.chunk.Source):
        def __new__(cls, file_path: str, **options: object) -> uproot.source.chunk.Source:
            return wrap(handler(file_path, **options))

    return Wrapped


def source_class(url: str) -> type[uproot.source.chunk.Source]:
    """uproot's source class for ``url`` in :func:`make_source`: XRootD's own for
    ``root://``, else uproot's default (fsspec)."""
    import uproot

    return uproot.XRootDSource if is_xrootd(url) else uproot.FSSpecSource


def make_source(url: str, wrap: Wrap | None = None,
                **options: object) -> uproot.source.chunk.Source:
    """The uproot source reading ``url`` (opened: an XRootD source connects here), passed
    through ``wrap``, if any."""
    source = source_class(url)(url, **options)
    return wrap(source) if wrap is not None else source
