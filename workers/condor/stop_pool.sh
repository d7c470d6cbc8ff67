#!/usr/bin/env bash
# Stop the personal HTCondor pool and take its mounts down, as root:
#
#   bash workers/condor/stop_pool.sh
#
# 1. `condor_off -master -fast` (jobs are killed, daemons exit);
# 2. waits, at most DATAVINE_CONDOR_STOP_TIMEOUT seconds (default 30), for every process
#    rooted in the chroot to exit; what is left (a vine_factory, a stray job) gets SIGTERM,
#    then SIGKILL;
# 3. unmounts everything under the chroot, deepest first, and checks that nothing is left
#    mounted.
# The chroot itself stays (delete it only after this script succeeded). Idempotent.
set -euo pipefail
# shellcheck source=workers/condor/common.sh
source "$(dirname "${BASH_SOURCE[0]}")/common.sh"
need_root
log() { echo "stop_pool: $*" >&2; }
TIMEOUT=${DATAVINE_CONDOR_STOP_TIMEOUT:-30}

wait_gone() {  # wait_gone SECONDS: true when no process is rooted in the chroot
  local deadline=$(( $(date +%s) + $1 ))
  while [ -n "$(chroot_pids)" ]; do
    [ "$(date +%s)" -ge "$deadline" ] && return 1
    sleep 0.2
  done
}

if [ -n "$(chroot_pids)" ]; then
  if [ -x "$CHROOT/usr/sbin/condor_off" ] && findmnt -rn "$CHROOT/proc" >/dev/null; then
    log "condor_off -master -fast"
    chroot "$CHROOT" /usr/bin/env -i PATH=/usr/sbin:/usr/bin:/sbin:/bin \
      condor_off -master -fast >/dev/null 2>&1 || log "condor_off failed; signalling instead"
  fi
  if ! wait_gone "$TIMEOUT"; then
    pids=$(chroot_pids | tr '\n' ' ')
    log "still running after ${TIMEOUT}s, SIGTERM: $pids"
    # Only processes whose root is this chroot: the pool's daemons, jobs and factories.
    for p in $pids; do kill -TERM "$p" 2>/dev/null || true; done
    if ! wait_gone 5; then
      pids=$(chroot_pids | tr '\n' ' ')
      log "SIGKILL: $pids"
      for p in $pids; do kill -KILL "$p" 2>/dev/null || true; done
      wait_gone 5 || { log "processes survive SIGKILL: $(chroot_pids | tr '\n' ' ')"; exit 1; }
    fi
  fi
fi

for m in $(chroot_mounts); do
  umount "$m"
done
left=$(chroot_mounts)
if [ -n "$left" ]; then
  log "still mounted under $CHROOT:"; echo "$left" >&2; exit 1
fi
log "stopped; nothing mounted under $CHROOT"
