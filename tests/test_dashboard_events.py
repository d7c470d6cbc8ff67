"""The live view's event file (datavine.dashboard.events): when the sink writes, what its
pool records leave out (workers unchanged, calls that did not move) and how the board folds
them back, the tail that reads whole lines, a closed sink."""

from __future__ import annotations

from pathlib import Path

from datavine.dashboard import events as ev
from datavine.dashboard.model import Board
from datavine.scheduler.known_workers import KnownWorker
from datavine.scheduler.network import LIBRARY_SENT, LIBRARY_STARTED, LibraryState
from datavine.scheduler.run_messages import PoolSample
from tests.test_dashboard import SHARDS, records


def test_the_sink_writes_every_half_second_and_at_pool_looks(tmp_path: Path) -> None:
    now = [0.0]
    sink = ev.EventSink(tmp_path / "e.jsonl", clock=lambda: now[0])
    tail = ev.Tail(tmp_path / "e.jsonl")
    assert [r["k"] for r in tail.read()] == ["hello"]
    sink.emit({"k": "sent", "call": 1})
    assert tail.read() == []  # buffered
    now[0] = ev.FLUSH_S
    sink.emit({"k": "sent", "call": 2})
    assert [r["call"] for r in tail.read()] == [1, 2]
    sink.emit({"k": "sent", "call": 3})
    sink.close()
    assert [r["call"] for r in tail.read()] == [3]


def test_pool_records_name_the_workers_only_when_they_changed(tmp_path: Path) -> None:
    """The sink leaves an unchanged worker list out of a pool record (at 256 workers it was
    most of the record's cost, once a second); the board folds such a record with the list
    it read last, so the workers' states still follow the calls."""
    sink = ev.EventSink(tmp_path / "e.jsonl")
    a2 = KnownWorker("a2", "A", cores=2, named=True, addrport="a2.box:9000", host="a2.box")
    b2 = KnownWorker("b2", "B", named=True, addrport="b2.box:9000", host="b2.box")
    sink.pool_now([a2, b2], {})
    sink.pool_now([a2, b2], {})
    sink.pool_now([a2], {})
    sink.close()
    pools = [r for r in ev.read_events(tmp_path / "e.jsonl") if r["k"] == "pool"]
    assert [[w["id"] for w in r["workers"]] if "workers" in r else None for r in pools] == [
        ["a2", "b2"], None, ["a2"]]
    board = Board().apply_all(records(
        {"k": "run", "run": 1, "tasks": 2, "files": {}, "shards": SHARDS},
        pools[0], {**pools[1], "calls": [[1, "a2.box:9000"]], "connected": 2}))
    assert {w.id: w.state for w in board.workers.values()} == {"a2": "busy", "b2": "idle"}
    board.apply_all(records({**pools[1], "calls": []}, pools[2]))
    assert {w.id: w.state for w in board.workers.values()} == {"a2": "idle", "b2": "lost"}


def test_pool_records_after_a_runs_first_say_only_which_calls_moved(tmp_path: Path) -> None:
    """A run's first pool record places every call; the next ones name only the calls
    placed, moved or gone since, and the view folds them to the places of the full lists."""
    sink = ev.EventSink(tmp_path / "e.jsonl")
    a2 = KnownWorker("a2", "A", cores=2, named=True, addrport="a2.box:9000", host="a2.box")
    b2 = KnownWorker("b2", "B", named=True, addrport="b2.box:9000", host="b2.box")
    places = [{1: "a2.box:9000", 2: "b2.box:9000"},
              {1: "a2.box:9000", 2: "b2.box:9000", 3: "a2.box:9000"},  # 3 placed
              {2: "a2.box:9000", 3: "a2.box:9000"},  # 1 done, 2 moved
              {}]  # all done
    board = Board().apply_all(records(
        {"k": "run", "run": 1, "tasks": 3, "files": {}, "shards": SHARDS}))
    for where in places:
        sink.pool(PoolSample(0.0, 2, 3, {}, where=where), [a2, b2])
    sink.close()
    pools = [r for r in ev.read_events(tmp_path / "e.jsonl") if r["k"] == "pool"]
    assert [r.get("calls") for r in pools] == [[[1, "a2.box:9000"], [2, "b2.box:9000"]],
                                               None, None, None]
    assert [(r.get("placed"), r.get("unplaced")) for r in pools[1:]] == [
        ([[3, "a2.box:9000"]], None), ([[2, "a2.box:9000"]], [1]), (None, [2, 3])]
    running = []
    for record in pools:
        board.apply_all(records(record))
        running.append({w.id: w.running for w in board.workers.values()})
    assert running == [{"a2": 1, "b2": 1}, {"a2": 2, "b2": 1}, {"a2": 2, "b2": 0},
                       {"a2": 0, "b2": 0}]


def test_a_look_remakes_the_pool_rows_only_when_a_worker_or_library_changed(
        tmp_path: Path) -> None:
    """The driver's looks reuse the libraries' mapping until a library changes (the runtime
    copies it once per change): the rows are made again when it is another mapping or a
    worker's fields changed, and only then does a record name the workers."""
    sink = ev.EventSink(tmp_path / "e.jsonl")
    a2 = KnownWorker("a2", "A", cores=2, named=True, addrport="a2.box:9000", host="a2.box")
    sent = {"a2.box:9000": LibraryState(LIBRARY_SENT, 0.0, "a2.box")}
    started = {"a2.box:9000": LibraryState(LIBRARY_STARTED, 1.0, "a2.box")}

    def look(libraries: dict[str, LibraryState]) -> None:
        sink.pool(PoolSample(0.0, 1, 2, {}, libraries=libraries), [a2])

    look(sent)
    look(sent)  # the same mapping, the same worker: reused, left out
    look(started)  # a library changed
    a2.rack = "B"  # a worker changed
    look(started)
    sink.close()
    pools = [r for r in ev.read_events(tmp_path / "e.jsonl") if r["k"] == "pool"]
    assert [[(w["lib"], w["rack"]) for w in r["workers"]] if "workers" in r else None
            for r in pools] == [[("sent", "A")], None, [("started", "A")], [("started", "B")]]


def test_tail_waits_for_a_whole_line(tmp_path: Path) -> None:
    path = tmp_path / "e.jsonl"
    path.write_bytes(b'{"k":"a","t":1}\n{"k":"b",')
    tail = ev.Tail(path)
    assert [r["k"] for r in tail.read()] == ["a"]
    with open(path, "ab") as f:
        f.write(b'"t":2}\nnot json\n')
    assert [r["k"] for r in tail.read()] == ["b"]


def test_a_closed_sink_keeps_nothing(tmp_path: Path) -> None:
    sink = ev.EventSink(tmp_path / "e.jsonl")
    sink.close()
    sink.emit({"k": "sent", "call": 1}, flush=True)
    assert not sink._pending and [r["k"] for r in ev.read_events(tmp_path / "e.jsonl")] == ["hello"]
