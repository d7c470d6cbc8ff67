"""Reads overlapped with compute: the next bundle's baskets fetched while this one computes.

With datavine's TaskVine (patch 0018) the library learns of each call as it arrives in its
pipe, while the call before it still runs (poncho calls the ``vine_call_queued`` hook the
library's context returns: :func:`datavine.worker.remote.call_queued`). The library passes
the call's sandbox to the process that will run it, its capped child
(:meth:`datavine.worker.capped_child.CappedChild.hint`), where a :class:`Prefetcher` thread
reads the call's spec from its ``infile``, finds the chunks it will read
(:func:`datavine.worker.prefetch_plan.chunk_reads`), opens each file on the server the
bundle would use (its shard, with this process's shard health), and fetches the baskets of
the branches this process last read of that tree
(:mod:`datavine.io.read_profile`) for the chunk's entries, into the process's
:class:`~datavine.io.prefetch_store.PrefetchStore` (bounded: ``BundleSpec.prefetch_mb``).
When the call runs (:func:`begin`, from :func:`datavine.worker.remote.execute_payload`), a
prefetch still in flight for it is waited for (at most :data:`WAIT_S`, then abandoned), and
its ``root://`` opens take the ranges from the store
(:class:`~datavine.io.source.prefetched.PrefetchedSource`); what it left is dropped when it
ends (:func:`end`), and so is what was fetched for calls whose sandbox is gone (cancelled).

Nothing here decides what a bundle computes: a prefetch that fails, is refused by the bound,
or is abandoned leaves the bundle to read from the server, as without it. A prefetch skips a
chunk whose columns the column cache holds, local files, and bundles with the worker's disk
cache on. Imported on workers (uproot only when a file is fetched).
"""

from __future__ import annotations

import contextlib
import os
import queue
import threading
import time
from collections import OrderedDict, deque
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, cast

from datavine.io import column_cache, prefetch_store, read_profile
from datavine.io.prefetch_store import PrefetchStore
from datavine.protocol import BundleSpec
from datavine.worker import payload as payload_codec
from datavine.worker.prefetch_plan import ChunkRead, chunk_reads, tree_for

if TYPE_CHECKING:
    from datavine.io.shards import ShardMap

WAIT_S = 10.0  # a bundle waits this long at most for its prefetch still in flight
PROFILE_WAIT_S = 5.0  # a prefetch waits this long for the process's first read of a tree
STARTED_KEPT = 64  # sandboxes of calls started, remembered (a late hint is ignored)
EARLY_KEPT = 8  # hints kept from before the first bundle with read-ahead on


@dataclass
class Job:
    """The prefetch of one queued call (``owner``: its sandbox)."""

    owner: str
    cancelled: bool = False
    started: bool = False
    done: threading.Event = field(default_factory=threading.Event)
    error: str = ""


class Prefetcher:
    """Reads ahead for queued calls on one thread of this process (see the module docstring).

    ``fetch(job, store)`` does one job (tests pass their own); ``store`` is where ranges go."""

    def __init__(self, store: PrefetchStore | None = None, fetch: object = None) -> None:
        self.store = store if store is not None else prefetch_store.store()
        self._fetch = fetch if callable(fetch) else fetch_call
        self._jobs: dict[str, Job] = {}
        self._queue: queue.SimpleQueue[Job] = queue.SimpleQueue()
        self._started: OrderedDict[str, None] = OrderedDict()
        self._lock = threading.Lock()
        self._thread: threading.Thread | None = None

    # --- the library's side: a call arrived ---------------------------------------------------
    def hint(self, owner: str) -> bool:
        """Read ahead for the call whose sandbox is ``owner``; False when it has started
        already or is known."""
        with self._lock:
            if owner in self._started or owner in self._jobs:
                return False
            job = Job(owner)
            self._jobs[owner] = job
            if self._thread is None or not self._thread.is_alive():
                self._thread = threading.Thread(target=self._work, name="datavine-prefetch",
                                                daemon=True)
                self._thread.start()
        self._queue.put(job)
        return True

    # --- the bundle's side ---------------------------------------------------------------------
    def begin(self, owner: str, max_mb: float, wait_s: float = WAIT_S) -> None:
        """The call of sandbox ``owner`` starts here, with ``max_mb`` the bound on what this
        process reads ahead from now on: its prefetch in flight is waited for (at most
        ``wait_s``), one not begun is cancelled, and its opens take its ranges."""
        self.store.resize(int(max_mb * prefetch_store.MB))
        with self._lock:
            self._started[owner] = None
            while len(self._started) > STARTED_KEPT:
                self._started.popitem(last=False)
            job = self._jobs.get(owner)
            if job is not None and not job.started:
                job.cancelled = True
        if job is not None and job.started and not job.done.wait(wait_s):
            job.cancelled = True  # it hung: the bundle reads for itself; its late ranges
            # are dropped with the call's
        self.store.serving = owner

    def end(self, owner: str) -> None:
        """The call of sandbox ``owner`` ended: what it left in the store is dropped, and so
        is what was fetched for calls whose sandbox is gone (cancelled while queued)."""
        self.store.serving = None
        gone = {owner} | {o for o in self.store.owners() if not os.path.isdir(o)}
        with self._lock:
            gone |= {o for o in self._jobs if o != owner and not os.path.isdir(o)}
            for o in gone:
                job = self._jobs.pop(o, None)
                if job is not None:
                    job.cancelled = True
        for o in gone:
            self.store.drop(o)

    def close(self) -> None:
        """Cancel every job and empty the store (tests; a process that exits needs none)."""
        with self._lock:
            for job in self._jobs.values():
                job.cancelled = True
            owners = set(self._jobs)
            self._jobs.clear()
        for o in owners | self.store.owners():
            self.store.drop(o)

    def job(self, owner: str) -> Job | None:
        with self._lock:
            return self._jobs.get(owner)

    # --- the thread ------------------------------------------------------------------------------
    def _work(self) -> None:
        while True:
            job = self._queue.get()
            with self._lock:
                if job.cancelled or job.owner in self._started:
                    job.done.set()
                    continue
                job.started = True
            try:
                cast("FetchCall", self._fetch)(job, self.store)
            except Exception as exc:  # never the bundle's business: it reads for itself
                job.error = f"{type(exc).__name__}: {exc}"
            finally:
                job.done.set()
                if job.cancelled:
                    self.store.drop(job.owner)


class FetchCall:
    """The type of :func:`fetch_call` (a job, the store)."""

    def __call__(self, job: Job, store: PrefetchStore, /) -> None: ...


def fetch_call(job: Job, store: PrefetchStore) -> None:
    """Fetch what the call of ``job`` will read into ``store`` (see the module docstring)."""
    spec = read_spec(job.owner)
    if spec is None or spec.prefetch_mb <= 0 or spec.input_cache_mb > 0:
        return
    for read in chunk_reads(spec.nodes):
        if job.cancelled or store.held_bytes >= store.max_bytes:
            return
        tree = tree_for(read, read_profile.trees())
        branches = _branches(tree, job)
        if branches:
            fetch_chunk(read, tree, branches, job, store,
                        cast("ShardMap | None", spec.shardmap), spec.avoid)


def _branches(tree: str, job: Job, wait_s: float = PROFILE_WAIT_S) -> tuple[str, ...]:
    """The branches to read ahead of ``tree``: what this process read of it last; while
    none is known (the process's first bundle has not read yet), wait for its first read, at
    most ``wait_s`` (the second bundle of a process is then read ahead too)."""
    deadline = time.monotonic() + wait_s
    while not job.cancelled:
        branches = read_profile.branches(tree)
        if branches or time.monotonic() >= deadline:
            return branches
        time.sleep(0.02)
    return ()


def read_spec(sandbox: str) -> BundleSpec | None:
    """The spec of the call waiting in ``sandbox`` (None: not a bundle call, or gone)."""
    arguments = payload_codec.call_arguments(sandbox)
    if arguments is None:
        return None
    args, kwargs = arguments
    payload = args[0] if args else kwargs.get("payload")
    if not isinstance(payload, bytes) or (len(args) > 1 and not args[1]):
        return None  # not a bundle, or an uncapped one (it runs in the library)
    try:
        return BundleSpec.decode(payload_codec.decode(payload))
    except Exception:  # not ours to read
        return None


def fetch_chunk(read: ChunkRead, tree: str, branches: tuple[str, ...], job: Job,
                store: PrefetchStore, shardmap: ShardMap | None,
                avoid: tuple[str, ...] = ()) -> None:
    """Fetch the baskets of ``branches`` of ``tree`` that hold ``read``'s entries (and the
    file's metadata uproot reads to find them) into ``store`` for ``job``'s call."""
    from datavine.io.reading import shard_health
    from datavine.io.shards import logical_name
    from datavine.io.source.disk import DiskCachedSource
    from datavine.io.source.handles import open_file

    writer = store.writer(job.owner)
    lfn = logical_name(read.url)

    def wrap(source: object) -> object:
        return DiskCachedSource(source, writer, lfn)  # type: ignore[arg-type]

    if shardmap is not None:
        from datavine.io.source.xcache import ShardedSource

        source: object = ShardedSource(shardmap, shard_health(), avoid=frozenset(avoid))
    else:
        from datavine.io.source.xrootd import DirectSource

        source = DirectSource()
    handle, _ = source.open(read.url, open_file, wrap=wrap,  # type: ignore[attr-defined]
                            object_cache=None, array_cache=None)
    with handle:
        if not _columns_held(handle, read, tree, branches):
            fetch_ranges(handle, tree, branches, read.start, read.stop, job)


def fetch_ranges(handle: object, tree: str, branches: tuple[str, ...], start: int, stop: int,
                 job: Job) -> int:
    """Ask the source of ``handle`` (an open uproot file whose source keeps what it fetches)
    for the baskets of ``branches`` of ``tree`` that hold entries ``[start, stop)``: the
    ranges uproot itself asks for when it reads them (``entries_to_ranges_or_baskets``), in
    one request. Returns how many ranges were asked for (0: none, or ``job`` cancelled)."""
    ttree = handle[tree]  # type: ignore[index]
    ranges: list[tuple[int, int]] = []
    for name in branches:
        if name not in ttree:
            continue
        for _, where in ttree[name].entries_to_ranges_or_baskets(start, stop):
            if isinstance(where, tuple):  # numpy integers: XRootD's vector read takes ints
                ranges.append((int(where[0]), int(where[1])))
    ranges = list(dict.fromkeys(ranges))
    if not ranges or job.cancelled:
        return 0
    notifications: queue.Queue[object] = queue.Queue()
    for chunk in ttree.file.source.chunks(ranges, notifications=notifications):
        with contextlib.suppress(Exception):  # a range that failed: the bundle reads it
            chunk.wait()
    return len(ranges)


def _columns_held(handle: object, read: ChunkRead, tree: str, branches: tuple[str, ...]) -> bool:
    """Whether this process's column cache holds every branch of the chunk (nothing to
    fetch: the bundle takes them from memory)."""
    from datavine.io.cached_arrays import DEFAULT

    file = getattr(handle, "file", None)
    if file is None:
        return False
    identity = column_cache.file_identity(read.url, (str(file.uuid), file.fEND))
    entries = column_cache.cache().entries
    return all(column_cache.ColumnKey(identity, tree, name, DEFAULT, read.start, read.stop)
               in entries for name in branches)


_prefetcher: Prefetcher | None = None


def prefetcher() -> Prefetcher:
    """This process's prefetcher (made on first use)."""
    global _prefetcher
    if _prefetcher is None:
        _prefetcher = Prefetcher()
    return _prefetcher


_early: deque[str] = deque(maxlen=EARLY_KEPT)  # hints before the prefetcher was made


def on_hint(data: bytes) -> None:
    """A hint from the library (in the capped child): the sandbox of a call queued for it.
    Before a bundle ran here with read-ahead on (:func:`bundle` makes the prefetcher) the
    sandbox is only noted: with ``prefetch_mb`` 0, the default, reading each queued call's
    spec would take the running bundle's CPU (and its GIL) for nothing; with it on, the
    calls queued behind a process's first bundle are read ahead once that bundle starts."""
    with contextlib.suppress(UnicodeDecodeError):
        owner = data.decode()
        if _prefetcher is None:
            _early.append(owner)
        else:
            _prefetcher.hint(owner)


@contextlib.contextmanager
def bundle(sandbox: str | None, max_mb: float) -> Iterator[None]:
    """Around one bundle run in this process from ``sandbox`` (None: not a call's; nothing
    done): :meth:`Prefetcher.begin` and :meth:`Prefetcher.end` of this process's prefetcher
    (none is made while ``max_mb`` is 0)."""
    if sandbox is None or (max_mb <= 0 and _prefetcher is None):
        yield
        return
    made = _prefetcher is None
    pf = prefetcher()
    pf.begin(sandbox, max_mb)
    if made and max_mb > 0:  # the calls queued behind this first one: read ahead now
        for owner in _early:
            if owner != sandbox and os.path.isdir(owner):
                pf.hint(owner)
    _early.clear()
    try:
        yield
    finally:
        pf.end(sandbox)
