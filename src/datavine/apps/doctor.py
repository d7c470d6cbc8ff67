"""``datavine doctor``: what the TaskVine in use can do for datavine, and what it lacks.

It starts a TaskVine manager on loopback (with a password, as every datavine manager) and
one local ``vine_worker``, reads the manager's capability record
(:mod:`datavine.manager.capabilities`: the record every manager probes when it starts,
completed by the worker's status) and prints where this TaskVine is, then one line per
missing capability: what is lost and how to get it back. Exit code 0 when nothing is
missing, 1 when something is, 2 when TaskVine cannot be started at all (the message says
why). ``--json`` prints the record as JSON instead.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import tempfile
import time
from pathlib import Path
from typing import TYPE_CHECKING

from datavine.apps import cli_types

if TYPE_CHECKING:
    from datavine.manager.capabilities import Capabilities

WORKER_WAIT_S = 30.0
EXIT_MISSING = 1  # something is missing (2: TaskVine did not start, as every command's error)


def add_command(subparsers: argparse._SubParsersAction) -> None:
    doctor = subparsers.add_parser(
        "doctor", help="what the TaskVine in use lacks for datavine, and how to get it",
        description="Start a TaskVine manager on loopback and one local worker, and say "
        "which of the capabilities datavine's TaskVine build adds are missing: one line "
        "each, with what is lost and how to get it back. Exit code 1 when any is missing.")
    doctor.add_argument("--json", action="store_true", help="print the record as JSON")
    doctor.add_argument("--worker-wait", type=cli_types.seconds, default=WORKER_WAIT_S,
                        metavar="S", help="how long to wait for the local worker "
                        f"(default {WORKER_WAIT_S:.0f})")
    doctor.set_defaults(func=cmd_doctor)


def cmd_doctor(args: argparse.Namespace) -> int:
    record = examine(args.worker_wait)
    if args.json:
        print(json.dumps(record.to_dict(), indent=2))
    else:
        print(f"TaskVine: {record.source}")
        lines = record.lines()
        for line in lines:
            print(f"missing: {line}")
        unknown = [c.key for c in record.unknown()]
        if unknown:
            print(f"not known: {', '.join(unknown)} (no worker reported in time)")
        checked = len(record.found) + 1  # the internals count as one
        print(f"{len(lines)} missing of {checked} capabilities checked" if lines
              else f"nothing missing: {checked} capabilities checked")
    return EXIT_MISSING if record.lines() else 0


def examine(worker_wait_s: float) -> Capabilities:
    """The capability record of a manager started here, completed by one local worker's
    status (``worker_wait_s``: how long to wait for it)."""
    from datavine.config import LocalWorkersConfig, ManagerConfig
    from datavine.deploy.local_workers import LocalWorkers
    from datavine.manager.taskvine_port import TaskVinePort

    with tempfile.TemporaryDirectory(prefix="datavine-doctor-") as tmp:
        run_dir = Path(tmp)
        password = run_dir / "password"
        fd = os.open(password, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
        with os.fdopen(fd, "w") as out:
            out.write(os.urandom(16).hex() + "\n")
        port = TaskVinePort(ManagerConfig(password_file=password, run_dir=run_dir))
        workers = LocalWorkers(LocalWorkersConfig(workers=1, cores=1, idle_timeout_s=60),
                               port.port, run_dir / "workers", password_file=password,
                               host=port.contact_host, transfer_address=port.listen_address)
        try:
            workers.start()
            deadline = time.monotonic() + worker_wait_s
            while (port.capabilities.found.get("worker-features") is None
                   and time.monotonic() < deadline and workers.alive()):
                port.wait_task(1)  # accepts the worker, takes its messages
                if port.connected_workers():
                    port.worker_list()  # the record learns from it
            return port.capabilities
        finally:
            with contextlib.suppress(Exception):
                workers.stop()
            port.close()
