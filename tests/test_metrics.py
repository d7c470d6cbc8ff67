"""Prometheus metrics (datavine.dashboard.metrics): the families a board makes, their names
and labels by Prometheus' conventions (parsed with prometheus_client's parser and checked by
``promtool check metrics`` where Debian's prometheus package provides it: scripts/setup.sh
--promtool); the manager's listener settings; the bearer token off loopback, tried without
it on both listeners; and scrapes of a real LocalCluster's ``/metrics`` during a run and
after two, from the manager's listener (the view off) and from the view's server, whose
counters equal the runs' summaries.
"""

from __future__ import annotations

import importlib.util
import shutil
import stat
import subprocess
import threading
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from prometheus_client.parser import text_string_to_metric_families

from datavine.dashboard.metrics import authorized, exposition, families
from datavine.dashboard.metrics_listener import (
    MetricsConfig,
    MetricsListener,
    metrics_config,
    parse_listen,
)
from datavine.dashboard.model import Board
from datavine.errors import ConfigError
from tests.test_dashboard import scripted_records

ROOT = Path(__file__).resolve().parent.parent
WAIT_S = 120.0

# name -> {labels as sorted (key, value) pairs: value}
Samples = dict[str, dict[tuple[tuple[str, str], ...], float]]


def samples(text: str) -> Samples:
    """Every sample of a scrape, parsed by prometheus_client's own parser."""
    out: Samples = {}
    for family in text_string_to_metric_families(text):
        for s in family.samples:
            out.setdefault(s.name, {})[tuple(sorted(s.labels.items()))] = s.value
    return out


def total(found: Samples, name: str, **match: str) -> float:
    """The sum of ``name``'s samples whose labels include ``match``."""
    return sum(v for labels, v in found.get(name, {}).items()
               if set(match.items()) <= set(labels))


def promtool() -> str | None:
    local = ROOT / "build" / "promtool" / "usr" / "bin" / "promtool"
    return str(local) if local.exists() else shutil.which("promtool")


def check_with_promtool(text: str) -> None:
    tool = promtool()
    if tool is None:
        pytest.skip("no promtool: scripts/setup.sh --promtool unpacks Debian's prometheus "
                    "package into build/promtool")
    done = subprocess.run([tool, "check", "metrics"], input=text, capture_output=True,
                          text=True, timeout=60, check=False)
    assert done.returncode == 0, done.stdout + done.stderr


def scrape(url: str, token: str | None = None, timeout: float = 30.0) -> str:
    headers = {"Authorization": f"Bearer {token}"} if token else {}
    with urllib.request.urlopen(urllib.request.Request(url, headers=headers),
                                timeout=timeout) as answer:
        assert answer.status == 200
        assert answer.headers["Content-Type"].startswith("text/plain")
        return str(answer.read().decode())


def refused(url: str, token: str | None = None) -> tuple[int, bytes]:
    """A scrape that must be refused: its status and body."""
    headers = {"Authorization": f"Bearer {token}"} if token else {}
    with pytest.raises(urllib.error.HTTPError) as denied:
        urllib.request.urlopen(urllib.request.Request(url, headers=headers), timeout=30)
    return denied.value.code, denied.value.read()


# --- the families of a board (pure) ---------------------------------------------------------
def test_the_boards_figures_by_prometheus_conventions() -> None:
    board = Board().apply_all(scripted_records())
    text = exposition(board, manager_cpu_s=12.5)[0].decode()
    found = samples(text)
    assert all(name.startswith("datavine_") for name in found)
    for family in families(board):
        if family.type == "counter":  # the exposition's sample names end in _total
            assert all(s.name.endswith(("_total", "_created")) for s in family.samples)
    assert "datavine_manager_cpu_seconds_total" not in {
        s.name for f in families(board) for s in f.samples}  # not known: not made up
    # workers by rack and state: a2 idle in A, b2 lost in B, c9 still joining in C
    assert total(found, "datavine_workers", rack="A", state="idle") == 1
    assert total(found, "datavine_workers", rack="B", state="lost") == 1
    assert total(found, "datavine_workers", rack="C", state="joining") == 1
    assert total(found, "datavine_workers") == 3
    assert total(found, "datavine_worker_cores", rack="A") == 2
    assert total(found, "datavine_workers_lost_total") == 1
    assert total(found, "datavine_bundles_sent_total") == 5
    assert total(found, "datavine_bundles_returned_total") == 5
    assert total(found, "datavine_bundles_returned_total", outcome="failed_over") == 1
    assert total(found, "datavine_tasks_total") == 2
    assert total(found, "datavine_events_total") == 3000
    assert total(found, "datavine_read_bytes_total", nearness="same_rack") == 4_000_000
    assert total(found, "datavine_read_bytes_total", nearness="inter_rack",
                 server="xc-b") == 1_000_000
    assert total(found, "datavine_read_failovers_total") == 1
    assert total(found, "datavine_retries_total") == 3  # came back without their results
    assert total(found, "datavine_manager_cpu_seconds_total") == 12.5
    check_with_promtool(text)


def test_counters_add_up_over_runs_and_take_the_summarys_retries() -> None:
    records = scripted_records()
    board = Board().apply_all([*records, {"t": 2000.0, "k": "end", "run": 1,
                                          "summary": {"retries": 4, "unmeasured_calls": 2,
                                                      "unmeasured_bytes": 7_000_000}},
                               *[r for r in records if r["k"] not in ("hello", "procs")]])
    found = samples(exposition(board)[0].decode())
    assert total(found, "datavine_runs_total") == 2
    assert total(found, "datavine_tasks_total") == 4
    assert total(found, "datavine_retries_total") == 4 + 3  # the summary's, once ended
    assert total(found, "datavine_read_bytes_total") == 2 * 5_000_000
    # calls stopped while they ran: in no byte total, counted apart when their run ends
    assert total(found, "datavine_unmeasured_calls_total") == 2
    assert total(found, "datavine_unmeasured_read_bytes_total") == 7_000_000


def test_the_token_is_a_bearer_token_compared_whole() -> None:
    assert authorized(None, None) and authorized(None, "Bearer anything")
    assert authorized("s3cret", "Bearer s3cret") and authorized("s3cret", "bearer  s3cret ")
    for header in (None, "", "Bearer", "Bearer s3cre", "Bearer s3cret2", "Basic s3cret",
                   "s3cret"):
        assert not authorized("s3cret", header), header


# --- the manager's listener: settings -------------------------------------------------------
def test_listener_settings() -> None:
    assert parse_listen("9464") == ("127.0.0.1", 9464)
    assert parse_listen("0.0.0.0:9464") == ("0.0.0.0", 9464)
    assert parse_listen("[::1]:9464") == ("::1", 9464)
    for bad in ("", "x", "host:", "1:99999"):
        with pytest.raises(ConfigError, match="DATAVINE_METRICS"):
            parse_listen(bad)
    with pytest.raises(ConfigError, match=r"MetricsConfig\.port"):
        MetricsConfig(port=70000)
    assert metrics_config(None, {}) is None and metrics_config(False, {}) is None
    assert metrics_config(True, {}) == MetricsConfig()
    assert metrics_config(None, {"DATAVINE_METRICS": "10.1.2.3:9464",
                                 "DATAVINE_METRICS_TOKEN": "t"}) == MetricsConfig(
        "10.1.2.3", 9464, "t")
    assert not MetricsConfig().needs_token and MetricsConfig("0.0.0.0").needs_token


# --- refused without the token, off loopback ------------------------------------------------
def test_the_managers_listener_off_loopback_refuses_a_scrape_without_its_token(
        tmp_path: Path) -> None:
    """Bound to every interface, it made a token (in a file only its owner reads); a
    scrape without it, or with another, gets 401 and no figure; with it, the metrics."""
    listener = MetricsListener(MetricsConfig(address="0.0.0.0"), tmp_path / "metrics")
    listener.start()
    try:
        assert listener.sink is not None and listener.token_file is not None
        listener.sink.emit({"k": "run", "run": 1, "tasks": 3, "files": {}, "shards": {}},
                           flush=True)
        assert stat.S_IMODE(listener.token_file.stat().st_mode) == 0o600
        url = f"http://127.0.0.1:{listener.port}/metrics"
        for token in (None, "wrong"):
            code, body = refused(url, token)
            assert code == 401 and b"datavine_" not in body
        assert refused(f"http://127.0.0.1:{listener.port}/", listener.token)[0] == 404
        found = samples(scrape(url, listener.token_file.read_text()))
        assert total(found, "datavine_runs_total") == 1
        assert str(listener.token_file) in listener.describe()
        assert listener.token not in (listener.url or "")  # never in the address
    finally:
        listener.close()


def test_the_views_server_off_loopback_refuses_a_scrape_without_its_token(
        tmp_path: Path) -> None:
    pytest.importorskip("bokeh")
    from datavine.dashboard.launch import Dashboard, DashboardConfig

    dashboard = Dashboard(tmp_path, DashboardConfig(address="0.0.0.0"))
    dashboard.start()
    try:
        assert dashboard.wait_ready() is not None, dashboard.error
        assert dashboard.token and dashboard.port
        url = f"http://127.0.0.1:{dashboard.port}/metrics"
        for token in (None, "wrong", dashboard.token[:-1]):
            code, body = refused(url, token)
            assert code == 401 and b"datavine_" not in body
        found = samples(scrape(url, dashboard.token))
        assert total(found, "datavine_runs_total") == 0
        assert total(found, "datavine_manager_cpu_seconds_total") > 0  # this process's
    finally:
        dashboard.close()


# --- a real run -----------------------------------------------------------------------------
def write_root(path: Path, n: int) -> Path:
    import numpy as np
    import uproot

    with uproot.recreate(path) as f:
        f["Events"] = {"x": np.arange(n, dtype=np.float64)}
    return path


def read_file(path: str, n: int) -> float:
    """Stage one: a file's column, through the worker's column cache."""
    import numpy as np

    from datavine.io.cached_arrays import read_arrays

    return float(np.sum(read_arrays(path, ["x"], 0, n).arrays["x"]))


def gated(gate: str, *values: float) -> float:
    """Stage two: waits (bounded) until the test has scraped the run in the middle."""
    import os
    import time

    deadline = time.monotonic() + 240
    while not os.path.exists(gate):
        if time.monotonic() > deadline:
            raise TimeoutError(f"the scrape never opened the gate {gate}")
        time.sleep(0.05)
    return sum(values)


def add(*values: float) -> float:
    return sum(values)


class MidRun:
    """Scrapes ``url`` on a thread until the run is half done (its reads done, its gated
    calls out), keeps that scrape, then opens the gate the second stage waits for."""

    def __init__(self, url: str, token: str | None, gate: Path, reads: int) -> None:
        self.url, self.token, self.gate, self.reads = url, token, gate, reads
        self.found: Samples | None = None
        self.error: BaseException | None = None
        self.thread = threading.Thread(target=self.watch, daemon=True)

    def watch(self) -> None:
        try:
            deadline = time.monotonic() + WAIT_S
            while time.monotonic() < deadline:
                found = samples(scrape(self.url, self.token, timeout=10))
                out = total(found, "datavine_bundles")
                if total(found, "datavine_tasks_total") >= self.reads and out >= 1:
                    self.found = found
                    return
                time.sleep(0.1)
            raise TimeoutError(f"{self.url} showed no half-done run in {WAIT_S:.0f} s")
        except BaseException as exc:  # the test reads it
            self.error = exc
        finally:
            self.gate.touch()

    def __enter__(self) -> MidRun:
        self.thread.start()
        return self

    def __exit__(self, *_: object) -> None:
        self.gate.touch()
        self.thread.join(timeout=WAIT_S)


@pytest.fixture
def files(tmp_path: Path) -> Iterator[list[tuple[str, int]]]:
    pytest.importorskip("uproot")
    yield [(str(write_root(tmp_path / f"f{i}.root", 20_000 * (i + 1))), 20_000 * (i + 1))
           for i in range(4)]


def bundles_of(found: Samples, phase: str) -> float:
    return total(found, "datavine_bundles", phase=phase)


@pytest.mark.taskvine
@pytest.mark.parametrize("where", ["manager", "dashboard"])
def test_scrapes_during_a_run_and_after_two_equal_the_summaries(
        where: str, tmp_path: Path, files: list[tuple[str, int]]) -> None:
    """Two runs of the same graph (the second reads from the workers' column caches):
    a scrape in the middle of the first shows it half done; after both, every counter is
    the sum of the two runs' summaries."""
    import datavine

    if where == "dashboard" and importlib.util.find_spec("bokeh") is None:
        pytest.skip("bokeh is not installed: pip install -e '.[dashboard]'")
    gate = tmp_path / "gate"
    dsk: dict[Any, Any] = {("read", i): (read_file, path, n) for i, (path, n) in
                           enumerate(files)}
    reads = list(dsk)
    for i in range(2):
        dsk[("gated", i)] = (gated, str(gate), *reads)
    dsk["total"] = (add, ("gated", 0), ("gated", 1))
    weights = {("read", i): n for i, (_, n) in enumerate(files)}
    manager = datavine.ManagerConfig(run_dir=tmp_path / "run")
    with datavine.LocalCluster(workers=2, manager=manager, memory=None, max_bundle_tasks=1,
                               dashboard=where == "dashboard",
                               metrics=where == "manager") as cluster:
        assert cluster.metrics_url is not None, (cluster.metrics_error, cluster.dashboard_error)
        if where == "manager":
            assert cluster.metrics is not None and cluster.dashboard is None
            assert cluster.metrics_url.startswith("http://127.0.0.1:")
        token = cluster.dashboard.token if cluster.dashboard is not None else None
        summaries = []
        with MidRun(cluster.metrics_url, token, gate, len(reads)) as mid:
            cluster.expect_events(weights)
            (value,) = cluster.get(dsk, ["total"])
        summaries.append(cluster.last_summary)
        assert mid.error is None and mid.found is not None, mid.error
        cluster.expect_events(weights)
        (again,) = cluster.get(dsk, ["total"])
        summaries.append(cluster.last_summary)
        text = scrape(cluster.metrics_url, token)
    expected = 2 * sum(n * (n - 1) / 2 for _, n in files)
    assert value == pytest.approx(expected) and again == pytest.approx(expected)

    # in the middle of the first run: its reads done, the rest out, two workers
    half = mid.found
    assert total(half, "datavine_runs_total") == 1
    assert len(reads) <= total(half, "datavine_tasks_total") < len(dsk)
    assert bundles_of(half, "running") + bundles_of(half, "waiting") >= 1
    assert total(half, "datavine_workers") == 2

    # after both: the summaries' figures
    found = samples(text)
    first, second = summaries
    assert first is not None and second is not None
    both = (first, second)
    assert total(found, "datavine_runs_total") == 2
    assert total(found, "datavine_tasks_total") == sum(s.tasks for s in both) == 2 * len(dsk)
    assert total(found, "datavine_events_total") == 2 * sum(weights.values())
    assert total(found, "datavine_bundles_sent_total") == sum(s.bundles for s in both)
    near = (total(found, "datavine_read_bytes_total", nearness="host")
            + total(found, "datavine_read_bytes_total", nearness="same_rack"))
    assert near == sum(s.reads.near_bytes for s in both) > 0  # local files: on the host
    assert total(found, "datavine_read_bytes_total", nearness="inter_rack") == sum(
        s.reads.far_bytes for s in both) == 0
    assert total(found, "datavine_column_cache_bytes_total", source="memory") == sum(
        s.cache.hit_bytes for s in both)
    assert total(found, "datavine_column_cache_bytes_total", source="file") == sum(
        s.cache.miss_bytes for s in both) > 0
    assert second.cache.hit_bytes > 0  # the rerun read from the workers' memory
    assert total(found, "datavine_read_failovers_total") == sum(
        s.reads.failovers for s in both)
    assert total(found, "datavine_retries_total") == sum(s.retries for s in both)
    assert total(found, "datavine_backup_copies_total") == sum(s.backups.started for s in both)
    assert total(found, "datavine_unmeasured_calls_total") == sum(
        s.backups.unmeasured for s in both)
    assert total(found, "datavine_workers", state="idle") == 2
    assert total(found, "datavine_manager_cpu_seconds_total") > 0
    check_with_promtool(text)


@pytest.mark.taskvine
def test_a_cluster_whose_listener_cannot_listen_goes_on_without_it(tmp_path: Path) -> None:
    """A port in use: the cluster starts, says why it has no listener, and runs."""
    import socket

    import datavine

    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        manager = datavine.ManagerConfig(run_dir=tmp_path / "run")
        with datavine.LocalCluster(workers=1, manager=manager, memory=None, dashboard=False,
                                   metrics=MetricsConfig(port=port)) as cluster:
            assert cluster.metrics is None and cluster.metrics_url is None
            assert cluster.metrics_error and f"127.0.0.1:{port}" in cluster.metrics_error
            assert cluster.get({"x": (add, 1, 2)}, ["x"]) == (3,)

