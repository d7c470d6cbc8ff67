#!/usr/bin/env bash
# Start the personal HTCondor pool (installed by install_pool.sh), as root, and wait until
# it offers a slot:
#
#   bash workers/condor/start_pool.sh          # ~3 s from master start to the first slot
#   bash workers/condor/start_pool.sh --mounts-only   # step 1 only (a box's HTCondor)
#
# 1. mounts inside the chroot: a fresh /proc and /sys; a private /dev (a small tmpfs with
#    the host's null, zero, full, random, urandom and tty bound in, and its own /dev/shm);
#    read-only binds, at identical paths, of build/cctools, .venv, src and the Python
#    behind .venv; a read-write bind of the pools' folder (build/pools: factory scratch,
#    submit files, job logs). Nothing writable of the host's is reachable through the chroot
#    but build/pools, so even `rm -rf build/` with the pool up cannot reach the host's /dev;
#    every mount is private, so unmounting cannot propagate to the host; and a read-write
#    bind of each folder in DATAVINE_CONDOR_RW_BINDS (a box's folder). `--mounts-only`
#    stops here: a box (datavine.deploy.box.condor) runs its own condor_master per network
#    namespace from the same chroot;
# 2. copies condor_config.local into the chroot and starts condor_master (it daemonizes);
# 3. waits, at most DATAVINE_CONDOR_START_TIMEOUT seconds (default 60), for a slot in
#    condor_status, else prints the daemon logs and fails.
# Idempotent: a running pool is left as it is. Stop it with stop_pool.sh. Only the daemons
# in this shell's network namespace are this pool's (a box's run in namespaces of their own).
set -euo pipefail
# shellcheck source=workers/condor/common.sh
source "$(dirname "${BASH_SOURCE[0]}")/common.sh"
need_root
log() { echo "start_pool: $*" >&2; }
MOUNTS_ONLY=0
case "${1:-}" in
  --mounts-only) MOUNTS_ONLY=1 ;;
  "") ;;
  *) echo "usage: $(basename "$0") [--mounts-only]" >&2; exit 2 ;;
esac
TIMEOUT=${DATAVINE_CONDOR_START_TIMEOUT:-60}

if [ ! -f "$INSTALLED_MARK" ]; then
  log "the pool is not installed in $CHROOT: run workers/condor/install_pool.sh"; exit 1
fi
in_chroot() { chroot "$CHROOT" /usr/bin/env -i PATH=/usr/sbin:/usr/bin:/sbin:/bin "$@"; }
slots() { in_chroot condor_status -af Name 2>/dev/null | grep -c . || true; }

master_running() {
  local pid
  for pid in $(chroot_pids_here); do
    [ "$(cat "/proc/$pid/comm" 2>/dev/null)" = condor_master ] && return 0
  done
  return 1
}

if [ "$MOUNTS_ONLY" = 0 ] && master_running && [ "$(slots)" -gt 0 ]; then
  log "already running ($(slots) slot(s)); logs in $CONDOR_LOG_DIR"; exit 0
fi

# --- mounts ------------------------------------------------------------------------------------
is_mounted() { findmnt -rn -o TARGET | grep -qxF "$1"; }
bind_same_path() {  # bind_same_path HOST_DIR ro|rw
  local src=$1 dst=$CHROOT$1
  is_mounted "$dst" && return 0
  mkdir -p "$dst"
  mount --bind "$src" "$dst"
  mount --make-private "$dst"
  [ "$2" = ro ] && mount -o remount,bind,ro "$dst"
  return 0
}
t0=$(date +%s.%N)
is_mounted "$CHROOT/proc" || mount -t proc -o nosuid,nodev,noexec proc "$CHROOT/proc"
is_mounted "$CHROOT/sys" || mount -t sysfs -o ro,nosuid,nodev,noexec sysfs "$CHROOT/sys"
if ! is_mounted "$CHROOT/dev"; then
  mount -t tmpfs -o mode=0755,size=1m,nosuid,noexec datavine-dev "$CHROOT/dev"
  for node in null zero full random urandom tty; do
    touch "$CHROOT/dev/$node"
    mount --bind "/dev/$node" "$CHROOT/dev/$node"
  done
  ln -s /proc/self/fd "$CHROOT/dev/fd"
  ln -s /proc/self/fd/0 "$CHROOT/dev/stdin"
  ln -s /proc/self/fd/1 "$CHROOT/dev/stdout"
  ln -s /proc/self/fd/2 "$CHROOT/dev/stderr"
  mkdir -m 1777 "$CHROOT/dev/shm"
  mount -t tmpfs -o mode=1777,size=256m,nosuid,nodev datavine-shm "$CHROOT/dev/shm"
fi
while read -r d; do bind_same_path "$d" ro; done < <(ro_binds)
mkdir -p "$SCRATCH"
chown "$POOL_USER:$POOL_USER" "$SCRATCH"
bind_same_path "$POOL_DIR" rw
while read -r d; do
  [ -d "$d" ] || { log "DATAVINE_CONDOR_RW_BINDS: $d is not a folder"; exit 1; }
  bind_same_path "$d" rw
done < <(rw_binds)
if [ "$MOUNTS_ONLY" = 1 ]; then
  log "mounts ready under $CHROOT"
  exit 0
fi

# --- configuration and daemons -----------------------------------------------------------------
install -m 0644 "$CONDOR_DIR/condor_config.local" "$CHROOT/etc/condor/config.d/99-datavine.conf"
mkdir -p "$CHROOT/run/condor" "$CHROOT/run/lock/condor"
in_chroot chown condor:condor /run/condor /run/lock/condor
port=$(in_chroot condor_config_val SHARED_PORT_PORT)
if ! master_running; then
  if ss -Hltn "sport = :$port" 2>/dev/null | grep -q .; then
    log "port $port (SHARED_PORT_PORT in condor_config.local) is taken by another program"
    exit 1
  fi
  in_chroot condor_master
fi

# --- wait for a slot ---------------------------------------------------------------------------
deadline=$(( $(date +%s) + TIMEOUT ))
until [ "$(slots)" -gt 0 ]; do
  if [ "$(date +%s)" -ge "$deadline" ]; then
    log "no slot after ${TIMEOUT}s; daemon logs in $CONDOR_LOG_DIR:"
    for f in MasterLog CollectorLog StartLog SchedLog; do
      [ -f "$CONDOR_LOG_DIR/$f" ] && { echo "--- $f" >&2; tail -15 "$CONDOR_LOG_DIR/$f" >&2; }
    done
    exit 1
  fi
  sleep 0.2
done
elapsed=$(awk -v a="$t0" -v b="$(date +%s.%N)" 'BEGIN{printf "%.1f", b - a}')
log "pool up in ${elapsed}s: $(slots) slot(s), collector 127.0.0.1:$port"
log "condor commands:  workers/condor/condor_exec.sh condor_q | condor_status | condor_history"
log "daemon logs:      $CONDOR_LOG_DIR"
log "pool scratch:     $SCRATCH (factories, submit files, job logs)"
