"""HTCondor across the box: the central manager on the manager host, a startd per rack host.

One trixie chroot (the personal pool's, ``workers/condor``) serves every host: each host of
the box runs its own ``condor_master -f`` inside it, started through
:meth:`~datavine.deploy.box.net.Box.start` (so it has the host's network, hosts file and
hostname, and ``box down`` stops it), with ``CONDOR_CONFIG`` naming a file of its own in the
box's folder (:func:`host_config`): the host's address (``NETWORK_INTERFACE``), name
(``NETWORK_HOSTNAME``), daemons, and its own log, spool, execute, lock and run folders under
``<box>/condor/<host>/``; the settings every host shares are in
``workers/condor/box_config.local``. The manager host runs the collector, negotiator and
schedd; each rack host a startd advertising ``DatavineRack`` and ``DatavineHost``, so a
pool's jobs can require their rack (:mod:`datavine.deploy.pools.condor` does, for
``--rack``).

- Mounts: the chroot's ``/proc``, ``/dev`` and binds come from ``start_pool.sh
  --mounts-only``, plus a read-write bind of the box's folder at its own path; at stop the
  box unbinds its folder, and the shared mounts go only when no process uses the chroot any
  more (the loopback pool, or another box, may) -- ``stop_pool.sh --mounts-only``.
- Names: the chroot keeps its own ``/etc/hosts`` (``/etc/netns`` does not reach inside a
  chroot); the box's hosts are added there as a block marked with the box's name while it
  is up (:func:`with_hosts_block`), and removed at stop.
- Security: IDTOKENS across hosts (minicondor's FS is one-host): a pool signing key and a
  token for ``condor@box`` made at start in ``<box>/condor/{passwords.d,tokens.d}`` (root
  only); jobs are submitted as the non-root pool user (``vinepool``) on the manager host.

:func:`start_condor` returns a :class:`BoxCondor`: :meth:`~BoxCondor.submit_env` is what a
``datavine pool start --batch condor`` run on the manager host needs to submit to this pool,
:meth:`~BoxCondor.slots` what ``condor_status`` shows; :func:`submit_env` gives the same
for a box found from its folder. :func:`stop_condor` works from any process (it reads
``<box>/condor/condor.json``).
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import os
import pwd
import secrets
import shutil
import signal
import subprocess
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from datavine.deploy.box.net import Box, BoxError
from datavine.deploy.box.plan import DOMAIN, BoxPlan, Host
from datavine.deploy.pools.condor import pool_user, scripts_dir
from datavine.deploy.pools.state import PROJECT_ROOT
from datavine.safe_paths import write_secret

SERVICE = "condor"
PORT = 29618  # DATAVINE_CONDOR_PORT of condor_config.local: each host has its own network
STATE = "condor.json"
TEMPLATE = "box_config.local"
DAEMON_IDENTITY = f"condor@{DOMAIN}"  # UID_DOMAIN = TRUST_DOMAIN = box (box_config.local)
CHROOT_PATH = "/usr/local/bin:/usr/bin:/bin:/usr/sbin:/sbin"
MANAGER_DAEMONS = "MASTER COLLECTOR NEGOTIATOR SCHEDD SHARED_PORT"
RACK_DAEMONS = "MASTER STARTD SHARED_PORT"
HOST_FOLDERS = ("log", "spool", "execute", "lock", "run", "cred_dir")
DAEMON_LOGS = ("MasterLog", "CollectorLog", "SchedLog", "NegotiatorLog", "StartLog")


def chroot_dir() -> Path:
    """The HTCondor chroot (``DATAVINE_CONDOR_ROOT`` overrides, as for the scripts)."""
    env = os.environ.get("DATAVINE_CONDOR_ROOT")
    return Path(env) if env else PROJECT_ROOT / "build" / "condor-root"


def condor_missing() -> str | None:
    """Why the box cannot run HTCondor here, or None."""
    if os.geteuid() != 0:
        return "HTCondor on the box runs in a chroot: run as root"
    root = chroot_dir()
    if not all((root / f).exists() for f in (".datavine-installed", "usr/sbin/condor_master")):
        return (f"the personal HTCondor pool is not installed in {root}: "
                "bash workers/condor/install_pool.sh (~2 min, ~400 MB)")
    for script in ("start_pool.sh", "stop_pool.sh", "condor_exec.sh", TEMPLATE):
        if not (scripts_dir() / script).exists():
            return f"{scripts_dir() / script} not found (set DATAVINE_CONDOR_SCRIPTS)"
    try:
        pwd.getpwnam(pool_user())
    except KeyError:
        return f"user {pool_user()} missing: run workers/condor/install_pool.sh"
    return None


# --- pure: hosts block, per-host configuration ------------------------------------------------
def _markers(box_name: str) -> tuple[str, str]:
    return (f"# datavine box {box_name}: begin (datavine.deploy.box.condor; removed at down)",
            f"# datavine box {box_name}: end")


def without_hosts_block(text: str, box_name: str) -> str:
    """``text`` (an ``/etc/hosts``) without the block of box ``box_name``."""
    begin, end = _markers(box_name)
    out, inside = [], False
    for line in text.splitlines(keepends=True):
        if line.rstrip("\n") == begin:
            inside = True
        elif inside and line.rstrip("\n") == end:
            inside = False
        elif not inside:
            out.append(line)
    return "".join(out)


def with_hosts_block(text: str, plan: BoxPlan) -> str:
    """``text`` with the block naming every host of ``plan`` (replacing an older one)."""
    begin, end = _markers(plan.spec.name)
    kept = without_hosts_block(text, plan.spec.name)
    if kept and not kept.endswith("\n"):
        kept += "\n"
    lines = [begin, *(f"{h.address}\t{h.fqdn} {h.name}" for h in plan.hosts), end]
    return kept + "\n".join(lines) + "\n"


def host_dir(condor_dir: Path, host: Host) -> Path:
    return condor_dir / host.name


def slot_share(plan: BoxPlan, slots_per_host: int, margin: float = 0.9) -> int:
    """Percent of the machine's memory and disk each slot advertises: the rack hosts share
    one machine, and a tenth is kept back (free disk moves while the box runs)."""
    slots = sum(1 for h in plan.hosts if h.rack is not None) * slots_per_host
    return max(1, int(100 * margin / slots))


def host_config(plan: BoxPlan, host: Host, condor_dir: Path, *, port: int = PORT,
                slots_per_host: int = 1) -> str:
    """The ``CONDOR_CONFIG`` of ``host``: the chroot's configuration, this host's names and
    folders, then the shared ``box_config.local`` (copied into ``condor_dir``) last."""
    mgr = plan.manager
    manager = host.name == mgr.name
    lines = [
        f"# HTCondor on {host.fqdn} in the box {plan.spec.name!r} "
        "(written by datavine.deploy.box.condor at start)",
        "include : /etc/condor/condor_config",
        f"DATAVINE_HOST_NAME = {host.fqdn}",
        f"DATAVINE_HOST_ADDRESS = {host.address}",
        f"DATAVINE_HOST_DIR = {host_dir(condor_dir, host)}",
        f"DATAVINE_BOX_CONDOR = {condor_dir}",
        f"DATAVINE_MANAGER_HOST = {mgr.fqdn}",
        f"DATAVINE_CONDOR_PORT = {port}",
        f"DATAVINE_DAEMONS = {MANAGER_DAEMONS if manager else RACK_DAEMONS}",
        f"DATAVINE_SLOTS = {slots_per_host}",
        f"DATAVINE_SLOT_SHARE = {slot_share(plan, slots_per_host)}",
    ]
    if host.rack is not None:
        lines += [f'DatavineRack = "{host.rack}"', f'DatavineHost = "{host.fqdn}"']
    lines.append(f"LOCAL_CONFIG_FILE = {condor_dir / TEMPLATE}")
    return "\n".join(lines) + "\n"


def master_argv(chroot: Path, config: Path) -> list[str]:
    """``condor_master`` in the foreground (``-f``: the box's session bookkeeping stops it),
    inside the chroot, with a clean environment naming the host's configuration."""
    return ["chroot", str(chroot), "/usr/bin/env", "-i", f"PATH={CHROOT_PATH}", "LANG=C.UTF-8",
            f"CONDOR_CONFIG={config}", "condor_master", "-f"]


def missing_ancestors(chroot: Path, path: Path) -> list[Path]:
    """The folders of ``chroot/path`` (``path`` itself included) that do not exist yet,
    deepest first: what binding ``path`` at its own path inside the chroot creates."""
    made = []
    inside = chroot / path.relative_to(path.anchor)
    while inside != chroot and not inside.exists():
        made.append(inside)
        inside = inside.parent
    return made


@dataclass(frozen=True)
class Slot:
    """A slot as ``condor_status`` shows it."""

    name: str
    machine: str
    rack: str | None
    host: str | None
    state: str
    activity: str
    auth: str  # how its startd authenticated to the collector (IDTOKENS across hosts)


_UNDEFINED = "undefined"
SLOT_ATTRS = ("Name", "Machine", "DatavineRack", "DatavineHost", "State", "Activity",
              "AuthenticationMethod")


def parse_slots(text: str) -> list[Slot]:
    """``condor_status -af`` lines of :data:`SLOT_ATTRS`."""
    out = []
    for line in text.splitlines():
        parts = line.split()
        if len(parts) != len(SLOT_ATTRS):
            continue
        name, machine, rack, host, state, activity, auth = parts
        out.append(Slot(name, machine, None if rack == _UNDEFINED else rack,
                        None if host == _UNDEFINED else host, state, activity, auth))
    return out


# --- the running pool -------------------------------------------------------------------------
class BoxCondor:
    """HTCondor running on a box (from :func:`start_condor`, or :func:`attach`)."""

    def __init__(self, box: Box, chroot: Path | None = None) -> None:
        self.box = box
        self.chroot = chroot or chroot_dir()

    @property
    def dir(self) -> Path:
        return self.box.dir / "condor"

    @property
    def pool_dir(self) -> Path:
        """Where ``datavine pool`` keeps the box's pools (state, factory scratch)."""
        return self.box.dir / "pools"

    def config(self, host: str | None = None) -> Path:
        """The ``CONDOR_CONFIG`` of ``host`` (default: the manager host)."""
        h = self.box.plan.host(host) if host else self.box.plan.manager
        return host_dir(self.dir, h) / "condor_config"

    def submit_env(self) -> dict[str, str]:
        """What ``datavine pool ... --batch condor`` run on the manager host needs in its
        environment to use this pool (its HTCondor configuration, a pools folder that the
        chroot sees, the chroot)."""
        return {"DATAVINE_CONDOR_CONFIG": str(self.config()),
                "DATAVINE_POOL_DIR": str(self.pool_dir),
                "DATAVINE_CONDOR_ROOT": str(self.chroot)}

    def env(self) -> dict[str, str]:
        """This process's environment with :meth:`submit_env` (for ``Box.run(env=...)``)."""
        return {**os.environ, **self.submit_env()}

    def condor(self, *args: str, host: str | None = None, timeout_s: float = 30.0,
               check: bool = False) -> subprocess.CompletedProcess[str]:
        """Run an HTCondor tool on ``host`` (default: the manager host) as the pool user."""
        h = host or self.box.plan.manager.name
        argv = [str(scripts_dir() / "condor_exec.sh"), f"CONDOR_CONFIG={self.config(h)}", *args]
        return self.box.run(h, argv, timeout_s=timeout_s, check=check, env=self.env())

    def slots(self) -> list[Slot]:
        """The pool's slots, from the collector (asked on the manager host)."""
        done = self.condor("condor_status", "-af", *SLOT_ATTRS)
        if done.returncode != 0:
            raise BoxError(f"condor_status on the box failed: {done.stderr.strip()[-500:]}")
        return parse_slots(done.stdout)

    def wait_ready(self, timeout_s: float = 60.0) -> list[Slot]:
        """Until every rack host offers its slots and the schedd is known (bounded)."""
        want = {h.fqdn for h in self.box.plan.hosts if h.rack is not None}
        deadline = time.monotonic() + timeout_s
        last = ""
        while time.monotonic() < deadline:
            done = self.condor("condor_status", "-af", *SLOT_ATTRS, timeout_s=15)
            slots = parse_slots(done.stdout) if done.returncode == 0 else []
            last = done.stderr.strip()[-300:]
            if want <= {s.machine for s in slots}:
                schedd = self.condor("condor_status", "-schedd", "-af", "Name", timeout_s=15)
                if schedd.returncode == 0 and schedd.stdout.strip():
                    return slots
            time.sleep(0.2)
        raise BoxError(f"HTCondor on the box: not every rack host offered a slot within "
                       f"{timeout_s:.0f} s ({last})\n{self.logs()}")

    def logs(self, lines: int = 15) -> str:
        """The daemon logs' last lines, per host (for error messages)."""
        parts = []
        for h in self.box.plan.hosts:
            for name in (*DAEMON_LOGS, "master.out"):
                path = host_dir(self.dir, h) / ("log" if name != "master.out" else "") / name
                if path.exists():
                    tail = path.read_text(errors="replace").splitlines()[-lines:]
                    parts.append(f"--- {h.name}: {path}\n" + "\n".join(tail))
        return "\n".join(parts)

    def stop(self) -> int:
        return stop_condor(self.box)


def attach(box: Box) -> BoxCondor | None:
    """The HTCondor started on ``box`` (from its state file), or None."""
    try:
        state = json.loads((box.dir / "condor" / STATE).read_text())
    except FileNotFoundError:
        return None
    return BoxCondor(box, Path(state["chroot"]))


def submit_env(box: Box) -> dict[str, str]:
    """:meth:`BoxCondor.submit_env` of the HTCondor running on ``box``; empty if none (for a
    command run on a box host: ``datavine box exec mgr -- datavine pool start ...``)."""
    cb = attach(box)
    return cb.submit_env() if cb is not None else {}


# --- start and stop ---------------------------------------------------------------------------
def _script(name: str, *args: str, env: dict[str, str],
            timeout_s: float = 120.0) -> subprocess.CompletedProcess[str]:
    try:
        return subprocess.run(["bash", str(scripts_dir() / name), *args], text=True,
                              capture_output=True, env={**os.environ, **env},
                              timeout=timeout_s, check=False)
    except subprocess.TimeoutExpired as exc:
        raise BoxError(f"{name} {' '.join(args)} did not finish in {timeout_s:.0f} s") from exc


def _edit_hosts(chroot: Path, edit: Callable[[str], str]) -> None:
    """Rewrite the chroot's ``/etc/hosts`` in place under a lock (boxes may start at once)."""
    path = chroot / "etc" / "hosts"
    with open(path, "r+") as f:
        fcntl.flock(f, fcntl.LOCK_EX)
        text = edit(f.read())
        f.seek(0)
        f.write(text)
        f.truncate()


def _chroot_uid(chroot: Path, user: str) -> tuple[int, int]:
    for line in (chroot / "etc" / "passwd").read_text().splitlines():
        parts = line.split(":")
        if parts[0] == user:
            return int(parts[2]), int(parts[3])
    raise BoxError(f"no user {user!r} in {chroot}/etc/passwd: is HTCondor installed there?")


def _in_chroot(chroot: Path, config: Path, *argv: str, input_text: str | None = None,
               ) -> subprocess.CompletedProcess[str]:
    """Run an HTCondor tool as root in the chroot (on this machine's network)."""
    cmd = ["chroot", str(chroot), "/usr/bin/env", "-i", f"PATH={CHROOT_PATH}",
           f"CONDOR_CONFIG={config}", *argv]
    done = subprocess.run(cmd, text=True, capture_output=True, input=input_text, timeout=30,
                          check=False)
    if done.returncode != 0:
        raise BoxError(f"'{' '.join(argv)}' in {chroot} failed: "
                       f"{(done.stderr or done.stdout).strip()[-500:]}")
    return done


def _prepare(cb: BoxCondor, slots_per_host: int) -> None:
    """The box's HTCondor folder: per-host configurations and folders, the shared template,
    the signing key's and tokens' folders, the pools' folder."""
    plan = cb.box.plan
    uid, gid = _chroot_uid(cb.chroot, "condor")
    shutil.rmtree(cb.dir, ignore_errors=True)  # a previous start's state, logs, jobs
    cb.dir.mkdir(parents=True)
    shutil.copyfile(scripts_dir() / TEMPLATE, cb.dir / TEMPLATE)
    for secret in ("passwords.d", "tokens.d"):
        (cb.dir / secret).mkdir(mode=0o700)
    for h in plan.hosts:
        hdir = host_dir(cb.dir, h)
        hdir.mkdir()
        for sub in HOST_FOLDERS:
            (hdir / sub).mkdir()
            os.chown(hdir / sub, uid, gid)
        (hdir / "condor_config").write_text(
            host_config(plan, h, cb.dir, slots_per_host=slots_per_host))
    user = pwd.getpwnam(pool_user())
    (cb.pool_dir / "condor").mkdir(parents=True, exist_ok=True)
    os.chown(cb.pool_dir / "condor", user.pw_uid, user.pw_gid)


def _make_token(cb: BoxCondor) -> None:
    """The box's pool signing key and the daemons' token (``condor@box``), root only."""
    config = cb.config()
    key = cb.dir / "passwords.d" / "POOL"
    _in_chroot(cb.chroot, config, "condor_store_cred", "add", "-c", "-i", "-", "-f", str(key),
               input_text=secrets.token_hex(24))  # on stdin: never on a command line
    token = _in_chroot(cb.chroot, config, "condor_token_create", "-identity", DAEMON_IDENTITY,
                       "-key", "POOL").stdout.strip()
    if not token:
        raise BoxError("condor_token_create printed no token")
    write_secret(cb.dir / "tokens.d" / "condor", token + "\n")


def start_condor(box: Box, *, timeout_s: float = 60.0, slots_per_host: int = 1) -> BoxCondor:
    """Start HTCondor on ``box``: the chroot's mounts and the box's hosts in its hosts file,
    a ``condor_master`` per host; wait (bounded) until every rack host offers a slot.

    ``slots_per_host``: slots per rack host (1: a worker job takes the whole host, so a
    rack's pool of N workers lands on N hosts, as whole-node jobs do at a facility)."""
    why = condor_missing()
    if why:
        raise BoxError(why)
    cb = BoxCondor(box)
    if (cb.dir / STATE).exists():
        stop_condor(box)
    _prepare(cb, slots_per_host)
    made = missing_ancestors(cb.chroot, box.dir)
    state = {"chroot": str(cb.chroot), "bound": str(box.dir), "made": [str(p) for p in made],
             "started_at": time.time()}
    (cb.dir / STATE).write_text(json.dumps(state, indent=1))
    try:
        mounted = _script("start_pool.sh", "--mounts-only",
                          env={"DATAVINE_CONDOR_ROOT": str(cb.chroot),
                               "DATAVINE_CONDOR_RW_BINDS": str(box.dir)})
        if mounted.returncode != 0:
            raise BoxError(f"start_pool.sh --mounts-only failed: {mounted.stderr.strip()}")
        _edit_hosts(cb.chroot, lambda text: with_hosts_block(text, box.plan))
        _make_token(cb)
        for h in box.plan.hosts:  # the manager first: the startds report to its collector
            box.start(h.name, master_argv(cb.chroot, cb.config(h.name)), name=SERVICE,
                      log=host_dir(cb.dir, h) / "master.out")
        cb.wait_ready(timeout_s)
    except BaseException:
        stop_condor(box)
        raise
    return cb


def _chroot_pids_in(chroot: Path, net_namespaces: set[str]) -> list[int]:
    """PIDs rooted in ``chroot`` whose network namespace is one of ``net_namespaces``
    (``net:[inode]`` as ``/proc/PID/ns/net`` reads)."""
    root = str(chroot.resolve())
    out = []
    for proc in Path("/proc").iterdir():
        if not proc.name.isdigit():
            continue
        try:
            if (os.readlink(proc / "root") == root
                    and os.readlink(proc / "ns/net") in net_namespaces):
                out.append(int(proc.name))
        except OSError:
            continue
    return out


def _box_net_namespaces(box: Box) -> set[str]:
    """``net:[inode]`` of the box's host namespaces (read through a process in each)."""
    found = set()
    for h in box.plan.hosts:
        done = subprocess.run(["ip", "netns", "exec", h.namespace, "readlink",
                               "/proc/self/ns/net"], text=True, capture_output=True,
                              timeout=10, check=False)
        if done.returncode == 0 and done.stdout.strip():
            found.add(done.stdout.strip())
    return found


def _kill_chroot_processes(box: Box, chroot: Path, grace_s: float = 5.0) -> int:
    """Jobs, factories and daemons of the box still running in the chroot: SIGTERM, then
    SIGKILL after ``grace_s``. Processes of the chroot in other namespaces are left alone."""
    namespaces = _box_net_namespaces(box)
    if not namespaces:
        return 0
    found = _chroot_pids_in(chroot, namespaces)
    for pid in found:
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGTERM)
    deadline = time.monotonic() + grace_s
    while _chroot_pids_in(chroot, namespaces) and time.monotonic() < deadline:
        time.sleep(0.1)
    for pid in _chroot_pids_in(chroot, namespaces):
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGKILL)
    return len(found)


def stop_condor(box: Box) -> int:
    """Stop HTCondor on ``box`` (if it was started): its daemons and whatever of the box
    still runs in the chroot, its bind, the shared mounts if nothing else uses the chroot,
    its hosts block. Returns the processes stopped. Idempotent."""
    state_file = box.dir / "condor" / STATE
    try:
        state = json.loads(state_file.read_text())
    except FileNotFoundError:
        return 0
    chroot = Path(state["chroot"])
    stopped = box.stop(SERVICE)
    stopped += _kill_chroot_processes(box, chroot)
    unmounted = _script("stop_pool.sh", "--mounts-only", "--unbind", state["bound"],
                        env={"DATAVINE_CONDOR_ROOT": str(chroot)})
    if unmounted.returncode != 0:
        raise BoxError(f"stop_pool.sh --mounts-only failed: {unmounted.stderr.strip()}")
    for folder in state.get("made", []):  # mount points the bind made, deepest first
        with contextlib.suppress(OSError):
            Path(folder).rmdir()
    _edit_hosts(chroot, lambda text: without_hosts_block(text, box.plan.spec.name))
    state_file.unlink()
    return stopped


def box_mounts(chroot: Path, box_dir: Path) -> list[str]:
    """Mount points of the box's folder inside the chroot (none once stopped)."""
    target = str(chroot / box_dir.relative_to(box_dir.anchor))
    out = subprocess.run(["findmnt", "-rn", "-o", "TARGET"], text=True, capture_output=True,
                         check=False).stdout
    return [m for m in out.splitlines() if m == target or m.startswith(target + "/")]


def box_hosts_in_chroot(chroot: Path, box_name: str) -> bool:
    """Whether the chroot's hosts file still has the box's block."""
    begin, _ = _markers(box_name)
    return begin in (chroot / "etc" / "hosts").read_text()

