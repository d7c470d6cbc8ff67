#!/usr/bin/env bash
# Set up everything the tests need, type-check, then run the tests on both dask lines and on
# TaskVine as released, as root:
#
#   bash scripts/test.sh [PYTEST-ARGS...]      e.g.  bash scripts/test.sh -x -m "not slow"
#
# 1. `scripts/setup.sh --all`: .venv (dask >= 2025.4), .venv-legacy (dask 2025.3 with
#    dask-awkward, dict graphs), TaskVine built into build/cctools, the XRootD servers for
#    the XCache testbed and the personal HTCondor pool (a trixie chroot); then coffea's
#    NanoAOD samples. Every step reuses what is already there.
# 2. mypy in .venv (scripts/typecheck.sh: pyproject.toml's [tool.mypy], the whole package,
#    scheduler/worker/protocol strictly).
# 3. pytest in .venv: the whole suite. The condor tests start the personal HTCondor pool
#    themselves (tests/fixtures_condor.py) and stop it again at the end of the session.
# 4. pytest in .venv-legacy: the tests that matter for classic dict graphs
#    (test_runtime, test_graph, test_dask_awkward, test_auth, and test_coffea_shards for
#    coffea's dask path through the XCache shards).
# 5. the stock lane: the same cctools source built without datavine's patches
#    (scripts/build_taskvine.sh --stock: build/cctools-stock, ~30 s, reused when there),
#    first on PYTHONPATH (DATAVINE_CCTOOLS names it), and the tests of what datavine does on
#    it (STOCK_TESTS: dask and coffea runs, local pools, a facility's [racks] here and on
#    the box, the degradations `datavine doctor` names, a test per assumption on the
#    bindings).
# All four always happen; the exit code is non-zero if any failed.
# Each pytest run is bounded (a hung test must not hold CI for hours): after
# DATAVINE_TEST_TIMEOUT seconds (default 1500 for .venv, 600 for .venv-legacy and for the
# stock lane) it gets
# SIGINT, so pytest prints where it was and tears its fixtures down; SIGKILL 60 s later.
# DATAVINE_TEST_SETUP=0 skips step 1 (an environment set up already).
set -uo pipefail
ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
cd "$ROOT"
log() { echo "test.sh: $*" >&2; }
LEGACY_TESTS=(tests/test_runtime.py tests/test_graph.py tests/test_dask_awkward.py
  tests/test_auth.py tests/test_coffea_shards.py)
STOCK_PREFIX="$ROOT/build/cctools-stock"
STOCK_TESTS=(tests/test_stock_taskvine.py tests/test_doctor.py tests/test_capabilities.py
  tests/test_taskvine_internals.py tests/test_workers_say.py
  tests/test_local_pool.py::test_on_demand_local_pool_runs_tasks_then_scales_down
  tests/test_coffea_executor.py::test_identical_to_iterative_executor)
t0=$(date +%s)

if [ "${DATAVINE_TEST_SETUP:-1}" != 0 ]; then
  bash scripts/setup.sh --all || { log "setup failed (exit $?)"; exit 1; }
  bash scripts/fetch_samples.sh || { log "fetching coffea's samples failed"; exit 1; }
  log "set up in $(( $(date +%s) - t0 )) s"
fi

# Should a run be cut short, the HTCondor pool's mounts must not outlive it: stop the
# pool on exit unless it was already up before the tests.
pool_was_up=0
findmnt -rn "$ROOT/build/condor-root/proc" >/dev/null 2>&1 && pool_was_up=1
cleanup() {
  if [ "$pool_was_up" = 0 ] && [ -d build/condor-root ] && [ "$(id -u)" = 0 ]; then
    bash workers/condor/stop_pool.sh >/dev/null 2>&1 || log "stop_pool.sh failed: see its output"
  fi
}
trap cleanup EXIT

run_pytest() {  # run_pytest VENV LIMIT_S ARGS... (LANE: the lane's name in the log)
  local venv=$1 limit=$2; shift 2
  local started=$SECONDS lane=${LANE:-$venv}
  log "pytest in $lane (at most $limit s): $*"
  timeout --signal=INT --kill-after=60 "$limit" "$venv/bin/python" -m pytest "$@"
  local rc=$?
  if [ "$rc" = 124 ] || [ "$rc" = 137 ]; then
    log "pytest in $lane did not finish within $limit s: interrupted (see the traceback above)"
  fi
  log "pytest in $lane: exit $rc after $(( SECONDS - started )) s"
  return $rc
}

run_stock_lane() {  # run_stock_lane PYTEST-ARGS...: TaskVine as released, first on PYTHONPATH
  local started=$SECONDS site
  bash scripts/build_taskvine.sh --stock --prefix "$STOCK_PREFIX" \
    || { log "the stock TaskVine did not build (exit $?)"; return 1; }
  log "stock TaskVine ready after $(( SECONDS - started )) s"
  site=$(ls -d "$STOCK_PREFIX"/lib/python3*/site-packages | tail -1)
  PYTHONPATH="$site${PYTHONPATH:+:$PYTHONPATH}" DATAVINE_CCTOOLS="$STOCK_PREFIX" \
    LANE="the stock lane (.venv on $STOCK_PREFIX)" \
    run_pytest .venv "${DATAVINE_TEST_TIMEOUT:-600}" "${STOCK_TESTS[@]}" "$@"
}

run_mypy() {  # run_mypy VENV
  local venv=$1 started=$SECONDS
  log "mypy in $venv: src/datavine"
  DATAVINE_PYTHON="$venv/bin/python" bash scripts/typecheck.sh
  local rc=$?
  log "mypy in $venv: exit $rc after $(( SECONDS - started )) s"
  return $rc
}

run_mypy .venv; rc_mypy=$?
run_pytest .venv "${DATAVINE_TEST_TIMEOUT:-1500}" "$@"; rc_main=$?
run_pytest .venv-legacy "${DATAVINE_TEST_TIMEOUT:-600}" "${LEGACY_TESTS[@]}" "$@"
rc_legacy=$?
run_stock_lane "$@"; rc_stock=$?

log "done in $(( $(date +%s) - t0 )) s: mypy exit $rc_mypy, .venv exit $rc_main," \
  ".venv-legacy exit $rc_legacy, stock lane exit $rc_stock"
[ "$rc_mypy" = 0 ] && [ "$rc_main" = 0 ] && [ "$rc_legacy" = 0 ] && [ "$rc_stock" = 0 ]
