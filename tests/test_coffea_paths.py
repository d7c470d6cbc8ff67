"""DatavineExecutor as a new coffea user meets it: paths, local code, errors, one cluster.

Real workers (the session ``cluster``, or the executor's own embedded cluster), coffea's
NanoAOD samples, processors defined in a module written to ``tmp_path`` that only the client
can import (as a file next to a user's script), and errors raised for real (missing files,
a deterministic bug in the processor).
"""

from __future__ import annotations

import gc
import importlib
import os
import shutil
import sys
from pathlib import Path
from typing import Any

import pytest

pytest.importorskip("coffea")

from coffea import processor
from coffea.nanoevents import NanoAODSchema

from datavine.coffea import DatavineExecutor, WorkerImportError
from datavine.io.samples import coffea_sample
from tests.test_coffea_executor import MetMuons, assert_same, iterative, on, runner

pytestmark = [
    pytest.mark.coffea,
    pytest.mark.filterwarnings("ignore:Missing cross-reference"),
    pytest.mark.filterwarnings("ignore:Branch .* already exists"),
    pytest.mark.filterwarnings("ignore:Performed attempt"),
]

USER_MODULE = """
import os

import awkward as ak
from coffea import processor


class CountEvents(processor.ProcessorABC):
    def process(self, events):
        return {"events": len(events), "muons": int(ak.sum(ak.num(events.Muon)))}

    def postprocess(self, accumulator):
        return accumulator


class Shipped(processor.ProcessorABC):
    def process(self, events):
        with open(os.environ["X509_USER_PROXY"]) as proxy, open("corrections.json") as extra:
            mode = os.stat(os.environ["X509_USER_PROXY"]).st_mode & 0o777
            return {"proxy": proxy.read(), "extra": extra.read(), "mode": mode}

    def postprocess(self, accumulator):
        return accumulator
"""


def user_module(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, name: str) -> Any:
    """A module in ``tmp_path`` that this process imports and the workers cannot."""
    (tmp_path / f"{name}.py").write_text(USER_MODULE)
    monkeypatch.syspath_prepend(str(tmp_path))
    module = importlib.import_module(name)
    monkeypatch.delitem(sys.modules, name)  # undone at teardown; this test holds the module
    sys.modules[name] = module
    return module


def own_copy(tmp_path: Path, name: str = "nano_dy") -> Path:
    """A sample under a path of its own (not in coffea's metadata cache)."""
    target = tmp_path / "data" / f"{name}.root"
    target.parent.mkdir(exist_ok=True)
    shutil.copy(coffea_sample(name), target)
    return target


# ---------------------------------------------------------------------------------------
@pytest.mark.taskvine
def test_relative_paths_work_as_with_iterative(cluster: Any, tmp_path: Path,
                                               monkeypatch: pytest.MonkeyPatch) -> None:
    own_copy(tmp_path)
    monkeypatch.chdir(tmp_path)
    files = {"nano_dy": ["data/nano_dy.root"]}
    ref = runner(iterative())(files, treename="Events", processor_instance=MetMuons())
    executor = on(cluster)
    out = runner(executor)(files, treename="Events", processor_instance=MetMuons())
    assert_same(out, ref)
    assert not any(c.failed or c.skipped for c in executor.report.calls)


@pytest.mark.taskvine
def test_missing_local_file_named_at_once(cluster: Any, tmp_path: Path,
                                          monkeypatch: pytest.MonkeyPatch) -> None:
    good = own_copy(tmp_path)
    monkeypatch.chdir(tmp_path)
    files = {"nano_dy": [str(good), "data/missing.root"]}
    executor = on(cluster, retries=3)
    with pytest.raises(FileNotFoundError) as info:
        runner(executor)(files, treename="Events", processor_instance=MetMuons())
    assert info.value.filename == str(tmp_path / "data" / "missing.root")
    assert any("nothing was sent to the workers" in n for n in info.value.__notes__)
    assert executor.report.last.summary is None  # no run started

    skipping = on(cluster, retries=3)
    ref = runner(iterative())({"nano_dy": [str(good)]}, treename="Events",
                              processor_instance=MetMuons())
    with pytest.warns(UserWarning, match="missing.root"):
        out = runner(skipping, skipbadfiles=True)(files, treename="Events",
                                                  processor_instance=MetMuons())
    assert_same(out, ref)
    skipped = skipping.report.calls[0].skipped
    assert [(f.filename, f.reason, f.attempts) for f in skipped] == [
        (str(tmp_path / "data" / "missing.root"), "missing", 0)]


@pytest.mark.taskvine
def test_processor_in_a_local_module_is_sent_by_value(cluster: Any, tmp_path: Path,
                                                      monkeypatch: pytest.MonkeyPatch) -> None:
    module = user_module(tmp_path, monkeypatch, "dv_local_analysis")
    files = {"dy": [str(own_copy(tmp_path))]}
    executor = on(cluster, retries=0)
    out = runner(executor)(files, treename="Events", processor_instance=module.CountEvents())
    assert out == {"events": 40, "muons": 18}
    calls = {c.desc: c for c in executor.report.calls}
    assert calls["Processing"].shipped_by_value == ["dv_local_analysis"]


@pytest.mark.taskvine
def test_worker_that_cannot_load_the_code_stops_the_run(cluster: Any, tmp_path: Path,
                                                        monkeypatch: pytest.MonkeyPatch) -> None:
    """The module is importable by a fresh interpreter here (PYTHONPATH, set after the
    workers started), so it is not sent by value; the workers cannot import it. The first
    item stops the run with an error naming the module and the fix, not coffea's "No
    chunks returned results"."""
    module = user_module(tmp_path, monkeypatch, "dv_client_only")
    monkeypatch.setenv("PYTHONPATH", str(tmp_path))
    files = {"dy": [str(own_copy(tmp_path))]}
    executor = on(cluster, retries=3)
    with pytest.raises(WorkerImportError) as info:
        runner(executor)(files, treename="Events", processor_instance=module.CountEvents())
    message = str(info.value)
    assert info.value.module == "dv_client_only"
    assert "No module named 'dv_client_only'" in message
    assert "pickle_by_value=('dv_client_only',)" in message
    assert executor.report.last.error.startswith("WorkerImportError")


class FailsAlways(processor.ProcessorABC):
    """A processor with a bug (same error every time) or reading a file that is not there."""

    def __init__(self, kind: str) -> None:
        self.kind = kind

    def process(self, events: Any) -> Any:
        if self.kind == "missing":
            with open("/nonexistent/datavine/corrections.json") as f:
                return f.read()
        raise ValueError(f"bug at entry {events.metadata['entrystart']}")

    def postprocess(self, accumulator: Any) -> Any:
        return accumulator


@pytest.mark.taskvine
@pytest.mark.parametrize(("kind", "attempts", "cause"), [
    ("missing", 1, FileNotFoundError), ("bug", 2, ValueError)])
def test_errors_that_do_not_change_are_not_retried(cluster: Any, kind: str, attempts: int,
                                                   cause: type[BaseException]) -> None:
    """A missing file fails once; a user exception stops when raised the same way twice.
    Nothing succeeded, so the item's own error reaches the user (with the item and the
    remote traceback), not coffea's "No chunks returned results"."""
    executor = on(cluster, retries=3)
    files = {"dy": [str(coffea_sample("nano_dy"))]}
    with pytest.raises(Exception, match="Failed processing file") as info:
        runner(executor)(files, treename="Events", processor_instance=FailsAlways(kind))
    assert isinstance(info.value.__cause__, cause)
    notes = "\n".join(info.value.__notes__)
    assert "remote traceback" in notes and "nano_dy.root" in notes
    assert [f.attempts for f in executor.report.last.failed] == [attempts]


@pytest.mark.taskvine
def test_preprocessing_error_keeps_its_cause(cluster: Any, tmp_path: Path) -> None:
    """Without skipbadfiles a file that does not open fails the run with its own error (as
    under coffea's own executors), not "Metadata for file ... could not be accessed"."""
    garbage = tmp_path / "garbage.root"
    garbage.write_bytes(b"this is not a ROOT file" * 100)
    files = {"dy": [str(coffea_sample("nano_dy")), str(garbage)]}
    with pytest.raises(Exception) as expected:
        runner(iterative())(files, treename="Events", processor_instance=MetMuons())
    executor = on(cluster, retries=3)
    with pytest.raises(Exception) as info:
        runner(executor)(files, treename="Events", processor_instance=MetMuons())
    assert type(info.value) is type(expected.value)
    assert str(garbage) in str(info.value)
    assert "could not be accessed" not in str(info.value)
    assert executor.report.last.desc == "Preprocessing"
    assert executor.report.last.failed[0].attempts == 1  # corrupt: not retried


@pytest.mark.taskvine
def test_one_embedded_cluster_per_executor(tmp_path: Path) -> None:
    files = {"dy": [str(own_copy(tmp_path))]}
    executor = DatavineExecutor(status=False, workers=2)
    session = executor.session
    first = runner(executor)(files, treename="Events", processor_instance=MetMuons())
    cluster = session.cluster
    second = runner(executor)(files, treename="Events", processor_instance=MetMuons())
    assert first == second and first["dy"]["events"] == 40
    assert [c.desc for c in executor.report.calls] == ["Preprocessing", "Processing",
                                                       "Processing"]
    assert session.starts == 1 and session.cluster is cluster
    assert all(c.summary.workers == 2 for c in executor.report.calls)
    workers = cluster.workers
    executor.close()
    assert session.cluster is None and cluster.runtime is None and workers.alive() == 0

    with DatavineExecutor(status=False, workers=1) as scoped:  # with-block: started, stopped
        started = scoped.session.cluster
        runner(scoped)(files, treename="Events", processor_instance=MetMuons())
        assert scoped.session.cluster is started
    assert started.runtime is None

    dropped = DatavineExecutor(status=False, workers=1)  # garbage-collected: stopped
    runner(dropped)(files, treename="Events", processor_instance=MetMuons())
    orphan = dropped.session.cluster
    del dropped
    gc.collect()
    assert orphan.runtime is None


@pytest.mark.taskvine
def test_x509_proxy_and_extra_input_files_reach_the_items(cluster: Any, tmp_path: Path,
                                                          monkeypatch: pytest.MonkeyPatch
                                                          ) -> None:
    module = user_module(tmp_path, monkeypatch, "dv_shipped")
    proxy = tmp_path / "x509up_u0"
    proxy.write_text("-----BEGIN CERTIFICATE-----\nproxy\n")
    extra = tmp_path / "corrections.json"
    extra.write_text('{"sf": 1.02}')
    monkeypatch.setenv("X509_USER_PROXY", str(proxy))  # found as coffea finds it
    executor = on(cluster, extra_input_files=(str(extra),))
    files = {"dy": [str(own_copy(tmp_path))]}
    out = processor.Runner(executor=executor, schema=NanoAODSchema, chunksize=10_000)(
        files, treename="Events", processor_instance=module.Shipped())
    assert out == {"proxy": proxy.read_text(), "extra": extra.read_text(), "mode": 0o600}
    assert os.environ["X509_USER_PROXY"] == str(proxy)


@pytest.mark.taskvine
def test_item_function_the_workers_cannot_load_names_the_fix(
        cluster: Any, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """An item function (not a processor) from a module the workers lack: the task does
    not unpickle there; the error says which module and how to send it."""
    from datavine.errors import TaskLoadError

    (tmp_path / "dv_client_only_fn.py").write_text("def square(i):\n    return {'n': i * i}\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.setenv("PYTHONPATH", str(tmp_path))  # a fresh interpreter here finds it
    module = importlib.import_module("dv_client_only_fn")
    monkeypatch.delitem(sys.modules, "dv_client_only_fn")
    sys.modules["dv_client_only_fn"] = module
    executor = on(cluster, retries=3)
    with pytest.raises(TaskLoadError, match="dv_client_only_fn") as info:
        executor(list(range(3)), module.square, None)
    assert any("DatavineExecutor(pickle_by_value=('dv_client_only_fn',))" in note
               for note in info.value.__notes__)


EXIT_SCRIPT = """
import warnings
from coffea import processor
from coffea.nanoevents import NanoAODSchema
from datavine.coffea import DatavineExecutor
from datavine.io.samples import coffea_sample

class Count(processor.ProcessorABC):
    def process(self, events):
        return {"events": len(events)}

    def postprocess(self, accumulator):
        return accumulator

warnings.simplefilter("ignore")
executor = DatavineExecutor(workers=2, status=False)
run = processor.Runner(executor=executor, schema=NanoAODSchema)
out = run({"dy": [str(coffea_sample("nano_dy"))]}, treename="Events", processor_instance=Count())
print("events", out["events"])
print("workers", *[p.pid for p in executor.session.cluster.workers.procs])
"""


@pytest.mark.taskvine
def test_embedded_cluster_stopped_at_interpreter_exit(tmp_path: Path) -> None:
    """A script that never closes its executor leaves no worker behind when it exits."""
    import subprocess

    script = tmp_path / "analysis.py"
    script.write_text(EXIT_SCRIPT)
    done = subprocess.run([sys.executable, str(script)], capture_output=True, text=True,
                          timeout=300, cwd=tmp_path, check=False)
    assert done.returncode == 0, done.stderr[-3000:]
    lines = dict(line.split(" ", 1) for line in done.stdout.splitlines() if " " in line)
    assert lines["events"] == "40"
    sessions = [int(pid) for pid in lines["workers"].split()]
    assert len(sessions) == 2
    assert live_in_sessions(sessions) == []  # zombies, not yet reaped by init, are gone


def live_in_sessions(sessions: list[int]) -> list[str]:
    """Processes (not zombies) in the given sessions: each worker starts one of its own."""
    live = []
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            text = stat.read_text()
        except OSError:
            continue
        fields = text.rsplit(")", 1)[1].split()  # after "pid (comm)": state ppid pgrp session
        if int(fields[3]) in sessions and fields[0] != "Z":
            live.append(text[:80])
    return live
