#!/usr/bin/env bash
# Install the personal HTCondor pool: a Debian trixie chroot (debootstrap, minbase) with
# trixie's `minicondor` (HTCondor 23, a one-machine pool), as root.
#
#   bash workers/condor/install_pool.sh        # ~2 min and ~400 MB the first time
#
# - bookworm has no HTCondor package, hence the trixie chroot in build/condor-root;
# - packages come from the Debian mirror this machine is already configured with
#   (read from /etc/apt/sources.list.d/*.sources or /etc/apt/sources.list);
# - the shared libraries that the host-built vine_worker and Python need are added;
# - a non-root pool user (same uid on host and in the chroot): condor_submit refuses root;
# - the chroot's /root becomes traversable (0711) so that the pool user reaches the pyenv
#   Python bound under it; the host's own /root is left as it is.
# Idempotent: a finished install is detected by build/condor-root/.datavine-installed; a
# half-made chroot (interrupted debootstrap) is removed and made again, never while
# anything is mounted in it. Nothing here changes the host's kernel settings.
set -euo pipefail
# shellcheck source=workers/condor/common.sh
source "$(dirname "${BASH_SOURCE[0]}")/common.sh"
need_root
log() { echo "install_pool: $*" >&2; }
t0=$(date +%s)

# Libraries of the host-built programs jobs run: vine_worker (openssl, zlib) and the pyenv
# Python's extension modules (ssl, ctypes, sqlite3, lzma, bz2, readline, uuid, ...).
CHROOT_PKGS=(minicondor ca-certificates procps libssl3t64 zlib1g libffi8 libsqlite3-0 libbz2-1.0
  liblzma5 libexpat1 libreadline8t64 libncursesw6 libuuid1 libcrypt1 libnsl2 libtirpc3t64)

debian_mirror() {
  if [ -n "${DATAVINE_DEBIAN_MIRROR:-}" ]; then echo "$DATAVINE_DEBIAN_MIRROR"; return; fi
  local f
  # deb822 stanzas: the URIs of the first stanza whose suites are not "-security".
  for f in /etc/apt/sources.list.d/*.sources; do
    [ -f "$f" ] || continue
    awk 'BEGIN{RS=""; FS="\n"}
         { uri=""; sec=0
           for (i = 1; i <= NF; i++) {
             if ($i ~ /^URIs:/) { split($i, a, /[ \t]+/); uri = a[2] }
             if ($i ~ /^Suites:/ && $i ~ /-security/) sec = 1 }
           if (uri != "" && !sec) { print uri; exit } }' "$f"
  done | head -1 | grep . && return
  if [ -f /etc/apt/sources.list ]; then
    awk '$1 == "deb" && $0 !~ /security/ {
           for (i = 2; i <= NF; i++) if ($i !~ /^\[/ && $i !~ /\]$/) { print $i; exit } }' \
      /etc/apt/sources.list | head -1 | grep . && return
  fi
  return 1
}

if [ -f "$INSTALLED_MARK" ] && [ -x "$CHROOT/usr/sbin/condor_master" ]; then
  log "already installed in $CHROOT ($(cat "$INSTALLED_MARK"))"
else
  if [ -d "$CHROOT" ]; then
    if [ -n "$(chroot_mounts)" ]; then
      log "$CHROOT is half-made but has mounts; run stop_pool.sh first:"; chroot_mounts >&2
      exit 1
    fi
    log "removing the unfinished chroot $CHROOT"
    rm -rf --one-file-system "$CHROOT"
  fi
  if ! command -v debootstrap >/dev/null; then
    log "installing debootstrap from apt"
    export DEBIAN_FRONTEND=noninteractive
    apt-get update -q >/dev/null
    apt-get install -y -q --no-install-recommends debootstrap >/dev/null
  fi
  mirror=$(debian_mirror) || { log "no Debian mirror found in the apt sources"; exit 1; }
  log "debootstrap $SUITE (minbase) from the configured mirror $mirror into $CHROOT"
  mkdir -p "$(dirname "$CHROOT")"
  debootstrap --variant=minbase "$SUITE" "$CHROOT" "$mirror" >"$CHROOT.debootstrap.log" 2>&1 \
    || { log "debootstrap failed; see $CHROOT.debootstrap.log"; tail -20 "$CHROOT.debootstrap.log" >&2; exit 1; }
  # No service may start during the install (there is no init in the chroot).
  printf '#!/bin/sh\nexit 101\n' >"$CHROOT/usr/sbin/policy-rc.d"
  chmod 755 "$CHROOT/usr/sbin/policy-rc.d"
  log "installing ${CHROOT_PKGS[*]} in the chroot"
  chroot "$CHROOT" /usr/bin/env -i PATH=/usr/sbin:/usr/bin:/sbin:/bin DEBIAN_FRONTEND=noninteractive \
    sh -c "apt-get update -q && apt-get install -y -q --no-install-recommends ${CHROOT_PKGS[*]} \
           && apt-get clean" >"$CHROOT.apt.log" 2>&1 \
    || { log "apt-get in the chroot failed; see $CHROOT.apt.log"; tail -20 "$CHROOT.apt.log" >&2; exit 1; }
  version=$(chroot "$CHROOT" /usr/sbin/condor_master -version 2>/dev/null | head -1 || true)
  echo "$SUITE minicondor: ${version:-unknown}, installed $(date -u +%FT%TZ)" >"$INSTALLED_MARK"
fi

# --- the pool user, the same uid/gid on the host and in the chroot -------------------------
if ! id "$POOL_USER" >/dev/null 2>&1; then
  log "creating the host user $POOL_USER (jobs and condor_submit cannot run as root)"
  useradd --system --user-group --home-dir "$SCRATCH" --no-create-home \
    --shell /usr/sbin/nologin "$POOL_USER"
fi
uid=$(id -u "$POOL_USER"); gid=$(id -g "$POOL_USER")
if ! chroot "$CHROOT" getent passwd "$POOL_USER" >/dev/null; then
  log "creating $POOL_USER ($uid:$gid) in the chroot"
  chroot "$CHROOT" groupadd --system --gid "$gid" "$POOL_USER"
  chroot "$CHROOT" useradd --system --uid "$uid" --gid "$gid" --home-dir "$SCRATCH" --no-create-home \
    --shell /bin/sh "$POOL_USER"
fi

# --- folders HTCondor and the binds need ----------------------------------------------------
mkdir -p "$CHROOT/run/condor" "$CHROOT/run/lock/condor" "$CHROOT/var/log/condor" \
  "$CHROOT/var/lib/condor/spool" "$CHROOT/var/lib/condor/execute"
chroot "$CHROOT" chown condor:condor /run/condor /run/lock/condor /var/log/condor \
  /var/lib/condor /var/lib/condor/spool /var/lib/condor/execute
# The pyenv Python lives under /root; the pool user must traverse the chroot's /root
# (execute only, no listing) to reach it. The host's /root keeps its mode.
chmod 0711 "$CHROOT/root"
mkdir -p "$SCRATCH"
chown "$uid:$gid" "$SCRATCH"
install -m 0644 "$CONDOR_DIR/condor_config.local" "$CHROOT/etc/condor/config.d/99-datavine.conf"

log "done in $(( $(date +%s) - t0 )) s: $(cat "$INSTALLED_MARK")"
log "start the pool with: bash workers/condor/start_pool.sh"
