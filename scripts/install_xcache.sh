#!/usr/bin/env bash
# Install what the loopback XCache testbed (datavine.io.xcache.testbed) needs, as root:
#   - Debian's XRootD server and client (xrootd, xrdfs, xrdpfc_print, libXrdPss, libXrdPfc,
#     libXrdHttp) from the distribution's own package lists;
#   - the unprivileged `xrootd` system user: xrootd refuses to run as root, so the testbed
#     starts every server with `-R xrootd` on directories that user owns;
#   - the XRootD Python client and fsspec-xrootd into .venv (and .venv-legacy if present),
#     so that uproot can open root:// URLs.
# Idempotent: each step is skipped when its result is already there.
set -euo pipefail
ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
cd "$ROOT"
log() { echo "install_xcache: $*" >&2; }

# xrdpfc_print (per-file cache statistics) ships in xrootd-server itself.
APT_PKGS=(xrootd-server xrootd-server-plugins xrootd-client)
missing=()
for p in "${APT_PKGS[@]}"; do
  dpkg -s "$p" >/dev/null 2>&1 || missing+=("$p")
done
if [ ${#missing[@]} -gt 0 ]; then
  if [ "$(id -u)" != 0 ]; then
    log "need root to install: ${missing[*]}"; exit 1
  fi
  log "installing Debian packages: ${missing[*]}"
  export DEBIAN_FRONTEND=noninteractive
  apt-get update -q >/dev/null
  apt-get install -y -q --no-install-recommends "${missing[@]}" >/dev/null
fi
for tool in xrootd xrdfs xrdpfc_print; do
  command -v "$tool" >/dev/null || { log "$tool not found after install"; exit 1; }
done

# The Debian package normally creates the user; make sure of it (containers, old installs).
if ! id xrootd >/dev/null 2>&1; then
  log "creating system user xrootd"
  groupadd --system xrootd 2>/dev/null || true
  useradd --system --gid xrootd --home-dir /var/spool/xrootd --no-create-home \
    --shell /usr/sbin/nologin xrootd
fi

for venv in .venv .venv-legacy; do
  [ -x "$venv/bin/python" ] || continue
  if "$venv/bin/python" -c "import XRootD.client, fsspec_xrootd" 2>/dev/null; then
    log "$venv already has xrootd and fsspec-xrootd"
  else
    log "installing xrootd fsspec-xrootd into $venv"
    "$venv/bin/python" -m pip install -q xrootd fsspec-xrootd
  fi
done
log "done: $(xrootd -v 2>&1 | head -1)"
