"""The scale test: real runs on local TaskVine workers, and the pure report logic.

The runs use small generated datasets (4 files x 20k events) and 2 one-core workers; one
dataset has a file whose baskets are overwritten, which must be reported as failed while the
others are processed. The report's arithmetic is checked on hand-made records.
"""

from __future__ import annotations

import json
import pickle
import shutil
from dataclasses import replace
from pathlib import Path

import numpy as np
import pytest
import uproot

from datavine.apps.analysis.agc import ChunkResult
from datavine.apps.scaletest import ScaleTestConfig, build_report, run_scale_test
from datavine.apps.scaletest.cli import main
from datavine.apps.scaletest.report import idle_time, passes_in_read_order
from datavine.apps.scaletest.run import ScaleTestError, fileset_files, make_chunks
from datavine.apps.scaletest.tasks import ChunkRecord, FileInfo, Tally, merge_tallies
from datavine.io.datagen import generate_dataset
from datavine.scheduler.summary import RunSummary

FILES, EVENTS = 4, 20_000
REQUIRED = ("gbps", "events_per_s", "khz_per_core", "files_processed", "files_failed",
            "peak_memory_mb", "workers", "cores")
PNG_MAGIC = b"\x89PNG\r\n\x1a\n"


@pytest.fixture(scope="module")
def dataset(tmp_path_factory: pytest.TempPathFactory) -> Path:
    folder = tmp_path_factory.mktemp("scaletest-data")
    generate_dataset(folder, FILES, EVENTS, "zstd")
    return folder


def entries(path: Path) -> int:
    with uproot.open(path) as f:
        return int(f["Events"].num_entries)


@pytest.mark.taskvine
def test_cli_run_writes_record_and_timeline(dataset: Path, tmp_path: Path,
                                            capsys: pytest.CaptureFixture[str]) -> None:
    record, png = tmp_path / "out" / "record.json", tmp_path / "out" / "timeline.png"
    code = main(["--quick", "--files", str(FILES), "--events-per-file", str(EVENTS),
                 "--chunk-events", "10000", "--workers", "2", "--data", str(dataset),
                 "--json", str(record), "--png", str(png)])
    assert code == 0
    last = capsys.readouterr().out.strip().splitlines()[-1]
    assert last.startswith("gbps=") and "files_processed=4" in last

    doc = json.loads(record.read_text())
    assert all(key in doc for key in REQUIRED)
    files = sorted(dataset.glob("nanoaod_*.root"))
    assert doc["events"] == sum(entries(f) for f in files) == FILES * EVENTS
    assert doc["files_processed"] == FILES and doc["files_failed"] == 0
    assert doc["chunks"] == 8 and doc["chunks_failed"] == 0
    assert doc["gbps"] > 0 and doc["events_per_s"] > 0 and doc["khz_per_core"] > 0
    assert doc["gbps"] == pytest.approx(doc["bytes_read"] * 8 / doc["wall_s"] / 1e9)
    assert doc["khz_per_core"] == pytest.approx(doc["events_per_s"] / 1e3 / doc["cores"])
    assert doc["workers"] == 2 and doc["cores"] == 2
    assert 20 < doc["peak_memory_mb"] < 4000
    assert len(doc["peak_memory_mb_per_worker"]) == 2
    assert sum(doc["histogram"]["counts"]) > 0
    timeline = doc["timeline"]
    n = len(timeline["t"])
    assert n >= 1 and all(len(timeline[k]) == n for k in ("workers", "gbps", "khz"))
    # the timeline's rates integrate back to the totals
    assert sum(timeline["khz"]) * 1e3 * timeline["dt"] == pytest.approx(doc["events"], rel=1e-3)
    assert png.read_bytes()[:8] == PNG_MAGIC and png.stat().st_size > 10_000


@pytest.mark.taskvine
def test_corrupt_file_is_counted_failed_and_others_processed(dataset: Path,
                                                             tmp_path: Path) -> None:
    data = tmp_path / "data"
    shutil.copytree(dataset, data)
    bad = data / "nanoaod_0002.root"
    garble_baskets(bad, "Jet_pt")
    fileset = tmp_path / "fileset.json"  # coffea's form: {dataset: {"files": {path: tree}}}
    fileset.write_text(json.dumps({"ttbar": {"files": {
        str(f): "Events" for f in sorted(data.glob("nanoaod_*.root"))}}}))
    report = run_scale_test(ScaleTestConfig(fileset=fileset, chunk_events=10_000, workers=2))
    assert report.files_failed == 1 and report.files_processed == FILES - 1
    assert [f["file"] for f in report.failed_files] == [str(bad.resolve())]
    assert report.failed_files[0]["stage"] == "process"
    assert report.chunks_failed == 2 and report.chunks == 8
    assert report.events == (FILES - 1) * EVENTS
    assert report.gbps > 0


def garble_baskets(path: Path, branch_name: str) -> None:
    with uproot.open(path) as f:
        branch = f["Events"][branch_name]
        spans = [(int(s), int(n)) for s, n in zip(branch.member("fBasketSeek"),
                                                  branch.member("fBasketBytes"), strict=True) if n]
    with open(path, "r+b") as out:
        for seek, size in spans:
            out.seek(seek)
            out.write(b"\xa5" * size)


# ---------------------------------------------------------------------------------------
# pure logic


def record(path: str, start: float, end: float, events: int, nbytes: int, worker: str = "w0",
           error: str | None = None, peak: float = 100.0, cached: int = 0, decoded: int = 0,
           pass_index: int = 0) -> ChunkRecord:
    return ChunkRecord(path, 0, events, worker, start, end, 0 if error else events,
                       0 if error else nbytes, peak, 1, error, cached, decoded, pass_index)


def test_report_figures_and_failed_files() -> None:
    infos = [FileInfo("a.root", 1000), FileInfo("b.root", 1000), FileInfo("c.root", error="x")]
    records = [record("a.root", 100.0, 101.0, 1000, 4_000_000, "w0", peak=150.0),
               record("b.root", 100.5, 101.5, 1000, 4_000_000, "w1", error="OSError: gone")]
    result = ChunkResult(np.zeros(25, np.int64), events=1000, bytes_read=4_000_000)
    report = build_report(infos, Tally(result, records), wall_s=2.0, t0=100.0, workers=2,
                          cores=2, bin_s=0.5)
    assert report.gbps == pytest.approx(4_000_000 * 8 / 2.0 / 1e9)
    assert report.events_per_s == 500 and report.khz_per_core == pytest.approx(0.25)
    assert (report.files, report.files_processed, report.files_failed) == (3, 1, 2)
    assert {f["file"]: f["stage"] for f in report.failed_files} == {
        "c.root": "open", "b.root": "process"}
    assert report.events_expected == 2000 and report.chunks_failed == 1
    assert report.peak_memory_mb == 150.0
    assert report.peak_memory_mb_per_worker == {"w0": 150.0, "w1": 100.0}
    tl = report.timeline
    assert tl.t == [0.0, 0.5, 1.0, 1.5] and tl.workers == [2.0] * 4
    assert tl.khz == [1.0, 1.0, 0.0, 0.0]  # a's 1000 events over its first second
    assert tl.busy_workers == [1.0, 2.0, 1.0, 0.0]
    assert sum(tl.gbps) * tl.dt == pytest.approx(4_000_000 * 8 / 1e9)
    assert report.busy_fraction == pytest.approx(2.0 / (2 * 1.5))  # 2 s of 2 x 1.5 s
    assert "busy_fraction=0.667" in report.figures_line()


def test_the_idle_time_is_split_into_hand_overs_and_waits() -> None:
    """A process's gaps under HANDOFF_S between two chunks are the hand-over from one call
    to the next; a longer gap, the start and the end are waits."""
    records = [record("a.root", 0.0, 1.0, 10, 1, "w0"),
               record("a.root", 1.006, 2.0, 10, 1, "w0"),  # 6 ms: a hand-over
               record("a.root", 2.5, 3.0, 10, 1, "w0"),  # 0.5 s: waiting for work
               record("a.root", 0.0, 1.5, 10, 1, "w1"),
               record("a.root", 1.512, 3.0, 10, 1, "w1")]  # 12 ms: a hand-over
    report = build_report([FileInfo("a.root", 50)], Tally(ChunkResult.empty(), records),
                          wall_s=3.0, t0=0.0, workers=2, cores=2)
    window = 2 * 3.0
    assert report.busy_fraction == pytest.approx(5.482 / window)
    assert report.idle_between_chunks == pytest.approx(0.018 / window)
    assert report.idle_waiting == pytest.approx(0.5 / window)
    assert (report.gaps, report.gap_median_ms) == (2, pytest.approx(9.0))
    assert "idle_between_chunks=0.003 gap_median_ms=9.00" in report.figures_line()
    assert any("cores idle  0.3% between chunks (2 gaps under 20 ms, median 9.0 ms), 8.3% "
               "waiting" in line for line in report.lines())
    # a replaced capped child is a process of its own: no gap across processes
    alone = idle_time([record("a.root", 0.0, 1.0, 10, 1, "w0"),
                       record("a.root", 1.001, 2.0, 10, 1, "w9")], cores=1)
    assert alone == (0.0, 0, 0.0)


def test_report_prefers_the_runtime_figures() -> None:
    summary = RunSummary(tasks=3, samples=[(0.0, 1, 1), (1.0, 3, 3)],
                         worker_peak_mb={"local-0": 321.0, "local-1": 123.0},
                         completions=[(0.5, ("agc-chunk", "t", 0), "local-0")])
    rec = record("a.root", 10.0, 12.0, 10, 100)
    report = build_report([FileInfo("a.root", 10)], Tally(ChunkResult.empty(), [rec]),
                          wall_s=2.0, t0=10.0, workers=3, cores=3, summary=summary, bin_s=0.5)
    assert report.timeline.workers == [1.0, 1.0, 3.0, 3.0]
    assert report.peak_memory_mb == 321.0
    assert report.summary is not None and report.summary["tasks"] == 3
    assert "completions" not in report.summary
    assert json.loads(json.dumps(report.to_dict()))["peak_memory_mb_per_worker"] == {
        "local-0": 321.0, "local-1": 123.0}


def test_report_of_passes_and_the_column_cache() -> None:
    infos = [FileInfo("a.root", 1000)]
    records = [
        record("a.root", 100.0, 101.0, 1000, 4_000, decoded=8_000),
        record("a.root", 101.0, 101.5, 1000, 100, cached=6_000, decoded=2_000, pass_index=1),
        record("a.root", 101.5, 102.0, 1000, 0, cached=8_000, pass_index=2),
        record("a.root", 101.5, 102.0, 1000, 0, error="OSError: x", pass_index=2)]
    result = ChunkResult(np.zeros(25, np.int64), events=3000)
    report = build_report(infos, Tally(result, records), wall_s=2.0, t0=100.0, workers=1,
                          cores=1, bin_s=0.5, passes=3)
    assert [p.hit_fraction for p in report.passes] == [0.0, 0.75, 1.0]
    assert [(p.start_s, p.end_s, p.chunks, p.chunks_failed) for p in report.passes] == [
        (0.0, 1.0, 1, 0), (1.0, 1.5, 1, 0), (1.5, 2.0, 2, 1)]
    assert report.passes[1].khz_per_core == pytest.approx(1000 / 0.5 / 1e3)
    assert report.passes[2].busy_s == 0.5  # the failed chunk's time is not the pass's
    assert (report.cached_bytes, report.decoded_bytes) == (14_000, 10_000)
    assert report.hit_fraction == pytest.approx(14_000 / 24_000)
    tl = report.timeline
    assert tl.hit_fraction == [0.0, 0.0, 0.75, 1.0]
    assert tl.cached_gbs[3] * tl.dt * 1e9 == pytest.approx(8_000)
    assert "hit_fraction=0.583 hit_fraction_by_pass=0.000,0.750,1.000" in report.figures_line()
    assert any("pass 2: 75.0% from memory" in line for line in report.lines())
    doc = json.loads(json.dumps(report.to_dict()))
    assert doc["passes"][1]["hit_fraction"] == 0.75 and doc["timeline"]["hit_fraction"][3] == 1


def test_a_chunks_reads_count_in_its_passes_in_the_order_they_ran() -> None:
    """The second pass's read of a chunk ran first (the first pass's was held for that
    worker): it is the cold read, counted in the first pass; other chunks keep their pass."""
    infos = [FileInfo("a.root", 1000), FileInfo("b.root", 1000)]
    records = [
        record("a.root", 100.0, 101.0, 1000, 4_000, decoded=8_000),
        record("b.root", 101.0, 101.5, 1000, 100, cached=8_000, pass_index=0),  # ran second
        record("b.root", 100.0, 100.5, 1000, 4_000, decoded=8_000, pass_index=1),  # first
        record("a.root", 101.5, 102.0, 1000, 0, cached=8_000, pass_index=1)]
    assert passes_in_read_order(records) == [0, 1, 0, 1]
    report = build_report(infos, Tally(ChunkResult(np.zeros(25, np.int64), events=4000),
                                       records), wall_s=2.0, t0=100.0, workers=1, cores=1,
                          passes=2)
    assert [(p.hit_fraction, p.start_s, p.end_s) for p in report.passes] == [
        (0.0, 0.0, 1.0), (1.0, 1.0, 2.0)]


def test_a_chunks_record_pickles_as_its_values_and_comes_back_equal() -> None:
    record = ChunkRecord("/d/f.root", 0, 10, "h:1", 1.0, 2.0, 10, 100, 50.0, 2, "OSError: x",
                         cached_bytes=3, decoded_bytes=4, pass_index=5)
    tally = Tally(ChunkResult.empty(), [record, replace(record, pass_index=6)])
    back = pickle.loads(pickle.dumps(tally, protocol=5))
    assert back == tally and back.records[1].pass_index == 6
    as_dict = pickle.dumps(record.__dict__, protocol=5)
    assert len(pickle.dumps(record, protocol=5)) < len(as_dict)  # no field names in it


def test_merges_pass_the_records_on_without_loading_them(monkeypatch: pytest.MonkeyPatch,
                                                         ) -> None:
    """A chain of merges as the scale test's passes make it, each tally through pickle as
    between two calls: a merge loads none of its parts' records, each record is pickled
    once (where its chunk's tally first leaves its call), and all come back, in order."""
    made, dumped = [0], [0]
    init, reduce = ChunkRecord.__init__, ChunkRecord.__reduce__

    def counted_init(self: ChunkRecord, *args: object, **kwargs: object) -> None:
        made[0] += 1
        init(self, *args, **kwargs)  # type: ignore[arg-type]

    def counted_reduce(self: ChunkRecord) -> tuple[type[ChunkRecord], tuple[object, ...]]:
        dumped[0] += 1
        return reduce(self)

    monkeypatch.setattr(ChunkRecord, "__init__", counted_init)  # what unpickling calls
    monkeypatch.setattr(ChunkRecord, "__reduce__", counted_reduce)
    ships = lambda t: pickle.loads(pickle.dumps(t, protocol=5))  # noqa: E731
    total, sent = ships(Tally()), []
    for p in range(4):
        chunks = [Tally(ChunkResult(np.ones(25, np.int64), events=10),
                        [ChunkRecord(f"f{i}.root", 0, 10, "h:1", 1.0, 2.0, 10, pass_index=p)])
                  for i in range(6)]
        sent += [r for c in chunks for r in c.records]
        made[0] = 0
        total = ships(merge_tallies([total, *map(ships, chunks)]))
        assert made[0] == 0  # the records of this pass and those before: none loaded
    assert dumped[0] == len(sent) == 24
    assert total.records == sent and total.result.events == 240
    assert made[0] == 24  # loaded once, where they are read


def test_make_chunks_equal_pieces_and_skips_failed_files() -> None:
    infos = [FileInfo("a", 250), FileInfo("b", error="bad"), FileInfo("c", 0), FileInfo("d", 99)]
    chunks = make_chunks(infos, 100)
    assert chunks == [("a", 0, 83), ("a", 83, 166), ("a", 166, 250), ("d", 0, 99)]


def test_fileset_forms(tmp_path: Path) -> None:
    (tmp_path / "f.json").write_text(json.dumps({
        "a": ["x.root", "root://host//y.root"], "b": {"files": {"z.root": "Events"}},
        "c": {"files": ["x.root"]}}))
    assert fileset_files(tmp_path / "f.json") == [
        str(tmp_path / "x.root"), "root://host//y.root", str(tmp_path / "z.root")]
    (tmp_path / "bad.json").write_text(json.dumps({"a": 3}))
    with pytest.raises(ScaleTestError, match=r"bad\.json"):
        fileset_files(tmp_path / "bad.json")
    with pytest.raises(ScaleTestError, match=r"missing\.json"):
        fileset_files(tmp_path / "missing.json")


def test_bad_options_name_the_setting(tmp_path: Path,
                                      capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["--pool", "external", "--out", str(tmp_path)]) == 2
    assert "--port" in capsys.readouterr().err
    assert main(["--files", "0"]) == 2


@pytest.mark.taskvine
@pytest.mark.xcache
def test_run_through_xcache_shards(dataset: Path) -> None:
    from tests.fixtures_xcache import xcache_missing

    why = xcache_missing()
    if why:
        pytest.skip(why)
    report = run_scale_test(ScaleTestConfig(files=FILES, events_per_file=EVENTS,
                                            chunk_events=EVENTS, data_dir=dataset, workers=2,
                                            xcache_shards=2))
    assert report.files_processed == FILES and report.events == FILES * EVENTS
    assert report.summary is not None
    reads = report.summary["reads"]
    assert reads["opens"] == FILES and set(reads["by_server"]) <= {"xcache-0", "xcache-1"}
    assert reads["near_bytes"] + reads["far_bytes"] == report.bytes_read


@pytest.mark.taskvine
def test_passes_read_the_dataset_again_as_tasks_of_their_own(dataset: Path) -> None:
    report = run_scale_test(ScaleTestConfig(files=FILES, events_per_file=EVENTS,
                                            chunk_events=20_000, workers=2, passes=3,
                                            data_dir=dataset))
    assert report.chunks == 3 * FILES and report.chunks_failed == 0
    assert report.events == report.events_expected == 3 * FILES * EVENTS
    assert report.files_processed == FILES
    assert [(p.number, p.chunks, p.events) for p in report.passes] == [
        (n, FILES, FILES * EVENTS) for n in (1, 2, 3)]


@pytest.mark.taskvine
def test_a_second_pass_reads_its_columns_from_the_workers_memory(dataset: Path,
                                                                 cluster: object) -> None:
    # many chunks per pass; a chunk's first read counts in the first pass, whichever pass's
    # task it was (the last few of a pass may run after the next pass's read of them)
    config = ScaleTestConfig(files=FILES, events_per_file=EVENTS, chunk_events=1_000,
                             data_dir=dataset, passes=2, drop_caches=True)
    report = run_scale_test(config, cluster)  # type: ignore[arg-type]
    first, second = report.passes
    assert report.chunks_failed == 0 and first.events == second.events == FILES * EVENTS
    assert first.cached_bytes == 0 and first.hit_fraction == 0.0 and first.decoded_bytes > 0
    # the same files on the same workers: placement sends each chunk where its columns are
    assert second.hit_fraction >= 0.95 and second.cached_bytes >= 0.95 * first.decoded_bytes
    assert report.cached_bytes == first.cached_bytes + second.cached_bytes
    assert report.hit_fraction == pytest.approx(
        report.cached_bytes / (report.cached_bytes + report.decoded_bytes))
    assert report.summary is not None  # the runtime counted the same bytes
    assert report.summary["cache"]["hit_bytes"] == report.cached_bytes
    assert report.summary["cache"]["miss_bytes"] == report.decoded_bytes
    tl = report.timeline
    assert sum(tl.cached_gbs) * tl.dt * 1e9 == pytest.approx(report.cached_bytes, rel=1e-3)
    assert sum(tl.decoded_gbs) * tl.dt * 1e9 == pytest.approx(report.decoded_bytes, rel=1e-3)
    doc = json.loads(json.dumps(report.to_dict()))
    assert [p["hit_fraction"] for p in doc["passes"]] == [0.0, round(second.hit_fraction, 4)]
    assert f"hit_fraction_by_pass=0.000,{second.hit_fraction:.3f}" in report.figures_line()
    # same histogram as a pass that decoded everything
    assert report.histogram["counts"] == [2 * c for c in cold_counts(dataset)]

    again = run_scale_test(replace(config, passes=1), cluster)  # type: ignore[arg-type]
    assert again.passes[0].hit_fraction == 0.0 and again.decoded_bytes == first.decoded_bytes


@pytest.mark.taskvine
def test_without_the_column_cache_every_pass_decodes(dataset: Path) -> None:
    report = run_scale_test(ScaleTestConfig(files=FILES, events_per_file=EVENTS,
                                            chunk_events=20_000, data_dir=dataset, passes=2,
                                            workers=2, column_cache=False))
    assert [p.cached_bytes for p in report.passes] == [0, 0]
    assert [p.hit_fraction for p in report.passes] == [0.0, 0.0]
    assert report.passes[0].decoded_bytes == report.passes[1].decoded_bytes > 0
    assert report.histogram["counts"] == [2 * c for c in cold_counts(dataset)]


def cold_counts(dataset: Path) -> list[int]:
    """The histogram of one pass over the dataset in this process (no cache)."""
    from datavine.apps.analysis.agc import make_chunks as agc_chunks
    from datavine.apps.analysis.agc import run_plain_loop

    files = sorted(dataset.glob("nanoaod_*.root"))
    return [int(c) for c in run_plain_loop(agc_chunks(files, 10_000)).counts]


def test_cli_defaults_are_a_long_run_and_quick_is_short() -> None:
    import argparse

    from datavine.apps.scaletest.cli import LONG, add_options, config_from_args

    parser = argparse.ArgumentParser()
    add_options(parser)
    long_run = config_from_args(parser.parse_args([]))
    quick = config_from_args(parser.parse_args(["--quick"]))
    mine = config_from_args(parser.parse_args(["--quick", "--passes", "2", "--files", "3"]))
    assert (long_run.files, long_run.events_per_file, long_run.passes) == (
        LONG.files, LONG.events_per_file, LONG.passes)
    assert long_run.files * long_run.events_per_file * long_run.passes >= 30_000_000
    assert (quick.files, quick.events_per_file, quick.passes) == (8, 100_000, 1)
    assert (mine.files, mine.events_per_file, mine.passes) == (3, 100_000, 2)



def test_the_column_caches_share_reaches_the_run_settings(
        capsys: pytest.CaptureFixture[str]) -> None:
    import argparse

    from datavine.apps.scaletest.cli import add_options, config_from_args
    from datavine.apps.scaletest.run import cluster_request

    parser = argparse.ArgumentParser()
    add_options(parser)
    default = config_from_args(parser.parse_args([]))
    roomy = config_from_args(parser.parse_args(["--column-cache-share", "0.75"]))
    assert cluster_request(default, None).run_config().column_cache_share == 0.5
    assert cluster_request(roomy, None).run_config().column_cache_share == 0.75
    # a share the caps cannot hold is refused before anything starts, naming the setting
    assert main(["--column-cache-share", "0.9"]) == 2
    assert "column_cache_share" in capsys.readouterr().err
