"""The read clock (io/source/timed.py): the seconds a server took to serve a file's ranges,
requests outstanding (overlaps counted once), as a bundle's read record carries it."""

from __future__ import annotations

import queue
import threading
import time
from pathlib import Path

import numpy as np
import uproot

from datavine.apps.testbed import write_small_tree
from datavine.io.source.base import seconds_reading
from datavine.io.source.handles import open_file
from datavine.io.source.timed import TimedSource
from datavine.io.source.wrapped import Notifications, WrappedSource

DELAY_S = 0.2


class LateSource(WrappedSource):
    """A local file whose ranges arrive ``DELAY_S`` after each request, from another thread
    (as XRootD's vector reads do)."""

    def __init__(self, inner: uproot.source.chunk.Source) -> None:
        super().__init__(inner)
        self.requests = 0

    def chunk(self, start: int, stop: int) -> uproot.source.chunk.Chunk:
        return self._inner.chunk(start, stop)

    def chunks(self, ranges: list[tuple[int, int]], notifications: Notifications,
               ) -> list[uproot.source.chunk.Chunk]:
        self.requests += 1
        filled: queue.Queue[uproot.source.chunk.Chunk] = queue.Queue()
        chunks = list(self._inner.chunks(ranges, filled))

        def arrive() -> None:
            time.sleep(DELAY_S)
            for _ in ranges:
                notifications.put(filled.get())

        threading.Thread(target=arrive, daemon=True).start()
        return chunks


def test_overlapping_requests_count_once() -> None:
    source = TimedSource(_Stub())  # type: ignore[arg-type]
    source.note(10.0, 11.0)
    source.note(10.5, 12.0)  # overlaps the first: 1 s more, not 1.5
    source.note(11.0, 11.5)  # inside what is counted: nothing
    source.note(13.0, 13.25)
    assert source.num_read_seconds == 2.25


def test_a_read_is_clocked_from_its_request_to_its_last_range(tmp_path: Path) -> None:
    path = tmp_path / "events.root"
    write_small_tree(path, seed=3, n_events=20_000)
    late: list[LateSource] = []

    def wrap(source: uproot.source.chunk.Source) -> uproot.source.chunk.Source:
        late.append(LateSource(source))
        return TimedSource(late[-1])

    with open_file(str(path), wrap=wrap, handler=uproot.source.file.MemmapSource) as f:
        arrays = f["Events"].arrays(["Jet_pt", "nJet"], library="np")
        clocked = seconds_reading(f)
    with uproot.open(path) as f:  # the clock changes nothing that is read
        plain = f["Events"].arrays(["Jet_pt", "nJet"], library="np")
    assert all(np.array_equal(arrays[k], plain[k]) for k in plain)
    (source,) = late
    assert source.requests >= 1
    # each request waited DELAY_S for its ranges, one after the other; the header and
    # metadata (``chunk``, synchronous here) add little
    assert DELAY_S * source.requests <= clocked < DELAY_S * source.requests + 1.0


def test_a_source_without_a_clock_says_zero(tmp_path: Path) -> None:
    path = tmp_path / "events.root"
    write_small_tree(path, seed=3, n_events=1_000)
    with uproot.open(path) as f:
        assert seconds_reading(f) == 0.0


class _Stub:
    file_path = "root://stub//file.root"
