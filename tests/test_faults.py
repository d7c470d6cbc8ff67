"""The fault suite: each fault injected into real processes (vine_workers, the XCache
testbed, a ``datavine run`` client), asserting the result is right or the error is the right
one, the time to recover is within its bound, and nothing is left behind.

The bounds are hang detectors, not performance figures (those are in
``benchmarks/faults.py``): a run whose worker froze must finish within
``ManagerConfig.worker_timeout_s`` (15 s) plus the run and a wide margin.
"""

from __future__ import annotations

import signal
from pathlib import Path
from typing import Any

import pytest

from datavine.apps import faults
from datavine.apps.faults import FaultResult
from datavine.errors import RunTimeoutError, TaskTimeLimitError

pytest_plugins = ["tests.fixtures_condor"]
pytestmark = [pytest.mark.taskvine, pytest.mark.faults]

BASE_S = 30.0  # the workload takes ~3 s here; anything near this bound is a hang


def check(result: FaultResult, bound_s: float = BASE_S) -> None:
    assert result.recovered, result
    assert result.processes_left == 0 and result.files_left == 0, result
    assert result.seconds < bound_s, result


@pytest.mark.parametrize("inject", [faults.kill_worker_alone, faults.kill_worker_session,
                                    faults.kill_library, faults.kill_capped_child],
                         ids=["worker-alone", "worker-session", "library", "capped-child"])
def test_killed_process_costs_a_retry_not_the_run(inject: Any) -> None:
    result = faults.in_cluster(inject.__name__, inject)
    check(result)
    assert "1 retries" in result.outcome or "2 retries" in result.outcome, result


def test_capped_child_sigkill_is_reported_as_an_oom_overrun() -> None:
    import datavine

    graph, total = faults.nap_graph()
    with datavine.LocalCluster(workers=2, cores=1) as cluster:
        import threading

        threading.Timer(faults.FAULT_AT_S, faults.kill_capped_child, (cluster,)).start()
        (value,) = cluster.get(graph, ["total"])
        summary = cluster.last_summary
    assert value == total
    assert any("SIGKILL" in f and "out-of-memory" in f for f in summary.failures), summary.lines()
    assert summary.categories["fault-nap"].overruns == 1


@pytest.mark.slow
def test_frozen_worker_is_declared_lost_and_its_calls_rerun() -> None:
    summaries: list[Any] = []

    def keep_summary(cluster: Any) -> str:
        summaries.append(cluster.last_summary)
        return "summary kept"

    # no backup copies: they outrun the frozen worker's calls before it is declared lost
    # (tests/test_backup_copies.py), and this test is about its loss
    result = faults.in_cluster("worker SIGSTOP", faults.freeze_worker, after=keep_summary,
                               speculation=False)
    # ManagerConfig.worker_timeout_s (15 s) + the run; a frozen manager took an hour
    check(result, bound_s=15 + BASE_S)
    assert result.injected, result  # worker 0's session was stopped
    (summary,) = summaries
    assert "local-0" in summary.lost_workers, summary.lines()  # declared lost
    assert summary.retries >= 1, summary.lines()  # the call it held ran again elsewhere
    reruns = [f for f in summary.failures if "died under it" in f or "local-0 left" in f]
    assert reruns, summary.lines()


def test_runaway_task_is_stopped_named_and_the_cluster_stays_usable() -> None:
    graph = faults.nap_graph(6, faults.NAP_S, faults.spin)
    result = faults.in_cluster("runaway", None, expect=TaskTimeLimitError, graph=graph,
                               naming="('fault-spin', 0)", time_limits={"fault-spin": 2.0},
                               after=faults.next_run_check)
    check(result)
    assert "next run" in result.outcome


@pytest.mark.parametrize("capped", [True, False], ids=["capped", "uncapped"])
def test_calls_abandoned_by_a_timed_out_run_are_stopped(capped: bool) -> None:
    import datavine

    memory = {} if capped else {"memory": None}
    result = faults.in_cluster("timeout", None, expect=RunTimeoutError,
                               graph=faults.nap_graph(4, 30.0), timeout_s=2,
                               after=faults.next_run_check, workers=2, **memory)
    check(result)
    assert datavine.RunConfig().memory is not None


def test_busy_port_is_one_line_naming_it() -> None:
    check(faults.busy_port())


@pytest.mark.parametrize("kind", ["missing", "corrupt"])
def test_bad_input_file_is_named_and_not_retried(kind: str, tmp_path: Path) -> None:
    result = faults.bad_file(kind, tmp_path)
    check(result)
    assert "not retried" in result.outcome


@pytest.mark.xcache
def test_shard_stopped_mid_run(xcache_tools: None, xcache_data: Path) -> None:
    """On a testbed of its own (the session's testbed keeps its caches for other tests)."""
    from datavine.apps.testbed import SMALL_EVENTS, small_lfns
    from datavine.io.xcache.testbed import XCacheTestbed
    from tests.fixtures_xcache import RACKS

    lfns = small_lfns()  # what xcache_data holds, as the fault benchmark writes them
    with XCacheTestbed(xcache_data, n_shards=len(RACKS), racks=RACKS) as testbed:
        result = faults.shard_stopped(testbed, lfns, SMALL_EVENTS * len(lfns))
    check(result)
    assert "failovers" in result.outcome and "FAILED" not in result.outcome


@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGHUP, signal.SIGKILL],
                         ids=["SIGTERM", "SIGHUP", "SIGKILL"])
def test_signalled_script_leaves_nothing(sig: int) -> None:
    result = faults.client_signal(f"script {sig}", sig, faults.cluster_client_command(), 3)
    check(result)


def test_ctrl_c_is_answered_while_a_worker_is_frozen() -> None:
    """The manager may be blocked reading from the frozen worker: Ctrl-C still ends the run
    within TaskVine's bounded reply timeout, and everything is stopped."""
    result = faults.client_signal("Ctrl-C, frozen worker", signal.SIGINT,
                                  faults.cluster_client_command(), 3,
                                  before=faults.freeze_one_worker)
    check(result)


@pytest.mark.xcache
@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGKILL], ids=["SIGTERM", "SIGKILL"])
def test_signalled_datavine_run_leaves_nothing(sig: int, tmp_path_factory: Any) -> None:
    from tests.fixtures_xcache import xcache_missing

    if xcache_missing():
        pytest.skip(xcache_missing())
    data = Path(__file__).resolve().parents[1] / "runs" / "faults-data"
    result = faults.client_signal(f"datavine run {sig}", sig, faults.datavine_run_command(data), 6)
    check(result, bound_s=60)


@pytest.mark.condor
def test_condor_worker_job_removed_mid_run(condor_pool: None, tmp_path: Path) -> None:
    import secrets

    password = tmp_path / "vine.password"
    password.write_text(secrets.token_hex(32))
    password.chmod(0o600)
    result = faults.condor_worker_removed(password)
    check(result, bound_s=60)
