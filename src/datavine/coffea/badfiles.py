"""Which exceptions mean "this file is bad": the pure policy behind ``skipbadfiles``.

coffea's ``Runner(skipbadfiles=True)`` skips a file when an ``OSError`` is found on the
exception's ``__cause__`` chain. At scale that misses failures (coffea#1382): XRootD errors
reach the caller wrapped by layers that keep the ``OSError`` only as ``__context__`` (an
exception raised while handling another), or re-raised as a plain ``Exception`` that only
quotes the client's message ("[ERROR] Operation expired", "Socket timeout", ...); and
a corrupt file fails with uproot's ``DeserializationError`` or a decompression error, which
is no ``OSError`` at all.

:func:`exception_chain` walks ``__cause__``, ``__context__`` and exception groups;
:func:`classify` says whether an exception is a bad-file error under a ``skipbadfiles``
setting and whether retrying it can help. No I/O: this module is imported on workers.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass

from datavine.io.reading import raised_in_xrootd_client

# Messages of the XRootD client (as uproot and fsspec-xrootd quote them) that mark a failed
# file access, whatever exception type carries them.
XROOTD_MARKERS = (
    "XRootD error",
    "[ERROR]",
    "[FATAL]",
    "Operation expired",
    "Socket timeout",
    "Invalid redirect URL",
    "Server responded with an error",
    "File did not vector_read properly",
    "Unable to readv",
    "No route to host",
    "Connection refused",
    "Auth failed",
)

# Exception types raised by unreadable or corrupt files, as (top-level module, type name):
# matched by name, so that this module needs neither uproot nor the compression libraries.
CORRUPT_TYPES = frozenset({
    ("uproot", "DeserializationError"),  # a TKey, TBasket or streamer that does not parse
    ("zlib", "error"),
    ("_lzma", "LZMAError"),
    ("lzma", "LZMAError"),
    ("cramjam", "DecompressionError"),  # uproot's ZSTD and LZ4
    ("zstandard", "ZstdError"),
    ("lz4", "LZ4FrameError"),
})
# Messages of unreadable files raised as ValueError/KeyError by uproot.
CORRUPT_MARKERS = (
    "not a ROOT file",
    "expected Chunk of length",
    "outside expected range",
    "file may be truncated",
    "Error -3 while decompressing",
)

# Errors that fail the same way on every attempt and every worker: a file that is not
# there or may not be read (as the OS or an XRootD server says it), and code that does not
# load. Retrying them only makes the user wait.
PERMANENT_TYPES: dict[type[BaseException], str] = {
    FileNotFoundError: "missing",
    IsADirectoryError: "missing",
    NotADirectoryError: "missing",
    PermissionError: "permission",
}
PERMANENT_MARKERS = (
    ("[3011]", "missing"),  # kXR_NotFound
    ("No such file or directory", "missing"),
    ("[3010]", "permission"),  # kXR_NotAuthorized
    ("Permission denied", "permission"),
)

_MAX_CHAIN = 64


@dataclass(frozen=True)
class Verdict:
    """How an item's exception is handled.

    Attributes:
        bad_file: the exception marks the file as unreadable (skip it under skipbadfiles).
        retryable: trying again may succeed (I/O, timeouts); False for corrupt data, which
            fails the same way every time.
        reason: a short name of the evidence found (``"OSError"``, ``"xrootd"``,
            ``"corrupt"``, ``"missing"``, ``"permission"``, ``"import"``, an exception type
            name, or ``""``).
    """

    bad_file: bool
    retryable: bool
    reason: str = ""

    @property
    def load_error(self) -> bool:
        """The item's code could not be loaded here (a module missing on the worker)."""
        return self.reason == "import"


def exception_chain(exc: BaseException) -> Iterator[BaseException]:
    """``exc`` and every exception linked to it (cause, context, group members), each once."""
    seen: set[int] = set()
    stack: list[BaseException] = [exc]
    while stack and len(seen) < _MAX_CHAIN:
        current = stack.pop()
        if id(current) in seen:
            continue
        seen.add(id(current))
        yield current
        linked: list[object] = [current.__cause__, current.__context__]
        linked.extend(getattr(current, "exceptions", None) or ())
        stack.extend(e for e in reversed(linked) if isinstance(e, BaseException))


def is_xrootd_error(exc: BaseException) -> bool:
    """An exception whose message is an XRootD client error, or one raised from inside the
    XRootD client (``ValueError: I/O operation on closed file`` from a handle that
    fsspec-xrootd cached before its server went away)."""
    text = _message(exc)
    return any(marker in text for marker in XROOTD_MARKERS) or raised_in_xrootd_client(exc)


def is_corrupt_file_error(exc: BaseException) -> bool:
    """An exception raised by data that does not parse or decompress."""
    kind = type(exc)
    if (kind.__module__.split(".")[0], kind.__name__) in CORRUPT_TYPES:
        return True
    text = _message(exc)
    return any(marker in text for marker in CORRUPT_MARKERS)


def permanent_reason(exc: BaseException) -> str:
    """``"missing"`` or ``"permission"`` when ``exc`` says the file is not there or may not
    be read (by type, or in an XRootD server's words); else ``""``."""
    for kind, reason in PERMANENT_TYPES.items():
        if isinstance(exc, kind):
            return reason
    if isinstance(exc, OSError) or is_xrootd_error(exc):
        text = _message(exc)
        for marker, reason in PERMANENT_MARKERS:
            if marker in text:
                return reason
    return ""


def missing_module(exc: BaseException) -> str | None:
    """The module an import error in ``exc``'s chain could not find (``""`` when it does
    not say), or None when the chain holds no import error."""
    for e in exception_chain(exc):
        if isinstance(e, ImportError):
            return e.name or ""
        if isinstance(e, AttributeError) and "Can't get attribute" in _message(e):
            return ""  # pickle: the class is not (or no longer) in the module on this worker
    return None


def classify(exc: BaseException,
             skipbadfiles: bool | tuple[type[BaseException], ...]) -> Verdict:
    """Whether ``exc`` is a bad-file error under ``skipbadfiles`` (coffea's setting).

    ``True``: any ``OSError`` in the chain, an XRootD error message anywhere in it, or a
    corrupt file. A missing or unreadable file and corrupt data are not ``retryable``;
    an import error is never a bad file and never retryable (``Verdict.load_error``).
    A tuple of types: those types anywhere in the chain (and, when it holds
    ``OSError``, XRootD messages too). ``False``: never a bad file; ``retryable`` still says
    whether a retry may help.
    """
    chain = list(exception_chain(exc))
    permanent = next((r for r in map(permanent_reason, chain) if r), "")
    if missing_module(exc) is not None:
        return Verdict(False, False, "import")
    if permanent:
        evidence = Verdict(True, False, permanent)
    elif any(is_corrupt_file_error(e) for e in chain):
        evidence = Verdict(True, False, "corrupt")
    elif any(is_xrootd_error(e) for e in chain):
        evidence = Verdict(True, True, "xrootd")
    elif any(isinstance(e, OSError) for e in chain):
        evidence = Verdict(True, True, "OSError")
    else:
        evidence = Verdict(False, True, "")
    if skipbadfiles is True:
        return evidence
    if not skipbadfiles:
        return Verdict(False, evidence.retryable, evidence.reason)
    for e in chain:
        if isinstance(e, skipbadfiles):
            return Verdict(True, evidence.retryable, type(e).__name__)
    xrootd = evidence.reason == "xrootd" or (
        evidence.reason in ("missing", "permission") and any(map(is_xrootd_error, chain)))
    if xrootd and any(issubclass(OSError, t) for t in skipbadfiles):
        return evidence
    return Verdict(False, evidence.retryable, evidence.reason)


def _message(exc: BaseException) -> str:
    try:
        return str(exc)
    except Exception:
        return ""
