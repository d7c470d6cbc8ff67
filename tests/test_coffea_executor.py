"""DatavineExecutor: coffea's Runner on real TaskVine workers, against IterativeExecutor.

The samples are coffea's own NanoAOD test files (:func:`datavine.io.samples.coffea_sample`).
The processor is defined here and pickled by value (``register_pickle_by_value``), because
the workers cannot import this test module. Bad files are real: copies of a sample with
garbled baskets or cut short, and a path that does not exist; XRootD errors come from a real
XCache server that is stopped between preprocessing and processing.
"""

from __future__ import annotations

import shutil
import sys
from pathlib import Path
from typing import Any

import pytest

pytest.importorskip("coffea")

import awkward as ak
import cloudpickle
import hist
import numpy as np
import uproot
from coffea import processor
from coffea.nanoevents import NanoAODSchema

from datavine.coffea import (
    BadFilesSkippedWarning,
    DatavineExecutor,
    ItemFailedError,
    classify,
    exception_chain,
)
from datavine.coffea.executor import build_graph, unwrap_automatic_retries
from datavine.coffea.tasks import ItemPolicy
from datavine.io.reading import is_input_error
from datavine.io.samples import coffea_sample

cloudpickle.register_pickle_by_value(sys.modules[__name__])

pytestmark = [
    pytest.mark.coffea,
    # coffea's NanoAOD samples lack some cross-reference branches; coffea warns per chunk.
    pytest.mark.filterwarnings("ignore:Missing cross-reference"),
    pytest.mark.filterwarnings("ignore:Branch .* already exists"),
    pytest.mark.filterwarnings("ignore:Performed attempt"),
]
integration = [pytest.mark.taskvine]
SAMPLES = ("nano_dy", "nano_tt_v12", "nano_dimuon")
CHUNK = 100


class MetMuons(processor.ProcessorABC):
    """MET and muon pT histograms, event and muon counts per dataset; optional failures."""

    def __init__(self, fail_at: tuple[str, int] | None = None,
                 xrootd_error_in: str | None = None) -> None:
        self.fail_at = fail_at
        self.xrootd_error_in = xrootd_error_in

    def process(self, events: Any) -> dict[str, Any]:
        meta = events.metadata
        if self.fail_at == (meta["dataset"], meta["entrystart"]):
            raise ValueError(f"injected failure in {meta['dataset']} at {meta['entrystart']}")
        if self.xrootd_error_in and meta["filename"].endswith(self.xrootd_error_in):
            try:  # as a lazy column read does: the client's OSError only as __context__
                raise OSError(f"XRootD error: [ERROR] Operation expired\nin file "
                              f"root://127.0.0.1:1094//{meta['filename']}")
            except OSError:
                raise RuntimeError("could not materialize MET_pt") from None
        met = hist.Hist.new.Reg(40, 0, 200, name="met").Double()
        met.fill(met=ak.to_numpy(events.MET.pt))
        muon_pt = hist.Hist.new.Reg(20, 0, 100, name="pt").Double()
        muon_pt.fill(pt=ak.to_numpy(ak.flatten(events.Muon.pt)))
        return {meta["dataset"]: {"met": met, "muon_pt": muon_pt, "events": len(events),
                                  "muons": int(ak.sum(ak.num(events.Muon)))}}

    def postprocess(self, accumulator: Any) -> Any:
        return accumulator


def fileset(*names: str) -> dict[str, list[str]]:
    return {name: [str(coffea_sample(name))] for name in names}


def runner(executor: Any, **options: Any) -> processor.Runner:
    return processor.Runner(executor=executor, schema=NanoAODSchema, chunksize=CHUNK,
                            **options)


def iterative() -> processor.IterativeExecutor:
    return processor.IterativeExecutor(status=False)


def on(cluster: Any, **options: Any) -> DatavineExecutor:
    return DatavineExecutor(cluster=cluster, status=False, retry_delay_s=0.0, **options)


def assert_same(out: dict[str, Any], ref: dict[str, Any]) -> None:
    assert out.keys() == ref.keys()
    for dataset, expected in ref.items():
        got = out[dataset]
        assert got["events"] == expected["events"]
        assert got["muons"] == expected["muons"]
        for name in ("met", "muon_pt"):
            assert np.array_equal(got[name].values(flow=True), expected[name].values(flow=True))
            assert got[name].axes == expected[name].axes
    assert out == ref


# ---------------------------------------------------------------------------------------
# integration: real workers


@pytest.mark.taskvine
@pytest.mark.parametrize("compression", [1, None])
def test_identical_to_iterative_executor(cluster: Any, compression: int | None) -> None:
    files = fileset(*SAMPLES)
    ref = runner(iterative())(files, treename="Events", processor_instance=MetMuons())
    executor = on(cluster, compression=compression, merge_fanin=2)
    out = runner(executor)(files, treename="Events", processor_instance=MetMuons())
    assert_same(out, ref)
    assert out["nano_tt_v12"]["events"] == 200
    calls = {c.desc: c for c in executor.report.calls}
    assert calls["Processing"].items == calls["Processing"].succeeded == 4
    assert not calls["Processing"].failed and not calls["Processing"].skipped


@pytest.mark.taskvine
def test_embedded_default_cluster() -> None:
    files = fileset("nano_dy")
    ref = runner(iterative())(files, treename="Events", processor_instance=MetMuons())
    executor = DatavineExecutor(status=False)
    out = runner(executor)(files, treename="Events", processor_instance=MetMuons())
    assert_same(out, ref)
    summary = executor.report.last.summary
    assert summary is not None and summary.workers >= 1
    executor.close()


@pytest.mark.taskvine
def test_partial_result_and_exception_on_injected_failure(cluster: Any) -> None:
    files = fileset(*SAMPLES)
    chunks = list(runner(iterative()).preprocess(files, treename="Events"))
    failing = next(c for c in chunks if c.dataset == "nano_tt_v12" and c.entrystart == 0)
    others = [c for c in chunks if c != failing]
    ref = runner(iterative())(others, processor_instance=MetMuons())

    executor = on(cluster, retries=1)
    with pytest.raises(Exception, match="Failed processing file") as info:
        runner(executor)(chunks, processor_instance=MetMuons(fail_at=("nano_tt_v12", 0)))
    exc = info.value
    assert isinstance(exc.__cause__, ValueError)
    assert "injected failure in nano_tt_v12 at 0" in str(exc.__cause__)
    assert any("remote traceback" in note for note in getattr(exc, "__notes__", []))
    assert_same(exc.partial_output, ref)
    record = executor.report.last
    assert record.succeeded == len(others) and len(record.failed) == 1
    assert record.failed[0].attempts == 2  # retries=1: tried twice on the worker


@pytest.mark.taskvine
def test_executor_contract_direct(cluster: Any) -> None:
    executor = on(cluster, retries=0, compression=1, merge_fanin=3)
    out, err = executor(list(range(10)), square_or_fail, None)
    assert (out, err) == ({"sum": sum(i * i for i in range(10)), "n": 10}, 0)
    out, err = executor(list(range(10)), SquareOrFailAt(7), {"sum": 0, "n": 0})
    assert out == {"sum": sum(i * i for i in range(10) if i != 7), "n": 9}
    assert isinstance(err, KeyError) and "item 7" in str(err)
    assert executor(iter([]), square_or_fail, {"n": 0}) == ({"n": 0}, 0)


def test_a_run_that_fails_as_a_whole_raises_its_error() -> None:
    from datavine.errors import NoWorkersError

    class NoWorkers:
        last_summary = None

        def get(self, graph: Any, keys: Any) -> Any:
            raise NoWorkersError("3 bundles waiting and no worker connected")

    executor = DatavineExecutor(cluster=NoWorkers(), status=False)
    with pytest.raises(NoWorkersError, match="no worker connected") as info:
        runner(executor)(fileset("nano_dy"), treename="Events", processor_instance=MetMuons())
    assert any("failed as a whole" in note for note in info.value.__notes__)
    assert executor.report.last.error.startswith("NoWorkersError")


def square_or_fail(i: int) -> dict[str, int]:
    return {"sum": i * i, "n": 1}


class SquareOrFailAt:
    def __init__(self, bad: int) -> None:
        self.bad = bad

    def __call__(self, i: int) -> dict[str, int]:
        if i == self.bad:
            raise KeyError(f"item {i}")
        return square_or_fail(i)


def garble_baskets(src: Path, dst: Path, branches: tuple[str, ...]) -> None:
    """A copy of ``src`` whose baskets of ``branches`` are overwritten: metadata reads, the
    data does not (uproot raises DeserializationError)."""
    shutil.copy(src, dst)
    tree = uproot.open(src)["Events"]
    with open(dst, "r+b") as out:
        for name in branches:
            branch = tree[name]
            for seek, size in zip(branch.member("fBasketSeek"), branch.member("fBasketBytes"),
                                  strict=True):
                if size:
                    out.seek(int(seek))
                    out.write(b"\xa5" * int(size))


def bad_files(tmp_path: Path) -> dict[str, Path]:
    good = coffea_sample("nano_dy")
    corrupt, truncated = tmp_path / "corrupt.root", tmp_path / "truncated.root"
    garble_baskets(good, corrupt, ("MET_pt", "nMuon", "Muon_pt"))
    shutil.copy(good, truncated)
    with open(truncated, "r+b") as f:
        f.truncate(good.stat().st_size // 2)
    return {"corrupt": corrupt, "truncated": truncated, "missing": tmp_path / "missing.root"}


@pytest.mark.taskvine
def test_skipbadfiles_skips_and_reports_bad_files(cluster: Any, tmp_path: Path) -> None:
    bad = bad_files(tmp_path)
    good = str(coffea_sample("nano_dy"))
    files = {"nano_dy": [good, *(str(p) for p in bad.values())]}
    ref = runner(iterative())({"nano_dy": [good]}, treename="Events",
                              processor_instance=MetMuons())

    executor = on(cluster, retries=1)
    with pytest.warns(BadFilesSkippedWarning) as caught:
        out = runner(executor, skipbadfiles=True)(files, treename="Events",
                                                  processor_instance=MetMuons())
    assert_same(out, ref)
    assert set(executor.report.skipped_files) == {str(p) for p in bad.values()}
    messages = " ".join(str(w.message) for w in caught)
    assert str(bad["corrupt"]) in messages and "corrupt" in messages
    calls = {c.desc: c for c in executor.report.calls}
    # the corrupt file's metadata reads: it is skipped while processing, without retries
    assert [f.filename for f in calls["Processing"].skipped] == [str(bad["corrupt"])]
    assert calls["Processing"].skipped[0].attempts == 1


@pytest.mark.taskvine
def test_skipbadfiles_wider_than_coffeas_own(cluster: Any, tmp_path: Path) -> None:
    """Errors coffea's skipbadfiles lets through (coffea#1382): corrupt data and an XRootD
    error that is only the __context__ of the exception that reaches the executor."""
    bad = bad_files(tmp_path)
    good = str(coffea_sample("nano_dy"))
    twin = tmp_path / "twin.root"
    shutil.copy(good, twin)
    for files, proc in (({"nano_dy": [good, str(bad["corrupt"])]}, MetMuons()),
                        ({"nano_dy": [good, str(twin)]}, MetMuons(xrootd_error_in="twin.root"))):
        with pytest.raises(Exception, match="Failed processing file"):
            runner(processor.IterativeExecutor(status=False, retries=0), skipbadfiles=True)(
                files, treename="Events", processor_instance=proc)
        executor = on(cluster, retries=0)
        with pytest.warns(BadFilesSkippedWarning):
            out = runner(executor, skipbadfiles=True)(files, treename="Events",
                                                      processor_instance=proc)
        assert out["nano_dy"]["events"] == 40
        assert len(executor.report.skipped_files) == 1


@pytest.mark.taskvine
def test_without_skipbadfiles_a_bad_file_is_an_error(cluster: Any, tmp_path: Path) -> None:
    corrupt = bad_files(tmp_path)["corrupt"]
    good = str(coffea_sample("nano_dy"))
    executor = on(cluster, retries=0)
    with pytest.raises(Exception, match="Failed processing file") as info:
        runner(executor)({"nano_dy": [good, str(corrupt)]}, treename="Events",
                         processor_instance=MetMuons())
    assert type(info.value.__cause__).__name__ == "DeserializationError"
    assert info.value.partial_output["nano_dy"]["events"] == 40


@pytest.mark.taskvine
@pytest.mark.xcache
def test_skipbadfiles_real_xrootd_failure(tmp_path: Path) -> None:
    """Preprocess through a real XCache shard, stop it, then process: the shard's files fail
    with the XRootD client's own errors and are skipped; the local file is processed."""
    from tests.fixtures_xcache import xcache_missing

    why = xcache_missing()
    if why:
        pytest.skip(why)
    # Importing datavine.io.xcache sets the XRootD client's fast-failover environment; workers
    # started after it inherit it (the session cluster may predate it: the client would
    # retry a dead server for minutes).
    import tempfile

    import datavine
    from datavine.io.xcache.testbed import XCacheTestbed

    served = Path(tempfile.mkdtemp(prefix="datavine-coffea-xrd-"))
    manager = datavine.ManagerConfig(run_dir=tmp_path / "manager")
    try:
        served.chmod(0o755)
        remote = served / "nano_tt_v12.root"
        shutil.copy(coffea_sample("nano_tt_v12"), remote)
        remote.chmod(0o644)
        with XCacheTestbed(served, n_shards=1) as testbed, \
                datavine.LocalCluster(workers=2, cores=1, manager=manager) as cluster:
            url = f"{testbed.shard_map().shards[0].url}//nano_tt_v12.root"
            files = {"dy": [str(coffea_sample("nano_dy"))], "tt": [url]}
            run = runner(on(cluster, retries=1), skipbadfiles=True, xrootdtimeout=5)
            chunks = list(run.preprocess(files, treename="Events"))
            assert {c.filename for c in chunks} == {*files["dy"], url}
            testbed.stop_shard(0)
            executor = on(cluster, retries=1)
            with pytest.warns(BadFilesSkippedWarning):
                out = runner(executor, skipbadfiles=True, xrootdtimeout=5)(
                    chunks, processor_instance=MetMuons())
    finally:
        shutil.rmtree(served, ignore_errors=True)
    assert set(out) == {"dy"} and out["dy"]["events"] == 40
    skipped = executor.report.last.skipped
    assert {f.filename for f in skipped} == {url} and len(skipped) == 2
    assert all(f.reason == "xrootd" and f.attempts == 2 for f in skipped)


# ---------------------------------------------------------------------------------------
# pure logic


def test_classify_follows_context_and_messages() -> None:
    try:
        try:
            raise OSError("XRootD error: [ERROR] Socket timeout")
        except OSError:
            raise RuntimeError("materialize failed") from None
    except RuntimeError as exc:
        wrapped = Exception("Failed processing file")
        wrapped.__cause__ = exc
    assert [type(e).__name__ for e in exception_chain(wrapped)] == [
        "Exception", "RuntimeError", "OSError"]
    assert classify(wrapped, True).bad_file and classify(wrapped, True).reason == "xrootd"
    assert classify(wrapped, (OSError,)).bad_file
    assert not classify(wrapped, False).bad_file
    assert not classify(wrapped, (KeyError,)).bad_file
    quoted = Exception("Failed: OSError('[FATAL] Connection error')")
    assert classify(quoted, True).bad_file
    assert not classify(ValueError("a bug in the analysis"), True).bad_file
    assert classify(ValueError("a bug in the analysis"), True).retryable


def raised_in(filename: str, exc: BaseException) -> BaseException:
    """``exc`` as raised by a function whose code lives in ``filename``."""
    namespace: dict[str, Any] = {}
    exec(compile("def read(exc):\n    raise exc\n", filename, "exec"), namespace)
    try:
        namespace["read"](exc)
    except BaseException as raised:
        return raised
    raise AssertionError("not raised")


def test_a_closed_handle_in_the_xrootd_client_is_an_xrootd_error() -> None:
    """fsspec-xrootd caches open handles; once their server is gone, a long-lived worker gets
    ``ValueError: I/O operation on closed file`` from inside the XRootD client."""
    client = "/venv/lib/python3.11/site-packages/XRootD/client/file.py"
    stale = raised_in(client, ValueError("I/O operation on closed file"))
    wrapped = Exception("Failed to open file")
    wrapped.__cause__ = stale
    assert is_input_error(stale) and not is_input_error(wrapped)
    assert classify(wrapped, True).bad_file and classify(wrapped, True).reason == "xrootd"
    assert classify(wrapped, (OSError,)).bad_file
    bug = raised_in("/work/analysis/processor.py", ValueError("I/O operation on closed file"))
    assert not is_input_error(bug) and not classify(bug, True).bad_file


def test_classify_corrupt_data_is_bad_and_not_retryable() -> None:
    import zlib

    try:
        zlib.decompress(b"not zlib data")
    except zlib.error as exc:
        verdict = classify(exc, True)
    assert verdict.bad_file and not verdict.retryable and verdict.reason == "corrupt"
    truncated = OSError("expected Chunk of length 146,\nreceived 0 bytes from FSSpecSource")
    assert classify(truncated, True).bad_file and not classify(truncated, True).retryable
    group = ExceptionGroup("several", [ValueError("x"), FileNotFoundError("gone.root")])
    assert classify(group, True).bad_file


def test_unwrap_runner_retries_and_policy() -> None:
    run = processor.Runner(executor=DatavineExecutor(retries=2), skipbadfiles=(OSError,),
                           use_result_type=True)
    import functools

    wrapped = functools.partial(run.automatic_retries, run.retries, run.skipbadfiles,
                                square_or_fail, use_result_type=True)
    inner, settings = unwrap_automatic_retries(wrapped)
    assert inner is square_or_fail
    assert settings == {"retries": 2, "skipbadfiles": (OSError,), "use_result_type": True}
    _, policy = DatavineExecutor(compression=None).item_policy(wrapped)
    assert policy == ItemPolicy(retries=2, skipbadfiles=(OSError,), report_skippable=True,
                                retry_delay_s=0.5, compression=None)
    assert unwrap_automatic_retries(square_or_fail) == (square_or_fail, {})


def test_copy_keeps_fields_and_shares_the_report() -> None:
    executor = DatavineExecutor(workers=3, merge_fanin=4, retries=1, skipbadfiles=True)
    copy = executor.copy(desc="Preprocessing", unit="file", compression=None,
                         function_name="get_metadata")
    assert (copy.workers, copy.merge_fanin, copy.retries, copy.skipbadfiles) == (3, 4, 1, True)
    assert copy.report is executor.report and copy.desc == "Preprocessing"
    with pytest.raises(ValueError, match="merge_fanin"):
        DatavineExecutor(merge_fanin=1)
    with pytest.raises(TypeError, match="cluster"):
        DatavineExecutor(cluster=object())


def test_merge_tree_shape() -> None:
    graph, final = build_graph(list(range(10)), square_or_fail, ItemPolicy(), 3, "P")
    items = [k for k in graph if k[0] == "P-item"]
    merges = [k for k in graph if k[0] == "P-merge"]
    assert len(items) == 10 and len(merges) == 4 + 2 + 1
    assert final == merges[-1] and graph[final][1] == [k for k in merges if k[2] == 1]
    single, key = build_graph([5], square_or_fail, ItemPolicy(), 3, "P")
    assert list(single) == [key] and key[0] == "P-item"


def test_item_failed_error_when_exception_cannot_travel() -> None:
    from datavine.coffea.tasks import ItemFailure

    class Unpicklable(Exception):
        def __init__(self, a: int, b: int) -> None:
            super().__init__(f"{a}/{b}")

    failure = ItemFailure.capture(3, "item", Unpicklable(1, 2), 1, False, "")
    exc = failure.to_exception()
    assert isinstance(exc, ItemFailedError) and "1/2" in str(exc)
