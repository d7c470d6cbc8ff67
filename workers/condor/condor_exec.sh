#!/usr/bin/env bash
# Run one command as the pool user inside the HTCondor chroot, as root:
#
#   workers/condor/condor_exec.sh condor_q
#   workers/condor/condor_exec.sh condor_submit job.sub
#   workers/condor/condor_exec.sh PATH=/x:/usr/bin PYTHONPATH=/y vine_factory -T condor ...
#
# The command gets a clean environment (HOME = the pool's scratch folder, a plain PATH);
# leading VAR=value arguments add to it, as with env(1). It starts in the current folder
# when that folder is bound into the chroot (the same path on both sides), else in the
# pool's scratch folder. `exec` all the way down: the caller's PID is the command's PID (datavine signals
# the vine_factory it starts this way).
set -euo pipefail
# shellcheck source=workers/condor/common.sh
source "$(dirname "${BASH_SOURCE[0]}")/common.sh"
need_root
if [ $# -eq 0 ]; then
  echo "usage: $(basename "$0") [VAR=value ...] COMMAND [ARGS...]" >&2; exit 2
fi
if [ ! -x "$CHROOT/usr/bin/condor_q" ]; then
  echo "condor_exec: no pool in $CHROOT; run workers/condor/install_pool.sh" >&2; exit 1
fi
workdir=$SCRATCH
while read -r bound; do
  case "$PWD/" in "$bound"/*) workdir=$PWD ;; esac
done < <(echo "$POOL_DIR"; ro_binds)
exec chroot --userspec="$POOL_USER:$POOL_USER" "$CHROOT" /usr/bin/env -i -C "$workdir" \
  HOME="$SCRATCH" USER="$POOL_USER" LOGNAME="$POOL_USER" LANG=C.UTF-8 \
  PATH=/usr/local/bin:/usr/bin:/bin:/usr/sbin:/sbin "$@"
