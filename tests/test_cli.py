"""The ``datavine`` command: argument and setting errors, and the main job end to end.

``datavine run`` runs for real: generated files, real ``vine_worker`` processes, and (marked
``xcache``) a real loopback XCache testbed; its JSON record is checked against the plain
single-process loop over the same files.
"""

from __future__ import annotations

import importlib.metadata
import json
import subprocess
import sys
from collections import Counter
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from datavine.apps import cli
from datavine.apps.analysis import ChunkResult, make_chunks, run_plain_loop
from datavine.apps.analysis.sources import (
    LocalFiles,
    SourcedResult,
    analysis_graph,
    merge,
    origin_url,
)
from datavine.io.datagen import generate_dataset
from datavine.io.xcache.testbed import xcache_missing

FILES, EVENTS, CHUNK = 2, 20_000, 10_000


@pytest.fixture(scope="module")
def data_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    folder = tmp_path_factory.mktemp("cli-data")
    generate_dataset(folder, FILES, EVENTS)
    return folder


@pytest.fixture(scope="module")
def reference(data_dir: Path) -> ChunkResult:
    files = sorted(data_dir.glob("nanoaod_*.root"))
    return run_plain_loop(make_chunks(files, CHUNK))


def run_cli(args: list[str], tmp_path: Path, capsys: pytest.CaptureFixture[str]
            ) -> tuple[int, dict[str, Any], str]:
    record = tmp_path / "record.json"
    code = cli.main([*args, "--json", str(record)])
    out = capsys.readouterr()
    data = json.loads(record.read_text()) if record.exists() else {}
    return code, data, out.out + out.err


def small_run(data_dir: Path, local_workers: bool = True) -> list[str]:
    workers = ["--workers", "2"] if local_workers else []
    return ["run", "--data", str(data_dir), "--files", str(FILES), "--events", str(EVENTS),
            "--chunk-events", str(CHUNK), *workers, "--no-progress", "--timeout", "120"]


# --- the command line --------------------------------------------------------------------------
def test_console_script_is_declared() -> None:
    scripts = importlib.metadata.entry_points(group="console_scripts")
    assert [e.value for e in scripts if e.name == "datavine"] == ["datavine.apps.cli:main"]
    exe = Path(sys.executable).parent / "datavine"
    done = subprocess.run([str(exe), "--version"], capture_output=True, text=True, timeout=60,
                          check=False)
    assert done.returncode == 0 and done.stdout.startswith("datavine ")


@pytest.mark.parametrize("argv", [
    [],
    ["frobnicate"],
    ["run", "--files", "0"],
    ["run", "--events", "many"],
    ["run", "--compression", "xz"],
    ["run", "--timeout", "-3"],
    ["pool", "start", "--workers", "2"],  # --manager is required
])
def test_bad_arguments_exit_2(argv: list[str], capsys: pytest.CaptureFixture[str]) -> None:
    assert cli.main(argv) == 2
    assert "usage: datavine" in capsys.readouterr().err


def test_help_exits_0(capsys: pytest.CaptureFixture[str]) -> None:
    assert cli.main(["--help"]) == 0
    text = capsys.readouterr().out
    assert "run" in text and "pool" in text


def test_scale_test_command_is_there_exactly_when_its_module_is() -> None:
    import importlib.util

    have = importlib.util.find_spec("datavine.apps.scaletest") is not None and \
        importlib.util.find_spec("datavine.apps.scaletest.cli") is not None
    assert ("scale-test" in cli.build_parser().format_help()) == have


def test_pool_commands_are_wired(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert cli.main(["pool", "status", "--pool-dir", str(tmp_path)]) == 0
    assert f"no pools in {tmp_path}" in capsys.readouterr().out


def test_bad_facility_file_is_one_line_naming_file_and_key(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    facility = tmp_path / "site.toml"
    facility.write_text("[manager]\nport = 70000\n")
    assert cli.main(["run", "--facility", str(facility), "--no-xcache"]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1
    assert err.startswith("datavine run: ") and str(facility) in err and "port" in err


def test_missing_facility_file_exits_2(tmp_path: Path, capsys: pytest.CaptureFixture[str]
                                       ) -> None:
    assert cli.main(["run", "--facility", str(tmp_path / "nope.toml")]) == 2
    assert "nope.toml" in capsys.readouterr().err


def test_unwritable_data_folder_is_named(tmp_path: Path, capsys: pytest.CaptureFixture[str]
                                         ) -> None:
    blocker = tmp_path / "file"
    blocker.write_text("not a folder")
    assert cli.main(["run", "--data", str(blocker / "data"), "--files", "1",
                     "--events", "10", "--no-xcache"]) == 2
    err = capsys.readouterr().err
    assert "--data" in err and str(blocker / "data") in err


# --- pure pieces -------------------------------------------------------------------------------
def test_origin_url_keeps_the_path_under_the_export_root(tmp_path: Path) -> None:
    f = tmp_path / "sub" / "a.root"
    assert origin_url(f, tmp_path, "root://127.0.0.1:1094") == \
        "root://127.0.0.1:1094//sub/a.root"
    with pytest.raises(ValueError, match="not inside"):
        origin_url("/elsewhere/a.root", tmp_path, "root://h:1")


def test_analysis_graph_is_a_tree_of_merges_over_the_chunks(data_dir: Path) -> None:
    chunks = make_chunks(sorted(data_dir.glob("*.root")), 2_000)  # 20 chunks
    graph = analysis_graph(LocalFiles(), chunks, fan_in=4).__dask_graph__()
    keys = [str(k) for k in graph]
    assert sum(k.startswith("agc-chunk-") for k in keys) == len(chunks) == 20
    assert sum(k.startswith("agc-merge-") for k in keys) == 5 + 2 + 1
    with pytest.raises(ValueError, match="fan_in"):
        analysis_graph(LocalFiles(), chunks, fan_in=1)


def test_sourced_results_merge_counts_servers(reference: ChunkResult) -> None:
    a = SourcedResult(reference, Counter({"xcache-0": 2}), failovers=1)
    b = SourcedResult(reference, Counter({"origin": 1}))
    total = merge(a, b)
    assert total.servers == {"xcache-0": 2, "origin": 1} and total.failovers == 1
    assert total.result.events == 2 * reference.events
    assert sum([a, b]).servers == total.servers


def test_histogram_line_shows_the_peak() -> None:
    edges = np.linspace(0.0, 100.0, 5)
    line = cli.histogram_line(np.array([1, 8, 2, 0]), edges)
    assert line.startswith("11 entries, peak 25-50") and line.endswith("|▁█▂ |")
    assert cli.histogram_line(np.zeros(4, np.int64), edges) == "empty"


# --- the main job, for real --------------------------------------------------------------------
def check_record(data: dict[str, Any], reference: ChunkResult) -> None:
    assert data["events"] == FILES * EVENTS == reference.events
    assert data["events_selected"] == reference.events_selected > 0
    assert data["chunks"] == FILES * EVENTS // CHUNK
    assert data["histogram"]["counts"] == reference.counts.tolist()
    assert data["histogram"]["edges"] == reference.edges.tolist()
    assert sum(data["servers"].values()) == data["chunks"]
    assert data["events_per_s"] > 0 and data["wall_s"] > 0
    # chunk tasks plus the merge tree (fan-in 8 over 4 chunks: one merge)
    assert data["summary"]["tasks"] == data["chunks"] + 1
    assert data["summary"]["retries"] == 0
    assert data["cluster"]["workers"] == 2


@pytest.mark.taskvine
def test_run_on_local_files(data_dir: Path, reference: ChunkResult, tmp_path: Path,
                            capsys: pytest.CaptureFixture[str]) -> None:
    code, data, out = run_cli([*small_run(data_dir), "--no-xcache"], tmp_path, capsys)
    assert code == 0, out
    check_record(data, reference)
    assert data["reading"] == {"mode": "local"}
    assert data["servers"] == {"local": data["chunks"]}
    assert f"result: {FILES * EVENTS:,} events" in out and "events/s" in out
    assert "agc-chunk" in out  # the run summary, by task category


def test_run_serves_metrics_where_asked(data_dir: Path, reference: ChunkResult,
                                        tmp_path: Path, capsys: pytest.CaptureFixture[str],
                                        ) -> None:
    """``--metrics [ADDRESS:]PORT``: the manager's own /metrics listener, the view off."""
    code, data, out = run_cli([*small_run(data_dir), "--no-xcache", "--no-dashboard",
                               "--metrics", "0"], tmp_path, capsys)
    assert code == 0, out
    check_record(data, reference)
    assert "metrics: http://127.0.0.1:" in out and "/metrics" in out, out
    code, _, out = run_cli([*small_run(data_dir), "--metrics", "all"], tmp_path, capsys)
    assert code != 0 and "--metrics='all'" in out, out


@pytest.mark.taskvine
@pytest.mark.xcache
def test_run_through_xcache(data_dir: Path, reference: ChunkResult, tmp_path: Path,
                            capsys: pytest.CaptureFixture[str]) -> None:
    why = xcache_missing()
    if why:
        pytest.skip(why)
    code, data, out = run_cli([*small_run(data_dir), "--shards", "2"], tmp_path, capsys)
    assert code == 0, out
    check_record(data, reference)
    reading = data["reading"]
    assert reading["mode"] == "xcache-testbed"
    names = {s["name"] for s in reading["shards"]}
    assert names == {"xcache-0", "xcache-1"}
    assert set(data["servers"]) <= names, "every chunk is read through a shard, not the origin"
    assert data["failovers"] == 0
    # local workers sit in the shards' racks; the runtime accounts every read
    assert data["cluster"]["racks"] == ["A", "B"]
    reads = data["summary"]["reads"]
    assert reads["opens"] == data["chunks"] and reads["failovers"] == 0
    # the runtime counts the whole open (headers too), the analysis only its branches
    assert reads["near_bytes"] + reads["far_bytes"] >= data["bytes_read"] > 0


@pytest.mark.taskvine
def test_run_on_a_pool_started_by_datavine_pool(data_dir: Path, reference: ChunkResult,
                                                tmp_path: Path,
                                                capsys: pytest.CaptureFixture[str]) -> None:
    """The README's pool recipe, with local workers: pool first, then the manager."""
    import secrets
    import socket

    password = tmp_path / "vine.password"
    password.write_text(secrets.token_hex(32))
    password.chmod(0o600)
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    pools = ["--pool-dir", str(tmp_path / "pools"), "--name", "cli-test"]
    # In its own process, as from a shell: the detached factory outlives that process.
    started = subprocess.run(
        [str(Path(sys.executable).parent / "datavine"), "pool", "start", "--batch", "local",
         "--workers", "2", "--manager", f"127.0.0.1:{port}", "--password", str(password),
         "--idle-timeout", "60", "--factory-period", "1", *pools],
        capture_output=True, text=True, timeout=60, check=False)
    assert started.returncode == 0, started.stdout + started.stderr
    try:
        code, data, out = run_cli([*small_run(data_dir, local_workers=False), "--no-xcache",
                                   "--port", str(port), "--password", str(password),
                                   "--pool-workers", "2", "--no-memory-caps"], tmp_path,
                                  capsys)
    finally:
        assert cli.main(["pool", "stop", *pools]) == 0
    assert code == 0, out
    check_record(data, reference)
    assert data["cluster"]["kind"] == "2 pool worker(s)" and data["cluster"]["port"] == port
    assert data["cluster"]["memory_caps"] is False


def test_pool_workers_and_local_workers_exclude_each_other(
        tmp_path: Path, data_dir: Path, capsys: pytest.CaptureFixture[str]) -> None:
    code, _, out = run_cli([*small_run(data_dir), "--no-xcache", "--pool-workers", "2"],
                           tmp_path, capsys)
    assert code == 2 and "--pool-workers" in out


def test_missing_password_file_is_named(tmp_path: Path, data_dir: Path,
                                        capsys: pytest.CaptureFixture[str]) -> None:
    code, _, out = run_cli([*small_run(data_dir), "--no-xcache", "--password",
                            str(tmp_path / "nope")], tmp_path, capsys)
    assert code == 2 and f"--password {tmp_path / 'nope'}: no such file" in out
