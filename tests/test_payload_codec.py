"""A bundle's call on the wire (:mod:`datavine.worker.payload`): payloads that carry a run's
functions pickled once, decoded as before, never served stale to a later run; the result as
the call's reply; and both through real TaskVine calls."""

from __future__ import annotations

import binascii
import os
import pickle
import time
from pathlib import Path
from types import FunctionType
from typing import cast

import cloudpickle
import pytest
from dask._task_spec import Task

from datavine.manager.bundle_calls import Ended
from datavine.manager.taskvine_port import REPLY_FILE, finished
from datavine.protocol import BundleResult, BundleSpec, Status
from datavine.worker import payload, remote


def by_value(source: str, **names: object) -> FunctionType:
    """A function cloudpickle sends by value (its module cannot be imported), with the
    globals ``names`` (read by value when it is pickled)."""
    space: dict[str, object] = {"__name__": "datavine_test_not_importable", **names}
    exec(source, space)
    return cast(FunctionType, space["f"])


class Counted:
    """cloudpickle.dumps, counting the calls."""

    def __init__(self) -> None:
        self.calls = 0
        self.dumps = cloudpickle.dumps

    def __call__(self, obj: object, *args: object, **kwargs: object) -> bytes:
        self.calls += 1
        return self.dumps(obj, *args, **kwargs)


def spec_of(key: str, func: FunctionType, *args: object) -> dict[str, object]:
    return BundleSpec(nodes=[(key, Task(key, func, *args))], outputs=[key]).encode()


def test_a_run_pickles_a_function_once_and_its_payloads_decode_as_before(
        monkeypatch: pytest.MonkeyPatch) -> None:
    f = by_value("def f(x):\n    return SCALE * x\n", SCALE=2)
    counted = Counted()
    monkeypatch.setattr(payload.cloudpickle, "dumps", counted)
    encoder = payload.BundleEncoder()
    blobs = [encoder.dumps(spec_of("k0", f, 0))]
    once = counted.calls  # the function and the task's class, each pickled once
    assert once == encoder.known == 2
    blobs += [encoder.dumps(spec_of(f"k{i}", f, i)) for i in range(1, 5)]
    assert counted.calls == once  # not again for the run's later bundles
    for i, blob in enumerate(blobs):
        spec = BundleSpec.decode(payload.decode(blob))
        assert spec.keys == [f"k{i}"]
        ((_, node),) = spec.nodes
        assert node({}) == 2 * i
    # the payload as it was before (one cloudpickle of the whole record) reads the same
    old = BundleSpec.decode(payload.decode(cloudpickle.dumps(spec_of("k", f, 7))))
    assert old.nodes[0][1]({}) == 14


def test_the_worker_loads_a_runs_function_once() -> None:
    f = by_value("def f(x):\n    return x + 1\n")
    encoder = payload.BundleEncoder()
    first = payload.decode(encoder.dumps(spec_of("a", f, 1)))
    second = payload.decode(encoder.dumps(spec_of("b", f, 2)))
    node_a = cast("list[tuple[str, Task]]", first["nodes"])[0][1]
    node_b = cast("list[tuple[str, Task]]", second["nodes"])[0][1]
    assert node_a.func is node_b.func  # one object on the worker


def test_a_function_changed_for_a_second_run_is_not_served_stale() -> None:
    space: dict[str, object] = {"__name__": "datavine_test_not_importable", "SCALE": 2}
    exec("def f(x):\n    return SCALE * x\n", space)
    f = cast(FunctionType, space["f"])
    run1 = payload.BundleEncoder()
    one = payload.decode(run1.dumps(spec_of("a", f, 10)))
    space["SCALE"] = 3  # the same function object, a global it reads changed
    run2 = payload.BundleEncoder()
    two = payload.decode(run2.dumps(spec_of("a", f, 10)))
    redefined = by_value("def f(x):\n    return x - 1\n")
    three = payload.decode(run2.dumps(spec_of("b", redefined, 10)))
    values = [cast("list[tuple[str, Task]]", p["nodes"])[0][1]({})
              for p in (one, two, three)]
    assert values == [20, 30, 9]


def test_the_worker_keeps_a_bounded_number_of_objects(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(payload, "WORKER_KEEPS", 3)
    monkeypatch.setattr(payload, "_SHARED", type(payload._SHARED)())
    blob = cloudpickle.dumps(len)
    for number in range(10):
        assert payload.shared(b"run", number, blob) is len
    assert len(payload._SHARED) == 3


def test_a_result_goes_back_as_the_calls_reply(tmp_path: Path,
                                               monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(tmp_path)
    f = by_value("def f(x):\n    return [x] * 3\n")
    blob = payload.BundleEncoder().dumps(spec_of("k", f, "v"))
    # the result goes once, as the reply: what the library pickles into the call's output
    # file (never fetched) is a mark
    assert remote.run_bundle(blob, reply_file=REPLY_FILE) == remote.REPLIED
    record = payload.read_reply((tmp_path / REPLY_FILE).read_bytes())
    result = BundleResult.decode(record)
    assert result.ok and cloudpickle.loads(result.values["k"]) == ["v"] * 3
    # no reply file named (a test, the bindings' warm-up call): nothing written
    os.remove(REPLY_FILE)
    assert BundleResult.decode(remote.run_bundle(blob)).ok
    assert not (tmp_path / REPLY_FILE).exists()


def test_a_reply_over_taskvines_limit_becomes_an_error(tmp_path: Path,
                                                       monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(tmp_path)
    monkeypatch.setattr(payload, "REPLY_MAX", 2000)
    record = BundleResult(Status.OK, values={"k": b"x" * 4000}, worker="w-1").encode()
    assert remote.reply(record, REPLY_FILE) is record
    sent = BundleResult.decode(payload.read_reply((tmp_path / REPLY_FILE).read_bytes()))
    assert sent.status is Status.ERROR and not sent.values
    assert "over TaskVine's" in sent.message and "keep_on_workers" in sent.message


def test_what_the_manager_makes_of_a_calls_end() -> None:
    record = BundleResult(Status.OK, worker="w-1").encode()
    data = payload.reply_bytes(record)
    ok = finished(Ended(7, True, data, "1.2.3.4:5", "h1", "success", 0))
    assert (ok.id, ok.result, ok.addrport, ok.failure) == (7, record, "1.2.3.4:5", "")
    empty = finished(Ended(8, True, None, "1.2.3.4:5", "h1", "success", 0))
    assert empty.result is None and "no result from the library on h1" in empty.failure
    cut = finished(Ended(9, True, data[: len(data) // 2], None, "h1", "success", 0))
    assert cut.result is None and "does not read" in cut.failure
    died = finished(Ended(10, False, None, None, "h2", "forsaken", 1))
    assert died.failure == "TaskVine result 'forsaken' on h2 (exit 1)"


def test_a_reply_is_the_pickle_behind_a_head_naming_its_length() -> None:
    """No base64: a reply over TaskVine's 1 KB is the result's pickle and a head of a few
    bytes (NUL bytes and all, as a binary value's pickle holds them); one under it goes
    without NUL bytes (the worker sends it as a C string); an earlier datavine's base64
    still reads."""
    value = bytes(range(256)) * 64  # NUL bytes and every other
    record = BundleResult(Status.OK, values={"k": value}, worker="w-1").encode()
    data = payload.reply_bytes(record)
    blob = pickle.dumps(record, protocol=pickle.HIGHEST_PROTOCOL)
    head = payload.reply_frame(data[:payload.REPLY_HEAD_MAX])
    assert head is not None and head[1] == len(blob) and data[head[0]:] == blob
    assert len(data) - len(blob) < payload.REPLY_HEAD_MAX and b"\0" not in data[:head[0]]
    assert payload.read_reply(data) == record
    assert payload.read_reply(binascii.b2a_base64(blob, newline=False).decode()) == record
    for not_a_head in (b"", b"DVR1 \n", b"DVR1 12", b"DVR1 x\n", b"gASV", b"DVR1 %d\n" % (
            payload.REPLY_MAX + 1)):
        assert payload.reply_frame(not_a_head) is None
    with pytest.raises(ValueError, match="names"):
        payload.read_reply(data + b"x")
    small = BundleResult(Status.OK, values={"k": b"\0\1\2\1\0"}, worker="w-1").encode()
    inline = payload.reply_bytes(small)
    assert len(inline) <= payload.INLINE_MAX and b"\0" not in inline
    assert payload.read_reply(inline) == small
    for data in (b"\0\1\2\1\0\1\3\1", bytes(range(256)) * 3, b"", b"\1"):
        assert payload.unescape(payload.escape(data)) == data
        assert b"\0" not in payload.escape(data)


@pytest.mark.taskvine
def test_real_calls_bring_small_and_large_replies_and_a_changed_function(
        tmp_path: Path) -> None:
    """Through real workers: a reply under TaskVine's 1 KB (sent with the completion
    message) and one over it (fetched at the manager's request) both arrive whole; a
    function sent by value and changed for the next run runs as changed."""
    import datavine
    from datavine.config import ManagerConfig, RunConfig

    space: dict[str, object] = {"__name__": "datavine_test_not_importable", "SCALE": 2}
    exec("def f(x):\n    return SCALE * x\n", space)
    f = space["f"]
    big = by_value("def f(n):\n    return bytes(range(256)) * n\n")
    with datavine.LocalCluster(workers=2, cores=1, run=RunConfig(memory=None),
                               manager=ManagerConfig(run_dir=tmp_path / "run")) as cluster:
        graph: dict[object, object] = {("x", i): (f, i) for i in range(6)}
        graph["big"] = (big, 400)  # ~100 KB: a reply far over 1 KB
        keys = [("x", i) for i in range(6)] + ["big"]
        *small, large = cluster.get(graph, keys)
        assert small == [2 * i for i in range(6)] and large == bytes(range(256)) * 400
        # the replies count as bytes the manager received (TaskVine's counters miss them)
        summary = cluster.last_summary
        assert summary is not None and summary.traffic.manager > len(large), summary.traffic
        # ... as they are: the pickle and a short head, not base64's third more
        assert summary.traffic.manager < 1.2 * len(large), summary.traffic
        space["SCALE"] = 5
        assert cluster.get(graph, [("x", 3)]) == (15,)
        assert cluster.last_summary is not None and not cluster.last_summary.failures


def test_a_queued_capped_bundle_goes_to_the_child_as_the_one_before_it_ends(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The library's hook (patch 0018) reads a queued bundle's call from its infile, as the
    manager wrote it; run_bundle sends it to the capped child as soon as the running one
    came back well, and the queued call's own run_bundle takes its result from there."""
    monkeypatch.setattr(remote, "_CHILD", None)
    f = by_value("def f(x):\n    import os, time\n    return os.getpid(), time.time(), x\n")
    encoder = payload.BundleEncoder()
    sandboxes = []
    for i in range(2):
        sandbox = tmp_path / f"func.{i}"
        sandbox.mkdir()
        event = {"fn_args": (encoder.dumps(spec_of("k", f, i)), 2048.0, (), None, REPLY_FILE),
                 "fn_kwargs": {}}
        (sandbox / "infile").write_bytes(pickle.dumps(event))
        sandboxes.append(sandbox)
    assert payload.call_arguments(str(sandboxes[1]))[0][1] == 2048.0
    assert payload.call_arguments(str(tmp_path / "gone")) is None
    try:
        remote.call_queued(2, "run_bundle", str(sandboxes[1]))  # queued behind the first
        values, asked = [], []
        for sandbox in sandboxes:  # as poncho runs a call: in its sandbox, from its infile
            monkeypatch.chdir(sandbox)
            args = pickle.loads((sandbox / "infile").read_bytes())["fn_args"]
            time.sleep(0.5)  # the library writes the first result out meanwhile
            asked.append(time.time())
            assert remote.run_bundle(*args) == remote.REPLIED
            result = BundleResult.decode(payload.read_reply((sandbox / REPLY_FILE).read_bytes()))
            assert result.ok, result.message
            values.append(cloudpickle.loads(result.values["k"]))
        child = remote._capped_child()
        assert child.sent_ahead == 1 and child.started == 1
        assert [x for _, _, x in values] == [0, 1]
        assert values[0][0] == values[1][0] != os.getpid()  # one capped child ran both
        assert values[1][1] < asked[1]  # the second began before its run_bundle was called
    finally:
        remote._capped_child().close()
