#!/usr/bin/env bash
# Set up datavine on a fresh Debian (bookworm) machine, as root:
#   - Debian packages needed to build TaskVine (swig, zlib, openssl headers);
#   - .venv/ with datavine installed editable and its extras;
#   - TaskVine built from Debian's cctools source into build/cctools, importable from .venv;
#   - with --legacy, also .venv-legacy/: the dask < 2025.4 line (classic dict graphs,
#     dask-awkward, hist.dask) that coffea's dask users run today;
#   - with --xcache, the XRootD server packages for the loopback XCache testbed;
#   - with --condor, the personal HTCondor pool (a trixie chroot, ~2 min);
#   - with --browser, Debian's chromium for the browser tests (Playwright drives it; no
#     browser is ever downloaded by Playwright);
#   - with --promtool, promtool unpacked from Debian's prometheus package into build/promtool
#     (tests/test_metrics.py checks the /metrics text with it; nothing installed, no service).
# Idempotent: every step reuses what is already there.
set -euo pipefail
ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
cd "$ROOT"
LEGACY=0 XCACHE=0 CONDOR=0 BROWSER=0 PROMTOOL=0
for a in "$@"; do
  case "$a" in
    --legacy) LEGACY=1 ;;
    --xcache) XCACHE=1 ;;
    --condor) CONDOR=1 ;;
    --browser) BROWSER=1 ;;
    --promtool) PROMTOOL=1 ;;
    --all) LEGACY=1 XCACHE=1 CONDOR=1 BROWSER=1 PROMTOOL=1 ;;
    *) echo "setup: unknown option $a" >&2; exit 2 ;;
  esac
done
log() { echo "setup: $*" >&2; }

PY=${DATAVINE_PYTHON:-python3}
APT_PKGS=(swig zlib1g-dev libssl-dev m4 patch openssl)  # openssl: tests/test_auth.py's certificate
missing=()
for p in "${APT_PKGS[@]}"; do dpkg -s "$p" >/dev/null 2>&1 || missing+=("$p"); done
if [ ${#missing[@]} -gt 0 ]; then
  log "installing Debian packages: ${missing[*]}"
  export DEBIAN_FRONTEND=noninteractive
  apt-get update -q >/dev/null
  apt-get install -y -q --no-install-recommends "${missing[@]}" >/dev/null
fi

make_venv() {  # make_venv DIR PIP-ARGS...
  local dir=$1; shift
  if [ ! -x "$dir/bin/python" ]; then
    log "creating $dir"
    "$PY" -m venv "$dir"
    "$dir/bin/python" -m pip install -q -U pip
  fi
  log "installing into $dir: $*"
  "$dir/bin/python" -m pip install -q "$@"
}

make_venv .venv -e ".[analysis,coffea,xcache,taskvine,peers,test,dashboard,browser,bench]"
bash scripts/build_taskvine.sh --python .venv/bin/python

if [ "$LEGACY" = 1 ]; then
  # dask-awkward pins dask < 2025.4: graphs reach the scheduler as classic dicts there.
  make_venv .venv-legacy -e ".[analysis,taskvine,test]" "dask==2025.3.0" \
    "distributed==2025.3.0" dask-awkward dask-histogram "coffea==2026.9.0"
  bash scripts/build_taskvine.sh --python .venv-legacy/bin/python
fi
if [ "$XCACHE" = 1 ]; then
  bash scripts/install_xcache.sh
fi
if [ "$CONDOR" = 1 ]; then
  bash workers/condor/install_pool.sh
fi
if [ "$BROWSER" = 1 ] && ! command -v chromium >/dev/null 2>&1; then
  log "installing Debian's chromium (the browser tests)"
  export DEBIAN_FRONTEND=noninteractive
  apt-get update -q >/dev/null
  apt-get install -y -q --no-install-recommends chromium >/dev/null
fi
if [ "$PROMTOOL" = 1 ] && [ ! -x build/promtool/usr/bin/promtool ]; then
  log "unpacking promtool from Debian's prometheus package into build/promtool"
  apt-get update -q >/dev/null
  pkg_dir=$(mktemp -d)
  (cd "$pkg_dir" && apt-get download -q prometheus >/dev/null 2>&1) \
    && dpkg-deb -x "$pkg_dir"/prometheus_*.deb build/promtool \
    || log "no promtool (Debian's prometheus package did not download): test_metrics skips its check"
  rm -rf "$pkg_dir"
fi
log "done: activate with 'source .venv/bin/activate'"
