"""The box as a facility: bring it up with its services, describe it in a facility file.

:func:`bring_up` makes the network (:mod:`.net`), and optionally the XCache origin and
shards (:mod:`.services`) and HTCondor (:mod:`.condor`); :func:`facility_text` (pure)
writes the facility file a site operator would: the manager's host name and listening
address, the shards by host name with their racks, and which hosts sit in which rack;
:func:`start_workers` starts ``vine_worker`` by hand on rack hosts, as an operator would
without a batch system, each saying its rack (``--feature rack:A``).
"""

from __future__ import annotations

import secrets
from collections.abc import Sequence
from pathlib import Path

from datavine.deploy.binaries import vine_binary
from datavine.deploy.box.net import Box
from datavine.deploy.box.plan import BoxPlan, BoxSpec
from datavine.deploy.local_workers import worker_environment
from datavine.safe_paths import check_own_file, check_private_file, write_secret
from datavine.scheduler.labels import ENV_RACK, ENV_WORKER, rack_feature, worker_feature

MANAGER_PORT = 9123
WORKERS = "vine_worker"


def bring_up(spec: BoxSpec, directory: Path | None = None, *, data: Path | None = None,
             xcache: bool = False, condor: bool = False) -> Box:
    """The box with the services asked for, and its facility file (``facility.toml``)."""
    box = Box.up(spec, directory)
    try:
        if xcache or data is not None:
            from datavine.deploy.box.services import start_xcache

            if data is None:
                raise ValueError("the box's XCache needs the folder its origin serves (data)")
            start_xcache(box, data)
        if condor:
            from datavine.deploy.box.condor import start_condor

            start_condor(box)
        password = password_file(box)
        (box.dir / "facility.toml").write_text(
            facility_text(box.plan, password_file=password, export_root=data,
                          run_dir=box.dir / "manager", pools="condor" if condor else None))
    except BaseException:
        take_down(box)
        raise
    return box


def take_down(box: Box) -> dict[str, int]:
    """Stop HTCondor (and its mounts) if it runs, then everything else, then the network."""
    from datavine.deploy.box.condor import stop_condor

    stop_condor(box)  # does nothing where HTCondor was not started
    return box.down()


def password_file(box: Box) -> Path:
    """The manager's password for the box's workers (made once, mode 0600; one found there
    is used only when it is a file of this user's that no one else may open)."""
    path = box.dir / "vine.password"
    try:
        return write_secret(path, secrets.token_hex(32) + "\n")
    except FileExistsError:  # made by an earlier call: kept
        check_own_file(path, "box password file")
        return check_private_file(path, "the box's password file")


def facility_text(plan: BoxPlan, *, password_file: Path, export_root: Path | None,
                  run_dir: Path, pools: str | None = None, port: int = MANAGER_PORT,
                  cores: int = 1, memory_mb: int = 2000) -> str:
    """The box's facility file (see ``manager/facility.example.toml`` for every key)."""
    mgr = plan.manager
    lines = [
        f"# datavine facility file for the box {plan.spec.name!r} (made by datavine box up)",
        "[manager]",
        f'host = "{mgr.fqdn}"',
        f'listen_host = "{mgr.address}"',
        f"port = {port}",
        f'password_file = "{password_file}"',
        f'run_dir = "{run_dir}"',
        f'name = "datavine-{plan.spec.name}"',
        "",
        "[racks]  # hosts to racks, as the worker's own hostname or address matches",
    ]
    for rack in plan.rack_names:
        hosts = ", ".join(f'"{h.fqdn}"' for h in plan.rack_hosts(rack))
        lines.append(f"{rack} = [{hosts}]")
    if export_root is not None:
        lines += ["", "[xcache]", f'origin = "root://{mgr.fqdn}:1094"',
                  f'export_root = "{Path(export_root).resolve()}"']
        for host in plan.shard_hosts():
            lines += ["", "[[xcache.shards]]", f'name = "xcache-{host.rack}"',
                      f'url = "root://{host.fqdn}:1094"', f'rack = "{host.rack}"']
    if pools is not None:
        for rack in plan.rack_names:
            n = len(plan.rack_hosts(rack))
            lines += ["", "[[pools]]", f'name = "rack-{rack.lower()}"', f'batch = "{pools}"',
                      f"workers = {n}", f"cores = {cores}", f"memory_mb = {memory_mb}",
                      f'rack = "{rack}"']
    return "\n".join(lines) + "\n"


def worker_argv(host_fqdn: str, rack: str | None, manager: str, port: int, password: Path,
                workspace: Path, cores: int = 1, name: str | None = None) -> list[str]:
    """``vine_worker`` as an operator starts it by hand on a rack host: it says its rack
    (and a name the manager can send work to) as features."""
    argv = [str(vine_binary("vine_worker")), manager, str(port), "--cores", str(cores),
            "--password", str(password), "--workspace", str(workspace), "--timeout", "900"]
    if rack is not None:
        argv += ["--feature", rack_feature(rack)]
    if name is not None:
        argv += ["--feature", worker_feature(name)]
    return argv


def start_workers(box: Box, *, port: int = MANAGER_PORT, cores: int = 1,
                  hosts: Sequence[str] | None = None, named: bool = True) -> list[str]:
    """One ``vine_worker`` per rack host (or per host of ``hosts``), started on that host,
    connecting to the manager by name. Returns the hosts they run on."""
    chosen = [box.plan.host(h) for h in hosts] if hosts else [
        h for h in box.plan.hosts if h.rack is not None]
    password = password_file(box)
    for h in chosen:
        name = f"w-{h.name}" if named else None
        labels = {ENV_RACK: h.rack or ""}
        if name is not None:
            labels[ENV_WORKER] = name
        workspace = box.dir / "workers" / h.name
        workspace.mkdir(parents=True, exist_ok=True)
        argv = worker_argv(h.fqdn, h.rack, box.plan.manager.fqdn, port, password, workspace,
                           cores, name)
        box.start(h.name, argv, name=WORKERS, env=worker_environment(labels))
    return [h.name for h in chosen]


def stop_workers(box: Box) -> int:
    return box.stop(WORKERS)
