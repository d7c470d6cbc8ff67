"""The coffea integration's pure and client-side parts, without workers.

What modules need to travel by value (asked of a real fresh interpreter), how coffea's item
functions are rewritten (handler, re-pickled processor), which errors are permanent, the
X509 proxy lookup, the embedded-cluster holder, and progress bookkeeping.
"""

from __future__ import annotations

import errno
import functools
import importlib
import sys
from pathlib import Path
from typing import Any

import pytest

pytest.importorskip("coffea")

import cloudpickle
import lz4.frame
from coffea import processor

from datavine.coffea import DatavineSource, classify, prepare
from datavine.coffea.badfiles import missing_module, permanent_reason
from datavine.coffea.executor import build_graph
from datavine.coffea.progress import CallProgress
from datavine.coffea.session import EmbeddedCluster
from datavine.coffea.tasks import ItemPolicy, Partial, WorkerImportError
from datavine.io.samples import coffea_sample

pytestmark = [pytest.mark.coffea]


def write_module(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, name: str) -> Any:
    (tmp_path / f"{name}.py").write_text("def double(x):\n    return 2 * x\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    return importlib.import_module(name)


def test_modules_a_fresh_interpreter_cannot_import_travel_by_value(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    module = write_module(tmp_path, monkeypatch, "dv_units_helpers")
    assert prepare.needs_by_value(["dv_units_helpers.sub", "numpy.linalg", "os",
                                   "coffea.processor"]) == ["dv_units_helpers"]
    function = functools.partial(module.double)
    _, modules = prepare.referenced_modules(cloudpickle.dumps(function))
    assert "dv_units_helpers" in modules
    shipped, registered = prepare.ship_code(function)
    assert registered == ["dv_units_helpers"] and shipped is function
    assert "dv_units_helpers" in prepare.by_value_modules()
    monkeypatch.delitem(sys.modules, "dv_units_helpers")
    assert cloudpickle.loads(cloudpickle.dumps(function))(21) == 42  # by value now


def test_coffea_processor_is_pickled_again_and_reads_get_the_handler(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    (tmp_path / "dv_units_proc.py").write_text(
        "from coffea import processor\n\n"
        "class P(processor.ProcessorABC):\n"
        "    def process(self, events):\n        return {}\n\n"
        "    def postprocess(self, acc):\n        return acc\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    module = importlib.import_module("dv_units_proc")
    blob = lz4.frame.compress(cloudpickle.dumps(module.P()))
    assert b"dv_units_proc" in lz4.frame.decompress(blob)  # by reference, as Runner made it
    work = functools.partial(processor.Runner._work_function, "root", 60, None, False, False,
                             processor_instance=blob, uproot_options={"timeout": 5})
    shipped, registered = prepare.ship_code(work)
    assert registered == ["dv_units_proc"]
    again = lz4.frame.decompress(shipped.keywords["processor_instance"])
    assert again != lz4.frame.decompress(blob)  # the class itself now travels
    read = prepare.with_datavine_reads(shipped)
    assert read.keywords["uproot_options"] == {"timeout": 5, "handler": DatavineSource}
    assert work.keywords["uproot_options"] == {"timeout": 5}  # the user's dict is untouched
    chosen = functools.partial(work.func, *work.args, **{
        **work.keywords, "uproot_options": {"handler": "mine"}})
    assert prepare.with_datavine_reads(chosen) is chosen
    meta = functools.partial(processor.Runner.metadata_fetcher_root, 60, False, {})
    assert prepare.with_datavine_reads(meta).args[2] == {"handler": DatavineSource}


def test_paths_made_absolute_and_missing_files_found(tmp_path: Path,
                                                     monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(tmp_path)
    (tmp_path / "here.root").write_bytes(b"x")
    meta = processor.executor.FileMeta("d", "here.root", "Events")
    item = processor.executor.WorkItem("d", "gone.root", "Events", 0, 10, b"")
    remote = processor.executor.WorkItem("d", "root://host//a.root", "Events", 0, 10, b"")
    out = prepare.absolute_paths([meta, item, remote])
    assert out[0] is meta and meta.filename == str(tmp_path / "here.root")
    assert out[1].filename == str(tmp_path / "gone.root") and out[2] is remote
    assert prepare.missing_local_files(out) == [(1, out[1])]


def test_permanent_and_import_errors() -> None:
    assert permanent_reason(FileNotFoundError(errno.ENOENT, "x", "a.root")) == "missing"
    assert permanent_reason(PermissionError("x")) == "permission"
    xrd = OSError("XRootD error: [ERROR] Server responded with an error: [3011] No such file")
    assert permanent_reason(xrd) == "missing"
    verdict = classify(xrd, True)
    assert verdict.bad_file and not verdict.retryable
    wrapped = Exception("Failed to open file")
    wrapped.__cause__ = ModuleNotFoundError("No module named 'mine'", name="mine")
    assert missing_module(wrapped) == "mine"
    assert classify(wrapped, True).load_error and not classify(wrapped, True).bad_file
    error = WorkerImportError.of(wrapped, "item", 3)
    assert error.module == "mine" and "pickle_by_value=('mine',)" in str(error)
    assert cloudpickle.loads(cloudpickle.dumps(error)).module == "mine"
    flaky = OSError("XRootD error: [ERROR] Operation expired")
    assert classify(flaky, True).retryable


def test_x509_proxy_found_as_coffea_finds_it(tmp_path: Path,
                                             monkeypatch: pytest.MonkeyPatch) -> None:
    proxy = tmp_path / "proxy"
    proxy.write_text("p")
    monkeypatch.setenv("TMPDIR", str(tmp_path))
    monkeypatch.delenv("X509_USER_PROXY", raising=False)
    import os

    default = tmp_path / f"x509up_u{os.getuid()}"
    assert prepare.find_x509_proxy(None) is None
    default.write_text("d")
    assert prepare.find_x509_proxy(None) == default
    monkeypatch.setenv("X509_USER_PROXY", str(proxy))
    assert prepare.find_x509_proxy(None) == proxy
    assert prepare.find_x509_proxy(False) is None
    with pytest.raises(FileNotFoundError, match="x509_proxy"):
        prepare.find_x509_proxy(str(tmp_path / "nope"))


def test_embedded_cluster_holder_starts_once_and_stops() -> None:
    events: list[str] = []

    class Fake:
        def __enter__(self) -> Fake:
            events.append("start")
            return self

        def __exit__(self, *exc: object) -> None:
            events.append("stop")

    holder = EmbeddedCluster()
    first = holder.get(lambda run_dir: Fake())
    assert holder.get(lambda run_dir: Fake()) is first and holder.starts == 1
    holder.close()
    holder.close()
    assert events == ["start", "stop"] and holder.cluster is None
    holder.get(lambda run_dir: Fake())
    del holder
    import gc

    gc.collect()
    assert events == ["start", "stop", "start", "stop"]


def test_progress_counts_and_frontier() -> None:
    chunks = [processor.executor.WorkItem("d", "f.root", "Events", i * 10, i * 10 + 10, b"")
              for i in range(4)]
    graph, _ = build_graph(chunks, len, ItemPolicy(), 2, "P")
    items = [k for k in graph if k[0] == "P-item"]
    merges = [k for k in graph if k[0] == "P-merge"]
    progress = CallProgress(graph, chunks, desc="Processing", unit="events", enabled=False,
                            compression=None)
    assert progress.total == 40
    progress(items[:2], {items[0]: Partial({"n": 10}, 1), items[1]: Partial({"n": 10}, 1)})
    progress([items[2]], {items[2]: Partial({"n": 10}, 1)})
    assert (progress.processed, progress.accumulated) == (30, 0)
    progress([merges[0]], {merges[0]: Partial({"n": 20}, 2)})
    assert (progress.processed, progress.accumulated) == (30, 20)
    finished = progress.finished()
    assert (finished.value, finished.items) == ({"n": 30}, 3)
    assert "30 of 40 events processed" in progress.line()


def test_source_class_by_url() -> None:
    import uproot

    from datavine.coffea.source import source_class

    assert source_class("root://h//a.root") is uproot.XRootDSource
    assert source_class("/data/a.root") is uproot.FSSpecSource
    with uproot.open({str(coffea_sample("nano_dy")): None}, handler=DatavineSource) as f:
        assert f["Events"].num_entries == 40  # outside a bundle: read directly
