"""``datavine box up|down|status|exec|cut|restore|shape``: a facility in a box, by hand.

``up`` makes the namespaces (and, with ``--xcache``/``--condor``, starts the origin and a
shard per rack, and HTCondor across the hosts) and writes ``facility.toml`` for the box in
its folder; ``exec HOST -- CMD`` runs a command on a host, as a user logged into it would
(``datavine box exec mgr -- datavine run --facility build/box/box/facility.toml``); ``down``
removes everything the box made. Every sub-command sets ``func`` (arguments -> exit code).
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from collections.abc import Callable
from pathlib import Path

from datavine.deploy.box.net import Box, BoxError
from datavine.deploy.box.plan import BoxSpec

Handler = Callable[[argparse.Namespace], int]


def _box(args: argparse.Namespace) -> Box:
    return Box.load(args.dir, args.name)


def cmd_up(args: argparse.Namespace) -> int:
    from datavine.deploy.box.facility import bring_up

    spec = BoxSpec(name=args.name, racks=args.racks, hosts_per_rack=args.hosts_per_rack,
                   link_mbit=args.link_mbit)
    box = bring_up(spec, args.dir, data=args.data, xcache=args.xcache or args.data is not None,
                   condor=args.condor)
    status = box.status()
    for h in status["hosts"]:
        role = "manager, origin" if h["rack"] is None else f"rack {h['rack']}"
        role += ", XCache shard" if h["shard"] else ""
        print(f"{h['name']:10} {h['address']:15} {role}")
    print(f"inter-rack link {box.link_mbit:g} Mbit/s; folder {box.dir}")
    facility = box.dir / "facility.toml"
    if facility.exists():
        print(f"facility file: {facility}")
    print("run on a host:  datavine box exec mgr -- CMD ...   take down: datavine box down")
    return 0


def cmd_down(args: argparse.Namespace) -> int:
    from datavine.deploy.box.facility import take_down

    try:
        box = _box(args)
    except BoxError as exc:
        print(f"datavine box down: {exc}", file=sys.stderr)
        return 0
    removed = take_down(box)
    print(f"box {box.plan.spec.name} down: {removed}")
    return 0


def cmd_status(args: argparse.Namespace) -> int:
    print(json.dumps(_box(args).status(), indent=1))
    return 0


def cmd_exec(args: argparse.Namespace) -> int:
    argv = args.argv[1:] if args.argv[:1] == ["--"] else args.argv
    if not argv:
        raise BoxError("datavine box exec HOST -- COMMAND: no command given")
    from datavine.deploy.box.condor import submit_env

    box = _box(args)
    # the box's HTCondor, if it runs: `datavine pool start --batch condor` on a box host
    # submits to it
    os.execvpe("ip", box.exec_argv(args.host, argv), {**os.environ, **submit_env(box)})
    return 0  # not reached


def cmd_cut(args: argparse.Namespace) -> int:
    box = _box(args)
    if args.what == "racks":
        box.cut_racks(args.kind)
    elif args.what == "rack-manager":
        box.cut_rack_from_manager(args.target, args.kind)
    else:
        box.cut_host(args.target, args.kind)
    print(f"cut ({args.kind}): {args.what} {args.target or ''}".rstrip())
    return 0


def cmd_restore(args: argparse.Namespace) -> int:
    print(f"restored {_box(args).restore()} route(s)")
    return 0


def cmd_shape(args: argparse.Namespace) -> int:
    _box(args).shape(args.mbit)
    print(f"inter-rack link shaped to {args.mbit:g} Mbit/s")
    return 0


def add_box_commands(subparsers: argparse._SubParsersAction) -> argparse.ArgumentParser:
    """Add ``box ...`` to a CLI's sub-commands; returns the ``box`` parser."""
    box = subparsers.add_parser(
        "box", help="a facility in a box: hosts, racks and a shaped link in network namespaces",
        description="Bring up, use and remove a facility built from network namespaces "
        "(root with CAP_NET_ADMIN).")
    box.add_argument("--name", default="box", help="box name, prefix of its namespaces")
    box.add_argument("--dir", type=Path, default=None,
                     help="the box's folder (default build/box/NAME)")
    sub = box.add_subparsers(dest="box_command", required=True, metavar="SUBCOMMAND")
    up = sub.add_parser("up", help="make the box (and its services)")
    up.add_argument("--racks", type=int, default=2)
    up.add_argument("--hosts-per-rack", type=int, default=2)
    up.add_argument("--link-mbit", type=float, default=200.0,
                    help="rate of the inter-rack link (tc tbf), Mbit/s")
    up.add_argument("--xcache", action="store_true",
                    help="start the origin on the manager host and a shard per rack")
    up.add_argument("--data", type=Path, default=None,
                    help="the folder the origin serves (implies --xcache)")
    up.add_argument("--condor", action="store_true",
                    help="start HTCondor: central manager on mgr, a startd per rack host")
    up.set_defaults(func=cmd_up)
    sub.add_parser("down", help="stop everything on the box, remove it").set_defaults(
        func=cmd_down)
    sub.add_parser("status", help="hosts, link, counters, services (JSON)").set_defaults(
        func=cmd_status)
    ex = sub.add_parser("exec", help="run a command on a host: exec HOST -- CMD ...")
    ex.add_argument("host")
    ex.add_argument("argv", nargs=argparse.REMAINDER)
    ex.set_defaults(func=cmd_exec)
    cut = sub.add_parser("cut", help="cut paths: racks | rack-manager RACK | host HOST")
    cut.add_argument("what", choices=("racks", "rack-manager", "host"))
    cut.add_argument("target", nargs="?", default=None)
    cut.add_argument("--kind", choices=("blackhole", "prohibit", "unreachable"),
                     default="blackhole", help="blackhole drops (timeouts), prohibit refuses")
    cut.set_defaults(func=cmd_cut)
    sub.add_parser("restore", help="undo every cut").set_defaults(func=cmd_restore)
    shape = sub.add_parser("shape", help="reshape the inter-rack link live")
    shape.add_argument("mbit", type=float)
    shape.set_defaults(func=cmd_shape)
    return box
