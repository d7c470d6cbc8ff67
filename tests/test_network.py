"""Network faults found during a run (:mod:`datavine.scheduler.network`): the pure decision
(libraries that do not start, shards a worker cannot reach), TaskVine's transactions log read
into library states (:mod:`datavine.manager.library_log`), and the run's state machine
withdrawing the calls of a dropped worker and telling TaskVine what to block."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from datavine.config import ConfigError, RunConfig
from datavine.manager.library_log import LibraryLog, library_event
from datavine.scheduler import graph as graphs
from datavine.scheduler.learned import Learned
from datavine.scheduler.network import (
    ALL_WORKERS,
    LIBRARY_ENDED,
    LIBRARY_SENT,
    LIBRARY_STARTED,
    LibraryState,
    NetworkWatch,
    overdue,
)
from datavine.scheduler.run_messages import (
    CallWithdrawn,
    Network,
    PoolSample,
    Submit,
    Tick,
    Withdraw,
)
from datavine.scheduler.run_state import RunState
from datavine.scheduler.summary import RunSummary

A, B, C = "198.18.11.11:4000", "198.18.12.11:4000", "198.18.12.12:4000"
NAMES = {A: "w-a1", B: "w-b1"}


def sent(since: float, host: str) -> LibraryState:
    return LibraryState(LIBRARY_SENT, since, host)


def started(since: float, host: str) -> LibraryState:
    return LibraryState(LIBRARY_STARTED, since, host)


# --- the decision ------------------------------------------------------------------------
def test_overdue_is_a_library_sent_and_not_started_past_the_bound() -> None:
    libs = {A: sent(0.0, "a1.box"), B: started(0.0, "b1.box"), C: sent(8.0, "b2.box")}
    assert overdue(libs, 10.0, 5.0) == {A}
    assert overdue(libs, 14.0, 5.0) == {A, C}
    assert overdue(libs, 4.0, 5.0) == set()


def test_a_worker_whose_library_does_not_start_is_dropped_then_peers_go_off() -> None:
    watch = NetworkWatch()
    libs = {A: sent(0.0, "a1.box"), B: started(0.5, "b1.box")}
    assert not watch.libraries(libs, 4.0, 5.0, NAMES, 0).for_runtime  # within the bound
    actions = watch.libraries(libs, 6.0, 5.0, NAMES, 0, start=1.0, calls_on={A: 2})
    assert actions.stalled == {A} and actions.block == ("a1.box",) and actions.peers_off
    dropped, off = actions.findings
    assert (dropped.worker, dropped.host) == ("w-a1", "a1.box")
    assert "did not start within 5 s" in dropped.failed
    assert "host blocked" in dropped.done and "2 call(s) re-sent" in dropped.done
    assert off.worker == ALL_WORKERS and "peer transfers off" in off.done
    assert dropped.at_s == 5.0 and not watch.keep_on_workers
    # still stuck: its calls keep going elsewhere, nothing new to block or say
    again = watch.libraries(libs, 7.0, 5.0, NAMES, 0)
    assert again.stalled == {A} and not again.for_runtime and not again.findings


def test_a_dropped_worker_comes_back_once_its_library_starts_or_ends() -> None:
    watch = NetworkWatch()
    libs = {A: sent(0.0, "a1.box"), B: started(0.0, "b1.box")}
    watch.libraries(libs, 6.0, 5.0, NAMES, 0)
    ended = {**libs, A: LibraryState(LIBRARY_ENDED, 130.0, "a1.box")}
    back = watch.libraries(ended, 131.0, 5.0, NAMES, 0)
    assert back.unblock == ("a1.box",) and not back.stalled and not back.peers_off
    assert "its library ended" in back.findings[0].failed
    assert "taken back" in back.findings[0].done and not watch.dropped
    # TaskVine sends a new one (from the manager now): it starts, nothing to say
    fresh = {**libs, A: started(132.0, "a1.box")}
    assert not watch.libraries(fresh, 133.0, 5.0, NAMES, 0).findings


def test_a_worker_that_left_while_dropped_is_forgotten_and_its_host_unblocked() -> None:
    watch = NetworkWatch()
    watch.libraries({A: sent(0.0, "a1.box")}, 6.0, 5.0, NAMES, 0)
    gone = watch.libraries({}, 20.0, 5.0, NAMES, 0)
    assert gone.unblock == ("a1.box",) and "it left" in gone.findings[0].failed


def test_a_host_shared_with_a_healthy_worker_is_not_blocked() -> None:
    watch = NetworkWatch()
    libs = {A: sent(0.0, "node1"), B: started(0.0, "node1")}  # two workers on one host
    actions = watch.libraries(libs, 6.0, 5.0, NAMES, 0)
    assert actions.stalled == {A} and actions.block == ()
    assert "not blocked" in actions.findings[0].done


def test_two_stuck_workers_on_one_host_block_it_once_and_unblock_it_when_both_are_back() -> None:
    watch = NetworkWatch()
    libs = {A: sent(0.0, "node1"), C: sent(0.0, "node1")}
    assert watch.libraries(libs, 6.0, 5.0, {}, 0).block == ("node1",)
    half = watch.libraries({A: started(7.0, "node1"), C: sent(0.0, "node1")}, 8.0, 5.0, {}, 0)
    assert half.unblock == ()  # C still holds it
    both = watch.libraries({A: started(7.0, "node1"), C: started(9.0, "node1")}, 10.0, 5.0,
                           {}, 0)
    assert both.unblock == ("node1",)


def test_peers_stay_on_while_values_are_kept_on_workers_and_go_off_when_none_is() -> None:
    watch = NetworkWatch()
    libs = {A: sent(0.0, "a1.box"), B: started(0.0, "b1.box")}
    first = watch.libraries(libs, 6.0, 5.0, NAMES, values_kept=3)
    assert first.block == ("a1.box",) and not first.peers_off
    assert not watch.keep_on_workers  # no new value is kept meanwhile
    assert not watch.libraries(libs, 7.0, 5.0, NAMES, values_kept=1).peers_off
    assert watch.libraries(libs, 8.0, 5.0, NAMES, values_kept=0).peers_off
    assert watch.peers_off and not watch.libraries(libs, 9.0, 5.0, NAMES, 0).peers_off


def test_a_shard_a_worker_never_reaches_is_said_once_after_two_failovers() -> None:
    watch = NetworkWatch()
    failed = {"lfn": "/f1", "server": "origin", "bytes": 10,
              "errors": [["xcache-A", "Socket timeout"]]}
    assert watch.reads("w-b1", "b1.box", [failed], 3.0) == []
    (finding,) = watch.reads("w-b1", "b1.box", [failed, failed], 5.0, start=1.0)
    assert (finding.worker, finding.host, finding.at_s) == ("w-b1", "b1.box", 4.0)
    assert "cannot reach xcache-A" in finding.failed and "Socket timeout" in finding.failed
    assert watch.reads("w-b1", "b1.box", [failed], 6.0) == []  # said once
    # another worker that reads from it, after one failure, is not said to be cut off
    watch.reads("w-a1", "a1.box", [failed], 6.0)
    served = {"lfn": "/f2", "server": "xcache-A", "bytes": 10, "errors": []}
    assert watch.reads("w-a1", "a1.box", [served, failed], 7.0) == []


def test_the_summary_says_which_worker_what_failed_and_what_was_done() -> None:
    summary = RunSummary()
    summary.network.append({"worker": "w-a1", "host": "a1.box", "failed": "its library did "
                            "not start", "done": "dropped", "at_s": 5.0})
    assert "  network: w-a1 (a1.box): its library did not start; dropped (at 5.0 s)" in (
        summary.lines())
    assert summary.to_dict()["network"][0]["worker"] == "w-a1"


def test_the_library_start_bound_must_be_positive() -> None:
    try:
        RunConfig(library_start_timeout_s=0)
    except ConfigError as exc:
        assert "library_start_timeout_s" in str(exc)
    else:
        raise AssertionError("a zero bound was accepted")


# --- TaskVine's transactions log -----------------------------------------------------------
LOG = b"""# time manager_pid LIBRARY library_id (WAITING|SENT|STARTED|FAILURE) worker_id
1 9 WORKER worker-aa CONNECTION 198.18.11.11:4000
2 9 WORKER worker-bb CONNECTION 198.18.12.11:4000
3 9 LIBRARY 5 SENT worker-bb
4 9 LIBRARY 5 STARTED worker-bb
5 9 TASK 6 RUNNING worker-aa  FIRST_RESOURCES {}
6 9 LIBRARY 6 SENT worker-aa
"""


def test_library_lines_are_read_as_events() -> None:
    assert library_event(b"1 9 WORKER worker-aa CONNECTION 1.2.3.4:5") == (
        "connect", "worker-aa", "1.2.3.4:5")
    assert library_event(b"3 9 LIBRARY 5 SENT worker-bb") == (LIBRARY_SENT, "5", "worker-bb")
    assert library_event(b"3 9 LIBRARY 5 FAILURE worker-bb") == (LIBRARY_ENDED, "5",
                                                                  "worker-bb")
    assert library_event(b"7 9 TASK 6 DONE LIBRARY_EXIT  -1 ") == ("done", "6", "")
    assert library_event(b"7 9 WORKER worker-aa DISCONNECTION EXPLICIT") == (
        "disconnect", "worker-aa", "")
    assert library_event(b"5 9 TASK 6 RUNNING worker-aa  FIRST_RESOURCES {}") is None
    assert library_event(b"# time manager_pid WORKER worker_id CONNECTION host:port") is None


def test_the_log_gives_each_workers_library_as_it_grows(tmp_path: Path) -> None:
    path = tmp_path / "transactions"
    path.write_bytes(LOG[:-20])  # the last line half written
    log = LibraryLog(path)
    states = log.read(10.0)
    assert states == {B: LibraryState(LIBRARY_STARTED, 10.0)}
    assert log.missing_hosts()
    log.name_hosts({B: "b1.box", A: "a1.box"})
    assert log.states[B].host == "b1.box" and not log.missing_hosts()
    path.write_bytes(LOG)
    states = log.read(11.0)
    assert states[A] == LibraryState(LIBRARY_SENT, 11.0)  # its host: at the next lookup
    with open(path, "ab") as f:
        f.write(b"140 9 TASK 6 DONE LIBRARY_EXIT  -1 \n"
                b"141 9 WORKER worker-bb DISCONNECTION EXPLICIT\n")
    states = log.read(140.0)
    assert states == {A: LibraryState(LIBRARY_ENDED, 140.0)}


def test_the_log_counts_libraries_that_ended_and_nothing_else(tmp_path: Path) -> None:
    """The libraries' own logs are searched for tracebacks only when this count moves."""
    path = tmp_path / "transactions"
    path.write_bytes(LOG)
    log = LibraryLog(path)
    log.read(1.0)
    assert log.ended == 0  # sent and started: none ended
    with open(path, "ab") as f:
        f.write(b"150 9 TASK 7 DONE SUCCESS  0 \n")  # a call, not a library
    log.read(2.0)
    assert log.ended == 0
    with open(path, "ab") as f:
        f.write(b"160 9 LIBRARY 5 FAILURE worker-bb\n"
                b"161 9 TASK 6 DONE LIBRARY_EXIT  -1 \n")
    log.read(3.0)
    assert log.ended == 2  # library 5 failed, library 6's task ended


def test_a_missing_log_reads_as_nothing_yet(tmp_path: Path) -> None:
    assert LibraryLog(tmp_path / "none").read(1.0) == {}


# --- the run's state machine ---------------------------------------------------------------
CFG = RunConfig(memory=None, max_bundle_tasks=1, target_bundle_s=1e-6, bundles_per_slot=1,
                library_start_timeout_s=5.0)


def test_the_calls_of_a_worker_whose_library_does_not_start_run_elsewhere() -> None:
    dsk: dict[Any, Any] = {("x", i): (int, i) for i in range(2)}
    state = RunState(graphs.build(dsk, list(dsk)), CFG, Learned.fresh(CFG), now=0.0)
    subs = [i for i in state.handle(Tick(0.1, 2, 2)) if isinstance(i, Submit)]
    assert len(subs) == 2
    on_a, on_b = subs[0].call, subs[1].call
    running = {on_a: "RUNNING", on_b: "RUNNING"}
    where = {on_a: A, on_b: B}
    libs = {A: sent(0.2, "a1.box"), B: started(0.3, "b1.box")}
    assert not state.handle(PoolSample(3.0, 2, 2, running, libraries=libs, where=where))
    out = state.handle(PoolSample(6.0, 2, 2, running, libraries=libs, where=where))
    assert Withdraw(on_a, running=True) in out
    assert Network(("a1.box",), (), True) in out
    (finding, off) = state.summary.network
    assert finding["host"] == "a1.box" and "1 call(s) re-sent" in finding["done"]
    assert "peer transfers off" in off["done"]
    again = state.handle(CallWithdrawn(on_a))
    resent = [i for i in again + state.handle(Tick(6.1, 2, 2)) if isinstance(i, Submit)]
    assert [s.spec.nodes for s in resent] == [subs[0].spec.nodes]
    assert state.summary.retries == 0  # not the bundle's fault: no attempt counted


def test_a_dropped_worker_leaves_placement_and_calls_waiting_for_it_go_anywhere() -> None:
    from datavine.scheduler.topology import Target

    dsk: dict[Any, Any] = {("x", i): (int, i) for i in range(3)}
    learned = Learned.fresh(CFG)
    learned.topology.learn("w-a1", "A", A)
    learned.topology.learn("w-b1", "B", B)
    state = RunState(graphs.build(dsk, list(dsk)), CFG, learned, now=0.0)
    subs = [i for i in state.handle(Tick(0.1, 2, 2)) if isinstance(i, Submit)]
    # as placement would have sent them: one to the worker, one to its rack, one anywhere
    state.inflight[subs[0].call].target = Target(worker="w-b1")
    state.inflight[subs[1].call].target = Target(rack="B")
    waiting = {s.call: "READY" for s in subs}
    libs = {A: started(0.2, "a1.box"), B: sent(0.2, "b1.box")}
    out = state.handle(PoolSample(6.0, 2, 2, waiting, libraries=libs))
    assert {w.call for w in out if isinstance(w, Withdraw)} == {subs[0].call, subs[1].call}
    assert "w-b1" not in learned.topology.workers and "w-a1" in learned.topology.workers
    assert learned.network.out_of_placement == {B: ("w-b1", "B")}
    # its library ends: taken back (TaskVine's list or its next result makes it known again)
    ended = {**libs, B: LibraryState(LIBRARY_ENDED, 140.0, "b1.box")}
    out = state.handle(PoolSample(140.5, 2, 2, {}, libraries=ended))
    assert Network((), ("b1.box",), False) in out and not learned.network.out_of_placement


def test_a_look_at_libraries_all_started_and_unchanged_is_skipped() -> None:
    """NetworkWatch.quiet: the same mapping as a look that saw every library started, with
    nothing dropped, needs no look; a library not started, another mapping, or a dropped
    worker does."""
    from datavine.scheduler.network import (
        LIBRARY_SENT,
        LIBRARY_STARTED,
        LibraryState,
        NetworkWatch,
    )

    watch = NetworkWatch()
    started = {"a:1": LibraryState(LIBRARY_STARTED, 0.0, "a"),
               "b:1": LibraryState(LIBRARY_STARTED, 0.0, "b")}
    assert not watch.quiet(started)  # first seen: looked at
    assert watch.quiet(started)  # the same mapping since: nothing to look at
    assert not watch.quiet(dict(started))  # another mapping (a library changed)
    pending = {**started, "c:1": LibraryState(LIBRARY_SENT, 0.0, "c")}
    assert not watch.quiet(pending) and not watch.quiet(pending)  # its start is timed
    watch.dropped["c:1"] = "c"
    assert not watch.quiet(started)
