"""The live view's state, folded from the run's events (datavine.dashboard.model): outcomes
and their colours, bytes per XCache shard by nearness, progress, workers' states; the
driver's records on a fake port (tests/fake_runtime.py) against the run's own summary; the
saved report's HTML; the launch settings. No browser, no TaskVine (test_dashboard_browser
opens the real page)."""

from __future__ import annotations

import ast
import html
import json
import re
from pathlib import Path
from typing import Any

import pytest

from datavine.config import RunConfig
from datavine.dashboard import columns as cols
from datavine.dashboard import events as ev
from datavine.dashboard import model
from datavine.dashboard.launch import DashboardConfig, dashboard_config, display_url
from datavine.dashboard.model import (
    DONE,
    FAILED,
    FAILED_OVER,
    HIGHER_CAP,
    INTER_RACK,
    ON_HOST,
    OUTCOME_COLOURS,
    RETRIED,
    SAME_RACK,
    Board,
    nearness,
    outcome,
    spread,
)
from datavine.manager.execution import GraphRun
from datavine.protocol import Status
from datavine.scheduler import graph as graphs
from datavine.scheduler.summary import RunSummary
from tests.fake_runtime import FakeRuntime

SHARDS = {"xc-a": {"rack": "A", "host": "a1.box"}, "xc-b": {"rack": "B", "host": "b1.box"}}


def records(*items: dict[str, Any], t0: float = 1000.0) -> list[dict[str, Any]]:
    """Records stamped a second apart from ``t0`` unless they carry ``t``."""
    out = []
    for i, r in enumerate(items):
        out.append({"t": t0 + i, **r})
    return out


def read(lfn: str, server: str, rack: str | None, nbytes: int, failovers: int = 0) -> list[Any]:
    return [lfn, server, rack, nbytes, failovers]


def done(call: int, status: str = "ok", worker: str = "a2", rack: str = "A",
         host: str = "a2.box", reads: list[Any] | None = None, **extra: Any) -> dict[str, Any]:
    return {"k": "done", "call": call, "status": status, "worker": worker, "rack": rack,
            "host": host, "addr": f"{host}:9000", "wall": 1.0, "peak": 100.0, "cap": 512,
            "reads": reads or [], **extra}


def sent(call: int, files: tuple[str, ...] = (), n: int = 1, ev_: int = 0,
         cap: float = 512) -> dict[str, Any]:
    return {"k": "sent", "call": call, "n": n, "cap": cap, "to": None, "rack": None,
            "files": list(files), "ev": ev_}


# --- outcomes and nearness (pure) -----------------------------------------------------------
def test_each_status_has_its_outcome_and_the_outcomes_their_own_colours() -> None:
    assert outcome("ok") == DONE
    assert outcome("ok", failovers=1) == FAILED_OVER  # done, after a shard failed under it
    assert outcome("input") == FAILED_OVER
    assert outcome("memory") == HIGHER_CAP
    assert outcome("died") == outcome("lost") == outcome("time") == RETRIED
    assert outcome("error") == outcome("load") == FAILED
    assert set(OUTCOME_COLOURS) == set(model.OUTCOMES)
    assert len(set(OUTCOME_COLOURS.values())) == len(model.OUTCOMES)


def test_nearness_of_a_read() -> None:
    assert nearness("local", None, "A", "a2.box", None) == ON_HOST
    assert nearness("xc-a", "A", "A", "a1.box", "a1.box") == ON_HOST
    assert nearness("xc-a", "A", "A", "A1.BOX.", "a1.box") == ON_HOST  # names normalised
    assert nearness("xc-a", "A", "A", "a2.box", "a1.box") == SAME_RACK
    assert nearness("xc-b", "B", "A", "a2.box", "b1.box") == INTER_RACK
    assert nearness("origin", None, "A", "a2.box", None) == INTER_RACK
    assert nearness("xc-a", "A", None, "a2.box", "a1.box") == INTER_RACK  # no rack: far


def test_near_and_far_bytes_are_the_summarys() -> None:
    """The view splits near bytes into on-the-host and same-rack; their sum and the far
    bytes are exactly what RunSummary.add_reads counts."""
    reads = [read("/f1", "xc-a", "A", 100), read("/f2", "xc-b", "B", 20),
             read("/f3", "local", None, 3), read("/f4", "origin", None, 4000),
             read("/f5", "xc-a", "A", 50_000)]
    for worker, rack, host in [("a1", "A", "a1.box"), ("a2", "A", "a2.box"),
                               ("b1", "B", "b1.box"), ("x", None, "x.box")]:
        board = Board().apply_all(records(
            {"k": "run", "run": 1, "tasks": 1, "files": {}, "shards": SHARDS}, sent(1),
            done(1, worker=worker, rack=rack, host=host, reads=reads)))
        summary = RunSummary()
        summary.add_reads([{"lfn": r[0], "server": r[1], "rack": r[2], "bytes": r[3]}
                           for r in reads], rack)
        run = board.run
        assert run is not None
        assert (run.near_bytes, run.far_bytes) == (summary.reads.near_bytes,
                                                   summary.reads.far_bytes), worker
    assert run.bytes_by_nearness[ON_HOST] == 3  # only the local file, for worker x


def test_the_column_caches_bytes_are_the_summarys_and_the_header_shows_them() -> None:
    """Read records as a bundle's result carries them (io/reading.py: the cache's use on a
    file's first open, a file served from memory alone as server "memory", a held piece's
    record): through done_record into the board, the cache's bytes and the reads' nearness
    and failovers are what RunSummary.add_reads counts; a "memory" record is no server
    and no open; the header shows the hit share."""
    reads = [{"lfn": "/f1", "server": "xc-a", "rack": "A", "bytes": 4000, "cached": 0,
              "decoded": 3000, "errors": [("xc-b", "EIO")]},
             {"lfn": "/f2", "server": "memory", "rack": None, "bytes": 0, "cached": 9000,
              "decoded": 0},
             {"lfn": "/f2@0-100", "server": "memory", "rack": None, "bytes": 0},
             {"lfn": "/f3", "server": "origin", "rack": None, "bytes": 500, "cached": 1000,
              "decoded": 500}]
    record = ev.done_record(1, 1, {"status": "ok", "worker": "a2", "host": "a2.box",
                                   "rack": "A", "reads": reads}, "a2.box:9000")
    board = Board().apply_all(records(
        {"k": "run", "run": 1, "tasks": 1, "files": {}, "shards": SHARDS}, sent(1),
        dict(record)))
    summary = RunSummary()
    summary.add_reads(reads, "A")
    run = board.run
    assert run is not None
    assert (run.cache_hit_bytes, run.cache_decoded_bytes) == (
        summary.cache.hit_bytes, summary.cache.miss_bytes) == (10_000, 3500)
    assert run.cache_hit_fraction == pytest.approx(summary.cache.hit_fraction)
    assert (run.near_bytes, run.far_bytes) == (summary.reads.near_bytes,
                                               summary.reads.far_bytes)
    assert run.failovers == summary.reads.failovers == 1
    assert "memory" not in run.bytes_by_server and "/f2" not in run.slow
    p = cols.progress(board)
    assert (p["cache_hit_bytes"], p["cache_decoded_bytes"]) == (10_000, 3500)
    pytest.importorskip("bokeh")
    from datavine.dashboard.views import header_html

    text = header_html(p)
    assert 'data-figure="cache-hit-bytes">10,000<' in text
    assert 'data-figure="cache-decoded-bytes">3,500<' in text
    assert f'data-figure="cache-hit-percent">{10_000 / 13_500:.1%}<' in text
    # a file from before the cache's figures: five fields a read, no cache line
    old = Board().apply_all(records(
        {"k": "run", "run": 1, "tasks": 1, "files": {}, "shards": SHARDS}, sent(1),
        done(1, reads=[read("/f1", "xc-a", "A", 100)])))
    assert old.run is not None and old.run.cache_hit_bytes == 0
    assert "cache-hit" not in header_html(cols.progress(old))


def test_a_backup_copy_is_no_bundle_and_a_cancelled_call_is_not_running() -> None:
    """A copy's sent record counts as a copy, not a bundle, and its events once; the call
    cancelled when its twin came first leaves the calls in flight."""
    board = Board().apply_all(records(
        {"k": "run", "run": 1, "tasks": 1, "files": {}, "shards": SHARDS},
        sent(1, ev_=1000), {**sent(2, ev_=1000), "copy": 1}, done(2),
        {"k": "gone", "call": 1}))
    run = board.run
    assert run is not None
    assert (run.bundles_sent, run.copies_sent, run.bundles_done) == (1, 1, 1)
    assert (run.events_expected, run.events_done) == (1000, 1000)
    assert run.sent == {}


def test_spread_keeps_the_amount_and_splits_it_by_overlap() -> None:
    series: list[float] = []
    spread(series, 0.5, 2.5, 100.0, 1.0)
    assert series == pytest.approx([25.0, 50.0, 25.0])
    spread(series, 4.0, 4.0, 7.0, 1.0)  # an instant: all of it in its bin
    assert series[4] == 7.0 and sum(series) == pytest.approx(107.0)
    spread(series, -3.0, 0.5, 10.0, 1.0)  # before the start: from 0
    assert sum(series) == pytest.approx(117.0)


# --- folding a run -------------------------------------------------------------------------------
def scripted_records() -> list[dict[str, Any]]:
    """Five bundles on two racks: done near, done after failing over, over its cap, lost
    with its worker, failed; a pool look in the middle, another at the end."""
    files = {"/d/f1.root": 1, "/d/f2.root": 1, "/d/f3.root": 2, "/d/f4.root": 1}
    return records(
        {"k": "hello", "pid": 4242},
        {"k": "procs", "pids": {"a2": 11, "b2": 12, "c9": 13}},
        {"k": "run", "run": 1, "tasks": 9, "files": files, "shards": SHARDS},
        sent(1, ("/d/f1.root",), ev_=1000), sent(2, ("/d/f2.root",), ev_=2000),
        sent(3, ("/d/f3.root",), cap=256), sent(4, ("/d/f3.root",)),
        sent(5, ("/d/f4.root",), n=4),
        {"k": "pool", "workers": [
            {"id": "a2", "addr": "a2.box:9000", "host": "a2.box", "rack": "A", "cores": 2,
             "lib": "started"},
            {"id": "b2", "addr": "b2.box:9000", "host": "b2.box", "rack": "B", "cores": 1,
             "lib": "sent"},
            {"id": "c9", "addr": None, "host": None, "rack": "C", "cores": 1, "lib": None}],
         "calls": [[1, "a2.box:9000"], [3, "a2.box:9000"]], "queued": 3, "gone": [],
         "lost": [], "connected": 2, "cores": 3},
        done(1, reads=[read("/d/f1.root", "xc-a", "A", 4_000_000)]),
        done(2, reads=[read("/d/f2.root", "xc-b", "B", 1_000_000, failovers=1)]),
        done(3, status="memory", message="over", why="exceeded its memory cap of 256 MB"),
        {"k": "done", "call": 4, "n": 1, "status": "died", "addr": "b2.box:9000",
         "why": "worker b2.box lost"},
        done(5, status="error", worker="b2", rack="B", host="b2.box",
             why="ZeroDivisionError: division by zero"),
        {"k": "pool", "workers": [
            {"id": "a2", "addr": "a2.box:9000", "host": "a2.box", "rack": "A", "cores": 2,
             "lib": "started"}], "calls": [], "queued": 0, "gone": [],
         "lost": ["b2.box:9000"], "connected": 1, "cores": 2},
    )


def scripted_run() -> Board:
    return Board().apply_all(scripted_records())


def test_outcomes_colour_the_task_stream() -> None:
    run = scripted_run().run
    assert run is not None
    stream = cols.stream_columns(run)
    assert stream["outcome"] == [DONE, FAILED_OVER, HIGHER_CAP, RETRIED, FAILED]
    assert stream["colour"] == [OUTCOME_COLOURS[o] for o in stream["outcome"]]
    assert stream["worker"] == ["a2", "a2", "a2", "b2", "b2"]  # a died call: by its address
    assert stream["start"][0] == pytest.approx(stream["end"][0] - 1.0)  # its wall time
    assert cols.stream_columns(run, since=3)["call"] == [4, 5]


def test_bytes_per_shard_by_nearness() -> None:
    run = scripted_run().run
    totals = cols.server_totals(run)
    assert totals["server"] == ["xc-a", "xc-b"]
    assert totals[SAME_RACK] == [pytest.approx(0.004), 0.0]  # a2 reads xc-a (on a1) in rack A
    assert totals[INTER_RACK] == [0.0, pytest.approx(0.001)]  # and xc-b across racks
    assert totals[ON_HOST] == [0.0, 0.0]
    assert run is not None and (run.near_bytes, run.far_bytes) == (4_000_000, 1_000_000)
    columns, servers = cols.throughput_columns(run)
    assert servers["server"] == ["xc-a", "xc-b"]
    gbps_seconds = sum(columns["total"]) * run.bins.width
    assert gbps_seconds == pytest.approx(5_000_000 * 8 / 1e9)  # every byte in some bin


def test_progress_failures_and_slowest_files() -> None:
    board = scripted_run()
    p = cols.progress(board)
    assert (p["tasks_done"], p["tasks"]) == (2, 9)
    assert (p["bundles_done"], p["bundles_sent"], p["bundles_failed"]) == (2, 5, 3)
    assert (p["files_done"], p["files"], p["files_failed"]) == (2, 4, 1)  # f3 needs 2 tasks
    assert p["events"] == 3000 and p["events_expected"] == 3000
    assert p["outcomes"] == {DONE: 1, FAILED_OVER: 1, HIGHER_CAP: 1, RETRIED: 1, FAILED: 1}
    causes = cols.failure_columns(board.run)["cause"]
    assert causes == ["exceeded its memory cap of 256 MB", "worker b2.box lost",
                      "ZeroDivisionError: division by zero"]
    slowest = cols.slowest_columns(board.run)
    assert set(slowest["file"]) == {"/d/f1.root", "/d/f2.root"}
    assert slowest["server"][slowest["file"].index("/d/f2.root")] == "xc-b"


def test_workers_by_rack_and_state() -> None:
    board = scripted_run()
    columns = cols.worker_columns(board)
    assert columns["worker"] == ["a2", "b2", "c9"]  # by rack, host, name
    state = dict(zip(columns["worker"], columns["state"], strict=True))
    assert state == {"a2": "idle", "b2": "lost", "c9": "joining"}
    assert columns["cores"] == [2, 1, 1]
    assert columns["done"][0] == 2 and columns["failed"][:2] == [1, 2]
    assert columns["cap_mb"][0] == 512  # the cap of its last bundle
    # in the middle of the run, a2 ran two calls and b2's library was starting
    scripted = scripted_records()
    first_pool = next(i for i, r in enumerate(scripted) if r["k"] == "pool")
    middle = cols.worker_columns(Board().apply_all(scripted[:first_pool + 1]))
    assert dict(zip(middle["worker"], middle["state"], strict=True)) == {
        "a2": "busy", "b2": "library starting", "c9": "joining"}
    assert middle["running"][0] == 2
    assert middle["cap_mb"][0] == 512  # the larger cap of the two it runs


def test_usage_read_on_the_host_is_the_memory_shown() -> None:
    board = scripted_run()
    board.apply({"k": "usage", "t": 2000.0, "workers": {"a2": [321.0, 95.0]},
                 "manager": [80.0, 12.0], "host": [1000, 8000, 50.0]})
    columns = cols.worker_columns(board)
    assert columns["memory_mb"][0] == 321.0 and columns["cpu"][0] == 95.0
    assert columns["memory_mb"][1] == 100.0  # b2: its last bundle's peak
    assert cols.progress(board)["usage"]["manager"] == [80.0, 12.0]


def test_a_new_run_starts_a_new_stream_and_workers_stay() -> None:
    board = scripted_run()
    board.apply({"k": "end", "t": 1100.0, "run": 1, "summary": {"bundles": 5, "wall_s": 9.0}})
    assert cols.progress(board)["finished"] and cols.progress(board)["elapsed_s"] == 9.0
    board.apply({"k": "run", "t": 1200.0, "run": 2, "tasks": 3, "files": {}, "shards": {}})
    assert cols.stream_columns(board.run)["call"] == []
    assert cols.progress(board)["tasks"] == 3 and "a2" in board.workers


# --- the driver's records ----------------------------------------------------------------------
def big(i: int) -> Any:
    return [float(i)] * 10


def add(*parts: Any) -> Any:
    return sum(sum(p) for p in parts)


def fake_run(tmp_path: Path, script: Any = None) -> tuple[FakeRuntime, Board, Path]:
    cfg = RunConfig(memory=None, max_bundle_tasks=1, target_bundle_s=1e-6, wait_s=1)
    rt = FakeRuntime(cfg, script=script)
    dsk: dict[Any, Any] = {("big", i): (big, i) for i in range(6)}
    dsk["total"] = (add, *[("big", i) for i in range(6)])
    path = tmp_path / "events.jsonl"
    sink = ev.EventSink(path)
    sink.expect_events({("big", i): 100 for i in range(6)})
    GraphRun(rt, graphs.build(dsk, ["total"]), cfg, sink=sink).execute()  # type: ignore[arg-type]
    sink.close()
    return rt, Board().apply_all(ev.read_events(path)), path


def test_the_drivers_records_fold_to_the_runs_summary(tmp_path: Path) -> None:
    rt, board, _ = fake_run(tmp_path)
    summary = rt.last_summary
    p = cols.progress(board)
    assert (p["tasks_done"], p["tasks"]) == (summary.tasks, 7)
    assert p["bundles_sent"] == p["bundles_done"] == summary.bundles
    assert p["events"] == 600
    assert p["finished"] and p["summary"]["bundles"] == summary.bundles


def test_retries_appear_as_outcomes(tmp_path: Path) -> None:
    def script(n: int, spec: dict[str, Any]) -> Any:
        if n == 2:
            return "lost"
        if n == 3:
            return {"status": Status.INPUT, "server": "xc-a", "message": "EIO"}
        return None

    rt, board, path = fake_run(tmp_path, script)
    p = cols.progress(board)
    assert p["outcomes"][RETRIED] == 1 and p["outcomes"][FAILED_OVER] == 1
    assert p["bundles_sent"] == rt.last_summary.bundles == p["bundles_done"] + 2
    assert rt.last_summary.retries == 2
    kinds = [r["k"] for r in ev.read_events(path)]
    assert kinds[:2] == ["hello", "run"] and kinds[-1] == "end" and "pool" in kinds


# --- the saved report ------------------------------------------------------------------------
def test_the_report_is_one_self_contained_file(tmp_path: Path) -> None:
    pytest.importorskip("bokeh")
    from datavine.dashboard.report import write_report

    _, _, path = fake_run(tmp_path)
    out = write_report(path, tmp_path / "run.html", title="a run")
    text = out.read_text()
    assert not re.search(r"<script[^>]*\bsrc=", text)  # Bokeh's JavaScript is inlined
    assert not re.search(r"<link[^>]*\bhref=", text)
    assert "<title>a run</title>" in text
    docs = re.search(r'<script type="application/json" id="[^"]+">\s*(.*?)\s*</script>', text,
                     re.S)
    assert docs is not None
    progress = find_model(json.loads(html.unescape(docs.group(1))), "progress")
    assert 'data-figure="bundles-done">7<' in progress["attributes"]["text"]


def find_model(tree: Any, name: str) -> dict[str, Any]:
    """The model called ``name`` in a Bokeh document's JSON."""
    found: list[dict[str, Any]] = []

    def walk(node: Any) -> None:
        if isinstance(node, dict):
            if node.get("attributes", {}).get("name") == name:
                found.append(node)
            for value in node.values():
                walk(value)
        elif isinstance(node, list):
            for value in node:
                walk(value)

    walk(tree)
    assert found, f"no model named {name}"
    return found[0]


# --- settings ------------------------------------------------------------------------------
def test_dashboard_settings(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("DATAVINE_DASHBOARD", raising=False)
    assert dashboard_config(None) == DashboardConfig()
    assert dashboard_config(False) is None
    monkeypatch.setenv("DATAVINE_DASHBOARD", "0")
    assert dashboard_config(None) is None
    assert dashboard_config(True) == DashboardConfig()  # asked for: on anyway
    assert not DashboardConfig().needs_token
    assert DashboardConfig(address="0.0.0.0").needs_token
    assert DashboardConfig(address="198.18.0.2").needs_token
    assert display_url("127.0.0.1", 8787, None) == "http://127.0.0.1:8787/"
    assert display_url("198.18.0.2", 8787, "tok") == "http://198.18.0.2:8787/tok/"


def test_websocket_origins() -> None:
    from datavine.dashboard.server import origins

    assert origins("127.0.0.1", 5000, None) == ["127.0.0.1:5000", "localhost:5000"]
    assert origins("0.0.0.0", 5000, "tok") == ["*"]  # the token guards it


@pytest.mark.parametrize("module", [model, cols])
def test_the_model_is_pure(module: Any) -> None:
    """Like the scheduler's modules: no clock, no process, no I/O library."""
    tree = ast.parse(Path(module.__file__).read_text())
    names = {a.name for n in ast.walk(tree) if isinstance(n, ast.Import) for a in n.names}
    names |= {n.module for n in ast.walk(tree) if isinstance(n, ast.ImportFrom) and n.module}
    shell = {"time", "os", "subprocess", "socket", "threading", "json", "psutil", "bokeh"}
    assert not {m.split(".")[0] for m in names} & shell


def test_records_are_json(tmp_path: Path) -> None:
    _, _, path = fake_run(tmp_path)
    for line in path.read_text().splitlines():
        assert isinstance(json.loads(line), dict)


def test_command_line_options() -> None:
    from datavine.apps.cli import build_parser
    from datavine.dashboard.launch import option_from_args

    parse = build_parser().parse_args
    assert option_from_args(parse(["run"])) is None  # the default: DATAVINE_DASHBOARD decides
    assert option_from_args(parse(["run", "--no-dashboard"])) is False
    wide = option_from_args(parse(["scale-test", "--dashboard-address", "0.0.0.0",
                                   "--dashboard-port", "8787"]))
    assert wide == DashboardConfig(address="0.0.0.0", port=8787) and wide.needs_token


def test_a_token_guards_every_path(tmp_path: Path) -> None:
    """A server with a token answers under /<token>/ only, and stops with all it started."""
    pytest.importorskip("bokeh")
    import urllib.error
    import urllib.request

    from datavine.dashboard.launch import Dashboard
    from datavine.deploy.sessions import session_pids

    dashboard = Dashboard(tmp_path, DashboardConfig(token="s3cret-token"))
    dashboard.start()
    try:
        url = dashboard.wait_ready()
        assert url is not None, dashboard.error
        assert url.endswith("/s3cret-token/") and "token" in dashboard.describe()
        root = url.removesuffix("s3cret-token/")
        with urllib.request.urlopen(url, timeout=30) as page:
            assert page.status == 200 and b"Bokeh" in page.read()
        for path in ("", "static/js/bokeh.min.js", "ws", "wrong-token/"):
            with pytest.raises(urllib.error.HTTPError) as denied:
                urllib.request.urlopen(root + path, timeout=30)
            assert denied.value.code == 404, path
        assert dashboard.proc is not None
        pid = dashboard.proc.pid
    finally:
        dashboard.close()
    assert not session_pids(pid)


def test_each_page_has_models_of_its_own(tmp_path: Path) -> None:
    """Two browser sessions (or the live page and a saved report) build two documents:
    no Bokeh model may be shared between them."""
    pytest.importorskip("bokeh")
    from bokeh.document import Document

    from datavine.dashboard.views import build

    board = scripted_run()
    for _ in range(2):
        doc = Document()
        for root in build(board).roots:
            doc.add_root(root)


def test_coffea_work_items_weigh_their_events() -> None:
    """The executor tells the view each item's entries, for events/s."""
    pytest.importorskip("coffea")
    from types import SimpleNamespace

    from datavine.coffea.executor import build_graph, expect_events
    from datavine.coffea.tasks import ItemPolicy

    items = [SimpleNamespace(filename=f"/d/f{i}.root", entrystart=100 * i,
                             entrystop=100 * i + 50 + i) for i in range(5)]
    graph, _ = build_graph(items, len, ItemPolicy(), 2, "coffea")
    weighed: dict[Any, int] = {}
    expect_events(SimpleNamespace(expect_events=weighed.update), graph, items)
    assert sorted(weighed.values()) == [50, 51, 52, 53, 54]
    assert all(key[0] == "coffea-item" for key in weighed)
    expect_events(SimpleNamespace(), graph, items)  # not a cluster: nothing asked
