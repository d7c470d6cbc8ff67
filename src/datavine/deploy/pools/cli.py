"""``datavine pool start|status|stop``: worker pools that outlive the command starting them.

``add_pool_commands(subparsers)`` adds the ``pool`` command to datavine's CLI; every
sub-command sets ``func``, a handler taking the parsed arguments and returning an exit code.
``python -m datavine.deploy.pools.cli pool ...`` runs the same commands on their own.

A started pool is a detached ``vine_factory``; its state file in the pools folder
(``build/pools/<name>.json``) is how ``status`` and ``stop`` find it later.

``pool start --ssl-ca FILE`` / ``--ssl-fingerprint HEX`` have the workers check the
manager's certificate (:mod:`datavine.deploy.tls`); given neither, ``--facility``'s manager
supplies them (its ``ssl_ca``/``ssl_fingerprint``, or a pin to its ``ssl_cert``). ``--ssl``
alone encrypts and checks nothing, and says so.
"""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Callable, Sequence
from dataclasses import asdict
from pathlib import Path

from datavine.apps import cli_types
from datavine.config import ConfigError
from datavine.deploy.pools.base import PoolError, PoolTimeoutError
from datavine.deploy.pools.factory import BATCHES, FactoryConfig
from datavine.deploy.pools.factory_pool import FactoryPool, pool_class
from datavine.deploy.pools.state import default_pool_dir, list_states
from datavine.deploy.tls import ManagerTrust, check_ca_file, check_fingerprint

Handler = Callable[[argparse.Namespace], int]


def local_transfer_address(batch: str, manager_host: str) -> str | None:
    """Where a pool's workers' transfer servers listen: a local pool for a manager on
    loopback listens on loopback too (nothing open beyond this host); elsewhere on every
    interface of the worker's host, where its peers reach it."""
    from datavine.scheduler.racks import is_loopback

    return "127.0.0.1" if batch == "local" and is_loopback(manager_host) else None


def _manager(text: str) -> tuple[str, int]:
    host, sep, port = text.rpartition(":")
    if not sep or not host or not port.isdigit():
        raise argparse.ArgumentTypeError(f"expected HOST:PORT, got {text!r}")
    return host, int(port)


def _ca_file(text: str) -> Path:
    try:
        return check_ca_file(Path(text).resolve(), "--ssl-ca")
    except ConfigError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None


def _fingerprint(text: str) -> str:
    try:
        return check_fingerprint(text, "--ssl-fingerprint")
    except ConfigError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None


def add_pool_commands(subparsers: argparse._SubParsersAction) -> argparse.ArgumentParser:
    """Add ``pool start|status|stop`` to a CLI's sub-commands; returns the ``pool`` parser."""
    pool = subparsers.add_parser("pool", help="start, watch and stop vine_factory worker pools",
                                 description="Start, watch and stop vine_factory worker pools; a "
                                 "started pool outlives the command that started it.")
    sub = pool.add_subparsers(dest="pool_command", required=True, metavar="{start,status,stop}")

    start = sub.add_parser("start", help="start a pool (a detached vine_factory)")
    start.add_argument("--batch", choices=BATCHES, default="condor",
                       help="condor: HTCondor jobs; local: processes on this host")
    start.add_argument("--workers", type=cli_types.positive, required=True, metavar="N",
                       help="most workers at once")
    start.add_argument("--min-workers", type=cli_types.non_negative, metavar="M",
                       help="workers kept without work (default: N, a pre-started pool)")
    start.add_argument("--cores", type=cli_types.positive, default=1, metavar="C")
    start.add_argument("--memory", type=cli_types.positive, metavar="MB")
    start.add_argument("--disk", type=cli_types.positive, metavar="MB")
    start.add_argument("--rack", help="label the workers with the feature rack:<RACK>")
    start.add_argument("--facility", type=Path, metavar="FILE",
                       help="a facility file: without --rack, the workers get the rack of "
                       "its [[pools]] entry named --name")
    start.add_argument("--anonymous", action="store_true",
                       help="do not name the workers (no worker:<name> feature): placement "
                       "can then target their rack only")
    start.add_argument("--feature", action="append", default=[], help="a worker feature")
    start.add_argument("--manager", type=_manager, required=True, metavar="HOST:PORT")
    start.add_argument("--password", type=Path, metavar="FILE", help="the manager's password")
    start.add_argument("--ssl", action="store_true",
                       help="workers connect with TLS (and check nothing, without --ssl-ca "
                       "or --ssl-fingerprint)")
    start.add_argument("--ssl-ca", type=_ca_file, metavar="FILE",
                       help="workers check the manager's certificate against these CA "
                       "certificates (PEM) and the name in --manager; implies --ssl")
    start.add_argument("--ssl-fingerprint", type=_fingerprint, metavar="HEX",
                       help="workers check that the manager's certificate has this SHA-256 "
                       "fingerprint (colons allowed); implies --ssl")
    start.add_argument("--idle-timeout", type=cli_types.positive, default=900, metavar="S",
                       help="a worker without work for S seconds exits (default 900)")
    start.add_argument("--factory-period", type=cli_types.positive, default=5, metavar="S")
    start.add_argument("--condor-submit", action="append", default=[], metavar="LINE",
                       help="an extra line for the HTCondor submit file")
    start.add_argument("--debug-workers", action="store_true")
    start.add_argument("--wait", action="store_true",
                       help="return once the pool's pre-started workers (M, or N when M "
                       "is 0) are connected to the manager")
    start.add_argument("--timeout", type=float, default=120.0, metavar="S",
                       help="with --wait: give up after S seconds (default 120)")
    start.set_defaults(func=cmd_start)

    status = sub.add_parser("status", help="factory, batch jobs and connected workers")
    status.add_argument("--json", action="store_true", help="one JSON object per pool")
    status.set_defaults(func=cmd_status)

    stop = sub.add_parser("stop", help="stop a pool and remove its workers")
    stop.add_argument("--all", action="store_true", help="stop every pool")
    stop.add_argument("--timeout", type=float, default=30.0, metavar="S")
    stop.set_defaults(func=cmd_stop)

    for p in (start, status, stop):
        p.add_argument("--name", help="the pool's name (start: default 'default'; status "
                       "and stop: the only pool, when there is one)")
        p.add_argument("--pool-dir", type=Path, default=None,
                       help="where pools keep state (default: $DATAVINE_POOL_DIR or "
                       "build/pools)")
    return pool


def _errors_to_exit(handler: Handler) -> Handler:
    def run(args: argparse.Namespace) -> int:
        try:
            return handler(args)
        except (PoolError, ConfigError) as exc:
            print(f"datavine pool {args.pool_command}: {exc}", file=sys.stderr)
            return 1
    run.__doc__ = handler.__doc__
    return run


def _pool_dir(args: argparse.Namespace) -> Path:
    return args.pool_dir if args.pool_dir is not None else default_pool_dir()


def _names(args: argparse.Namespace, *, every: bool) -> list[str]:
    """The pools a status/stop command is about."""
    if args.name:
        return [args.name]
    names = [s.name for s in list_states(_pool_dir(args))]
    if every or len(names) <= 1:
        return names
    raise PoolError(f"pools {', '.join(names)} are running: choose one with --name (or --all)")


@_errors_to_exit
def cmd_start(args: argparse.Namespace) -> int:
    """``datavine pool start``."""
    host, port = args.manager
    rack = args.rack or _facility_rack(args)
    trust = _trust(args)
    cfg = FactoryConfig(
        manager_host=host, manager_port=port, batch=args.batch, workers=args.workers,
        min_workers=args.workers if args.min_workers is None else args.min_workers,
        cores=args.cores, memory_mb=args.memory, disk_mb=args.disk,
        features=tuple(args.feature), rack=rack, named=not args.anonymous,
        password_file=args.password.resolve() if args.password else None, ssl=args.ssl,
        ssl_ca=trust.ca_file if trust else None,
        ssl_fingerprint=trust.fingerprint if trust else None,
        idle_timeout_s=args.idle_timeout, factory_period_s=args.factory_period,
        extra_condor_submit=tuple(args.condor_submit), debug_workers=args.debug_workers,
        transfer_address=local_transfer_address(args.batch, host))
    pool = pool_class(args.batch)(cfg, name=args.name or "default", pool_dir=_pool_dir(args))
    pool.start(detach=True)
    print(f"pool {pool.name!r} started: vine_factory pid {pool.pid} ({args.batch}), "
          f"up to {cfg.workers} worker(s) for the manager at {cfg.manager}; "
          f"log {pool.log_path}")
    if cfg.ssl and trust is None:
        print(f"pool {pool.name!r}: its workers use TLS but do not check the manager's "
              "certificate: anyone holding its address can play the manager (give "
              "--ssl-ca or --ssl-fingerprint)", file=sys.stderr)
    if rack is None:
        print(f"pool {pool.name!r}: its workers have no rack, so placement cannot keep reads "
              "near them (give --rack, or --facility with a rack for this pool)")
    if args.wait:
        # Only min_workers are started without work; with none, wait for work's N.
        target = cfg.min_workers or cfg.workers
        try:
            status = pool.wait_for_workers(target, args.timeout)
        except PoolTimeoutError as exc:
            print(f"datavine pool start: {exc}; the pool is left running "
                  f"(datavine pool stop --name {pool.name})", file=sys.stderr)
            return 1
        print(status.summary())
    return 0


def _trust(args: argparse.Namespace) -> ManagerTrust | None:
    """What the workers check the manager's certificate against: ``--ssl-ca`` and/or
    ``--ssl-fingerprint``; given neither, ``--facility``'s manager's (if it has TLS)."""
    if args.ssl_ca is not None or args.ssl_fingerprint is not None:
        return ManagerTrust(args.ssl_ca, args.ssl_fingerprint)
    if args.facility is None:
        return None
    from datavine.deploy.facility import load_facility

    return load_facility(args.facility, check_files=False).worker_trust()


def _facility_rack(args: argparse.Namespace) -> str | None:
    """The rack of this pool's entry in ``--facility``, if any."""
    if args.facility is None:
        return None
    from datavine.deploy.facility import load_facility

    name = args.name or "default"
    facility = load_facility(args.facility, check_files=False)
    for pool in facility.pools:
        if pool.name == name:
            return pool.rack
    raise ConfigError(f"{args.facility} has no [[pools]] entry named {name!r} "
                      f"(it has: {', '.join(p.name for p in facility.pools) or 'none'})")


@_errors_to_exit
def cmd_status(args: argparse.Namespace) -> int:
    """``datavine pool status``."""
    names = _names(args, every=True)
    if not names:
        print(f"no pools in {_pool_dir(args)}")
        return 0
    for name in names:
        status = FactoryPool.attach(name, _pool_dir(args)).status()
        print(json.dumps(asdict(status)) if args.json else status.summary())
    return 0


@_errors_to_exit
def cmd_stop(args: argparse.Namespace) -> int:
    """``datavine pool stop``."""
    names = _names(args, every=args.all)
    if not names:
        print(f"no pools in {_pool_dir(args)}")
        return 0
    for name in names:
        FactoryPool.attach(name, _pool_dir(args)).stop(timeout_s=args.timeout)
        print(f"pool {name!r} stopped; no worker job left")
    return 0


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="datavine")
    add_pool_commands(parser.add_subparsers(dest="command", required=True))
    args = parser.parse_args(argv)
    return int(args.func(args))


if __name__ == "__main__":
    sys.exit(main())
