"""``datavine story RUN.json [TASK]``: what happened to a finished run's bundles, or to one task.

A run keeps every bundle's steps in its summary (``RunSummary.lifecycle``,
:mod:`datavine.scheduler.lifecycle`), and the summary goes into the JSON record the run
writes: ``datavine run --json FILE``, ``datavine scale-test`` (``--json``, by default
``runs/scaletest/scaletest.json``), or a script's ``json.dump(cluster.last_summary.to_dict())``.
This command reads it back and prints:

- with a TASK (its dask key as Python writes it, ``"('chunk', 3)"``, or its ``str``) or
  ``bundle N``: its story, step by step: sent where, running on which worker, retried why,
  failed over from which shard, withdrawn, done where, with the time since the run started;
- without: the bundles that did not go straight through -- failed first, then retried and
  failed over, withdrawn, abandoned -- each with its story, and a count of the rest
  (``--all`` prints those too).

In a program, ``cluster.story(key)`` tells the last run's story of a task the same way.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

from datavine.errors import DatavineError
from datavine.scheduler.lifecycle import Life, Lifecycle, Phase, tell


class StoryError(DatavineError):
    """The record cannot be read, holds no stories, or has no such task or bundle."""


def add_command(subparsers: argparse._SubParsersAction) -> None:
    story = subparsers.add_parser(
        "story", help="what happened to a finished run's bundles, or to one task",
        description="Print the story of a task or bundle of a finished run, or of each "
                    "bundle that did not go straight through (failed ones first), from the "
                    "run's JSON record.")
    story.add_argument("record", type=Path, metavar="RUN_JSON",
                       help="the run's JSON record (datavine run --json, datavine scale-test "
                            "--json, or a RunSummary.to_dict())")
    story.add_argument("what", nargs="?", metavar="TASK",
                       help="a task's key (\"('chunk', 3)\", or its str) or 'bundle N'")
    story.add_argument("--all", action="store_true",
                       help="every bundle, also those that went straight through")
    story.set_defaults(func=cmd_story)


def cmd_story(args: argparse.Namespace) -> int:
    print("\n".join(story_lines(read_lifecycle(args.record), args.what, every=args.all)))
    return 0


def read_lifecycle(path: Path) -> Lifecycle:
    """The stories in a run's JSON record (the summary's ``lifecycle``, at the top level or
    under ``summary``)."""
    try:
        data = json.loads(path.read_text())
    except OSError as exc:
        raise StoryError(f"cannot read the run record {path}: {exc.strerror or exc}") from exc
    except (json.JSONDecodeError, UnicodeDecodeError) as exc:
        raise StoryError(f"{path} is not a JSON run record: {exc}") from exc
    found = _lifecycle_in(data)
    if found is None:
        raise StoryError(f"{path} holds no run stories (no 'lifecycle' in it or in its "
                         "'summary'): write it with datavine run --json, or save "
                         "cluster.last_summary.to_dict() after a run")
    try:
        return Lifecycle.from_dict(found)
    except (KeyError, TypeError, ValueError) as exc:
        raise StoryError(f"{path}: its 'lifecycle' is not one datavine wrote ({exc!r})") from exc


def _lifecycle_in(data: object) -> dict[str, object] | None:
    for holder in (data, data.get("summary") if isinstance(data, dict) else None):
        if isinstance(holder, dict) and isinstance(holder.get("lifecycle"), dict):
            return holder["lifecycle"]
    return None


def story_lines(life: Lifecycle, what: str | None = None, *, every: bool = False) -> list[str]:
    """The lines ``datavine story`` prints (see the module docstring)."""
    if what is not None:
        try:
            steps = life.story(what)
        except KeyError as exc:
            raise StoryError(str(exc.args[0])) from None
        return [f"story of {what}:", tell(steps)]
    troubled = life.troubled()
    shown = {one.bundle for one in troubled}
    rest = [one for one in life.bundles.values() if one.bundle not in shown]
    phases = sorted({str(one.phase) for one in life.bundles.values()})
    counts = ", ".join(f"{sum(str(o.phase) == p for o in life.bundles.values())} {p}"
                       for p in phases)
    lines = [f"{len(life.bundles)} bundles ({counts or 'none'}); "
             f"{len(troubled)} did not go straight through"]
    for one in troubled + (sorted(rest, key=lambda o: o.bundle) if every else []):
        lines += [_title(one), tell(one.steps)]
    if rest and not every:
        lines.append(f"{len(rest)} bundles went straight through (--all shows them)")
    notes = [s for steps in life.notes.values() for s in steps]
    if notes:
        lines.append("values lost with their workers:")
        lines.append(tell(sorted({s.seq: s for s in notes}.values(), key=lambda s: s.seq)))
    return lines


def _title(one: Life) -> str:
    shown = ", ".join(repr(k) for k in one.keys[:3])
    more = f" ... ({len(one.keys)} tasks)" if len(one.keys) > 3 else ""
    why = f" [{one.reason}]" if one.reason is not None and one.phase is not Phase.DONE else ""
    return f"bundle {one.bundle} ({shown}{more}): {one.phase}{why}"
