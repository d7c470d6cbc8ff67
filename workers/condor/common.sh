# Shared settings of the personal HTCondor pool scripts (sourced, not run).
#
# The pool is HTCondor 23 (Debian trixie's `minicondor`) inside a trixie chroot, because
# bookworm ships no HTCondor. Everything the jobs need from the host (TaskVine's prefix, the
# venv, the Python it links to, datavine's sources, the pools' scratch folder) is
# bind-mounted at the *same path* inside the chroot, so a path means the same file on both
# sides and jobs run the very vine_worker and interpreter the manager uses.
#
# Override with the environment:
#   DATAVINE_CONDOR_ROOT   the chroot            (default: <project>/build/condor-root)
#   DATAVINE_POOL_DIR      pools' state/scratch  (default: <project>/build/pools)
#   DATAVINE_POOL_USER     the non-root user that submits and runs jobs (default: vinepool)
#   DATAVINE_CONDOR_BINDS  extra host folders to bind read-only, colon-separated
#   DATAVINE_CONDOR_RW_BINDS  host folders to bind read-write, colon-separated (a box's
#                          folder: its HTCondor daemons keep their state there)

PROJECT=$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)
CONDOR_DIR="$PROJECT/workers/condor"
CHROOT=${DATAVINE_CONDOR_ROOT:-$PROJECT/build/condor-root}
POOL_DIR=${DATAVINE_POOL_DIR:-$PROJECT/build/pools}
POOL_USER=${DATAVINE_POOL_USER:-vinepool}
SUITE=trixie
INSTALLED_MARK="$CHROOT/.datavine-installed"
# The scratch folder the pool user writes (factory scratch, submit files, job logs).
SCRATCH="$POOL_DIR/condor"
# Condor's logs inside the chroot, seen from the host.
CONDOR_LOG_DIR="$CHROOT/var/log/condor"

# The interpreter behind .venv (a pyenv build under /root): its prefix is bound as is.
python_prefix() {
  local home
  home=$(sed -n 's/^home *= *//p' "$PROJECT/.venv/pyvenv.cfg" 2>/dev/null)
  [ -n "$home" ] && dirname "$home"
}

# Host folders bound read-only (same path) into the chroot, one per line.
ro_binds() {
  local d
  for d in "$PROJECT/build/cctools" "$PROJECT/.venv" "$PROJECT/src" "$(python_prefix)"; do
    [ -n "$d" ] && [ -d "$d" ] && echo "$d"
  done
  if [ -n "${DATAVINE_CONDOR_BINDS:-}" ]; then
    tr ':' '\n' <<<"$DATAVINE_CONDOR_BINDS" | sed '/^$/d'
  fi
}

# Host folders bound read-write (same path) besides the pools' folder, one per line.
rw_binds() {
  if [ -n "${DATAVINE_CONDOR_RW_BINDS:-}" ]; then
    tr ':' '\n' <<<"$DATAVINE_CONDOR_RW_BINDS" | sed '/^$/d'
  fi
  return 0
}

# Mount points under the chroot, deepest first (so they can be unmounted in order).
chroot_mounts() {
  findmnt -rn -o TARGET 2>/dev/null | awk -v r="$CHROOT" 'index($0, r "/") == 1' | sort -r
}

# PIDs of processes whose root directory is the chroot (condor daemons, jobs, factories).
chroot_pids() {
  local p root
  for p in /proc/[0-9]*; do
    root=$(readlink "$p/root" 2>/dev/null) || continue
    [ "$root" = "$CHROOT" ] && echo "${p#/proc/}"
  done
  return 0
}

# Of those, the PIDs in this shell's network namespace: the personal pool's on loopback. The
# chroot also serves the boxes' HTCondor (datavine.deploy.box.condor), one condor_master per
# network namespace; the loopback pool's scripts never touch those.
chroot_pids_here() {
  local p me
  me=$(readlink /proc/self/ns/net)
  for p in $(chroot_pids); do
    [ "$(readlink "/proc/$p/ns/net" 2>/dev/null)" = "$me" ] && echo "$p"
  done
  return 0
}

need_root() {
  [ "$(id -u)" = 0 ] || { echo "$(basename "$0"): run as root (chroot, mounts)" >&2; exit 1; }
}
