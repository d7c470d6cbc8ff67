#!/usr/bin/env bash
# Stop the personal HTCondor pool and take its mounts down, as root:
#
#   bash workers/condor/stop_pool.sh
#   bash workers/condor/stop_pool.sh --mounts-only [--unbind DIR]...   # a box's part
#
# 1. `condor_off -master -fast` (jobs are killed, daemons exit);
# 2. waits, at most DATAVINE_CONDOR_STOP_TIMEOUT seconds (default 30), for every process
#    rooted in the chroot in this network namespace (the pool's daemons, jobs, factories)
#    to exit; what is left gets SIGTERM, then SIGKILL;
# 3. unmounts each `--unbind DIR` (a box's read-write bind), then everything under the
#    chroot, deepest first, and checks that nothing is left mounted.
# The chroot also serves the boxes' HTCondor (datavine.deploy.box.condor: a condor_master per
# network namespace): their processes are never stopped here, and while any process of the
# chroot is left the shared mounts (/proc, /dev, the binds) stay, so the last user of the
# chroot takes them down. `--mounts-only` skips steps 1 and 2 (a box, once its own daemons
# are gone). The chroot itself stays (delete it only after this script succeeded).
# Idempotent.
set -euo pipefail
# shellcheck source=workers/condor/common.sh
source "$(dirname "${BASH_SOURCE[0]}")/common.sh"
need_root
log() { echo "stop_pool: $*" >&2; }
TIMEOUT=${DATAVINE_CONDOR_STOP_TIMEOUT:-30}
MOUNTS_ONLY=0
UNBIND=()
while [ $# -gt 0 ]; do
  case "$1" in
    --mounts-only) MOUNTS_ONLY=1 ;;
    --unbind) [ $# -ge 2 ] || { echo "--unbind needs a folder" >&2; exit 2; }
              UNBIND+=("$2"); shift ;;
    *) echo "usage: $(basename "$0") [--mounts-only] [--unbind DIR]..." >&2; exit 2 ;;
  esac
  shift
done

wait_gone() {  # wait_gone SECONDS: true when no process of this namespace is in the chroot
  local deadline=$(( $(date +%s) + $1 ))
  while [ -n "$(chroot_pids_here)" ]; do
    [ "$(date +%s)" -ge "$deadline" ] && return 1
    sleep 0.2
  done
}

if [ "$MOUNTS_ONLY" = 0 ] && [ -n "$(chroot_pids_here)" ]; then
  if [ -x "$CHROOT/usr/sbin/condor_off" ] && findmnt -rn "$CHROOT/proc" >/dev/null; then
    log "condor_off -master -fast"
    chroot "$CHROOT" /usr/bin/env -i PATH=/usr/sbin:/usr/bin:/sbin:/bin \
      condor_off -master -fast >/dev/null 2>&1 || log "condor_off failed; signalling instead"
  fi
  if ! wait_gone "$TIMEOUT"; then
    pids=$(chroot_pids_here | tr '\n' ' ')
    log "still running after ${TIMEOUT}s, SIGTERM: $pids"
    # Only this namespace's processes whose root is this chroot: the pool's daemons, jobs
    # and factories.
    for p in $pids; do kill -TERM "$p" 2>/dev/null || true; done
    if ! wait_gone 5; then
      pids=$(chroot_pids_here | tr '\n' ' ')
      log "SIGKILL: $pids"
      for p in $pids; do kill -KILL "$p" 2>/dev/null || true; done
      wait_gone 5 || { log "processes survive SIGKILL: $(chroot_pids_here | tr '\n' ' ')"; exit 1; }
    fi
  fi
fi

# umount_settled MOUNT: a process that just exited may hold its files a moment longer
# ("target is busy"): retry for up to 5 s, then detach it lazily (every mount is private).
umount_settled() {
  local i
  for i in $(seq 25); do
    umount "$1" 2>/dev/null && return 0
    sleep 0.2
  done
  log "$1 still busy after 5 s: detached lazily (umount -l)"
  umount -l "$1"
}

for d in "${UNBIND[@]}"; do
  if findmnt -rn -o TARGET | grep -qxF "$CHROOT$d"; then
    umount_settled "$CHROOT$d"
  fi
done
users=$(chroot_pids | tr '\n' ' ')
if [ -n "$users" ]; then
  log "mounts under $CHROOT left in place: processes of other network namespaces (a box's" \
      "HTCondor) use the chroot: $users"
  exit 0
fi
for m in $(chroot_mounts); do
  if [ -n "$(chroot_pids)" ]; then  # something started in the chroot meanwhile
    log "the chroot is in use again ($(chroot_pids | tr '\n' ' ')): leaving its mounts"
    exit 0
  fi
  umount_settled "$m"
done
left=$(chroot_mounts)
if [ -n "$left" ]; then
  log "still mounted under $CHROOT:"; echo "$left" >&2; exit 1
fi
log "stopped; nothing mounted under $CHROOT"
