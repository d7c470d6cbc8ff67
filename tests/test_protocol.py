"""The wire between manager and workers (:mod:`datavine.protocol`): records round-trip, and a
record from another datavine -- another protocol version, a field missing, unknown or of
the wrong type -- is a ProtocolError that names the field and the worker, on either side."""

from __future__ import annotations

import ast
import pickle
import sys
from dataclasses import replace
from pathlib import Path
from typing import Any

import cloudpickle
import pytest

import datavine.protocol as protocol
from datavine.config import RunConfig
from datavine.protocol import (
    PROTOCOL,
    BundleResult,
    BundleSpec,
    Pickled,
    ProtocolError,
    Status,
    loaded,
)
from datavine.scheduler import graph as graphs
from datavine.scheduler.learned import Learned
from datavine.scheduler.lifecycle import Phase
from datavine.scheduler.run_messages import CallDone, Fail, Submit, Tick
from datavine.scheduler.run_state import RunState
from datavine.worker import remote

CFG = RunConfig(memory=None, max_bundle_tasks=1, target_bundle_s=1e-6, bundles_per_slot=1)


def double(x: int) -> int:
    return 2 * x


def a_result(**fields: Any) -> BundleResult:
    return BundleResult(Status.OK, values={("x", 0): b"\x80\x04K\x01."}, stored={"y": 10},
                        timing={"x": (1, 0.25)}, reads=[{"lfn": "/a.root", "bytes": 5}],
                        peak_mb=12.5, worker="w-3", rack="A", host="a1.box", pid=42,
                        wall_s=0.3, **fields)


def test_a_result_and_a_spec_round_trip() -> None:
    result = a_result()
    wire = result.encode()
    assert wire["protocol"] == PROTOCOL and wire["status"] == "ok"
    assert type(wire["status"]) is str  # no datavine class on the wire but the payload's
    assert BundleResult.decode(wire) == result
    spec = BundleSpec(nodes=[("x", None)], inputs={"a": [1]}, outputs=["x"],
                      categories={"x": "double"}, limits={"x": 2.0}, inline_max=10)
    assert BundleSpec.decode(spec.encode()) == spec


def test_a_result_lacking_a_field_names_the_field_and_the_worker() -> None:
    wire = a_result().encode()
    del wire["stored"]
    with pytest.raises(ProtocolError) as info:
        BundleResult.decode(wire, "10.0.0.1:9000")
    assert str(info.value) == f"result from worker w-3 lacks field 'stored' (protocol {PROTOCOL})"
    wire["stored"], wire["worker"] = {}, None  # a worker without a name: its address
    del wire["timing"]
    with pytest.raises(ProtocolError, match=r"worker 10\.0\.0\.1:9000 lacks field 'timing'"):
        BundleResult.decode(wire, "10.0.0.1:9000")


@pytest.mark.parametrize(("change", "says"), [
    ({"protocol": PROTOCOL + 1}, f"speaks protocol {PROTOCOL + 1}, this side protocol {PROTOCOL}"),
    ({"protocol": None}, "speaks protocol None"),
    ({"colour": "red"}, "has unknown field 'colour'"),
    ({"peak_mb": "lots"}, "field 'peak_mb' is str 'lots', not float"),
    ({"peak_mb": True}, "field 'peak_mb' is bool True, not float"),
    ({"status": "melted"}, "field 'status' is 'melted', not one of ok, error, memory"),
    ({"values": {"x": "not bytes"}}, "field 'values' is dict"),
    ({"timing": {"x": [1, 0.5]}}, "field 'timing' is dict"),
    ({"pid": 4.5}, "field 'pid' is float 4.5, not int"),
    ({"pid": True}, "field 'pid' is bool True, not int"),
    ({"host": None}, "field 'host' is NoneType None, not str"),
    ({"rack": 3}, "field 'rack' is int 3, not str | None"),
    ({"exception": "boom"}, "field 'exception' is str 'boom', not bytes | None"),
])
def test_a_result_of_another_datavine_is_refused(change: dict[str, Any], says: str) -> None:
    wire = {**a_result().encode(), **change}
    with pytest.raises(ProtocolError, match="result from worker w-3") as info:
        BundleResult.decode(wire)
    assert says in str(info.value)


def test_a_record_without_a_version_or_not_a_record_is_refused() -> None:
    old = {"status": "ok", "values": {}}  # what a datavine before the protocol sent
    with pytest.raises(ProtocolError, match="names no protocol version"):
        BundleResult.decode(old, "10.0.0.2:1")
    with pytest.raises(ProtocolError, match="bundle spec from the manager is a list"):
        BundleSpec.decode([("x", None)])


def test_an_int_passes_for_a_float_and_none_for_an_optional() -> None:
    wire = {**a_result().encode(), "peak_mb": 100, "cap_mb": None, "limit_s": 3}
    result = BundleResult.decode(wire)
    assert result.peak_mb == 100 and result.cap_mb is None and result.limit_s == 3


def test_the_worker_runs_a_spec_and_answers_an_encoded_result() -> None:
    from dask._task_spec import Task

    spec = BundleSpec(nodes=[("y", Task("y", double, 21))], outputs=["y"],
                      categories={"y": "double"})
    wire = remote.run_bundle(cloudpickle.dumps(spec.encode()))
    result = BundleResult.decode(wire, "here")
    assert result.ok and cloudpickle.loads(result.values["y"]) == 42
    count, seconds = result.timing["double"]
    assert count == 1 and seconds >= 0 and result.host and result.pid


def test_the_worker_answers_a_spec_it_cannot_read_with_a_protocol_status() -> None:
    wire = {**BundleSpec().encode(), "protocol": PROTOCOL + 1}
    result = remote.execute_payload(cloudpickle.dumps(wire))
    assert result.status is Status.PROTOCOL
    assert f"bundle spec from the manager speaks protocol {PROTOCOL + 1}" in result.message
    old = {"nodes": [], "inputs": {}, "outputs": [], "categories": {}}  # before the protocol
    assert remote.execute_payload(cloudpickle.dumps(old)).status is Status.PROTOCOL


def first_submit(state: RunState) -> Submit:
    (submit,) = [i for i in state.handle(Tick(0.1, 1, 1)) if isinstance(i, Submit)]
    return submit


def test_the_run_fails_naming_the_worker_that_could_not_read_its_bundle() -> None:
    state = RunState(graphs.build({"x": (double, 1)}, ["x"]), CFG, Learned.fresh(CFG), now=0.0)
    submit = first_submit(state)
    refused = BundleResult(Status.PROTOCOL, worker="w-3", host="a1.box",
                           message="bundle spec from the manager speaks protocol 7, this side "
                                   "protocol 1")
    (fail,) = [i for i in state.handle(CallDone(submit.call, refused, "10.0.0.1:1", 0.5))
               if isinstance(i, Fail)]
    assert isinstance(fail.error, ProtocolError)
    assert "worker w-3 (a1.box) could not read bundle" in str(fail.error)
    assert "speaks protocol 7" in str(fail.error)
    assert any("story of bundle" in note for note in fail.error.__notes__)
    assert state.life.phase(0) is Phase.FAILED


def test_an_unreadable_result_fails_the_run_with_the_field_and_the_story() -> None:
    state = RunState(graphs.build({"x": (double, 1)}, ["x"]), CFG, Learned.fresh(CFG), now=0.0)
    submit = first_submit(state)
    wire = a_result().encode()
    del wire["stored"]
    done = CallDone.received(submit.call, wire, "10.0.0.1:1", 0.5)
    assert done.result is None and done.unreadable is not None
    (fail,) = [i for i in state.handle(done) if isinstance(i, Fail)]
    assert str(fail.error) == f"result from worker w-3 lacks field 'stored' (protocol {PROTOCOL})"
    (note,) = fail.error.__notes__
    assert "sent -> failed [protocol]" in note and "'x'" in note
    state.close()
    state.validate()


def test_a_decoded_result_is_taken_as_the_worker_sent_it() -> None:
    state = RunState(graphs.build({"x": (double, 1)}, ["x"]), CFG, Learned.fresh(CFG), now=0.0)
    submit = first_submit(state)
    result = replace(a_result(), values={"x": cloudpickle.dumps(2)}, stored={})
    done = CallDone.received(submit.call, result.encode(), "10.0.0.1:1", 0.5)
    assert done.result == result
    state.handle(done)
    assert state.results() == {"x": 2}


def test_the_protocol_module_imports_only_the_standard_library_and_datavine_errors() -> None:
    tree = ast.parse(Path(protocol.__file__).read_text())
    modules = {alias.name for node in ast.walk(tree) if isinstance(node, ast.Import)
               for alias in node.names}
    modules |= {node.module for node in ast.walk(tree)
                if isinstance(node, ast.ImportFrom) and node.module}
    outside = {m for m in modules if m.split(".")[0] not in sys.stdlib_module_names
               and m != "__future__"}
    assert outside == {"datavine.errors"}


def test_a_pickled_value_travels_as_its_bytes_and_loads_once() -> None:
    """A value kept as its pickle is carried inside another pickle as those bytes, and
    read back as the value; loading it at the manager gives one object, however often."""
    blob = pickle.dumps({"bins": [1, 2, 3]}, protocol=5)
    kept = Pickled(blob)
    outer = pickle.dumps({"inputs": {"x": kept}}, protocol=5)
    assert blob in outer
    assert pickle.loads(outer) == {"inputs": {"x": {"bins": [1, 2, 3]}}}
    assert kept.load() is kept.load() and loaded(kept) is kept.load()
    assert loaded(5) == 5
