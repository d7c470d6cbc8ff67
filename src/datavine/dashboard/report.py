"""The saved view: one self-contained HTML file of a run, made from its events file.

:func:`write_report` folds an events file (:mod:`datavine.dashboard.events`) into a board
(:mod:`datavine.dashboard.model`) and renders the live view's figures
(:mod:`datavine.dashboard.views`) with Bokeh's JavaScript inlined: the file opens in a
browser with no server and no network (a facility's browser may not reach the internet).
``datavine run --json X`` writes it as ``X.html``, ``datavine scale-test`` next to its JSON
record; ``python -m datavine.dashboard.report EVENTS OUT.html`` makes one by hand.
"""

from __future__ import annotations

import argparse
import os
import sys
from collections.abc import Iterable, Sequence
from pathlib import Path

from datavine.dashboard.events import read_events
from datavine.dashboard.model import Board
from datavine.dashboard.records import Record


def board_of(records: Iterable[Record], run: int | None = None) -> Board:
    """The board after ``records``; ``run``: stop after that run's last record (default:
    all, so the board shows the last run)."""
    board = Board()
    for record in records:
        if run is not None and record["k"] == "run" and int(record.get("run", 0)) > run:
            break
        board.apply(record)
    return board


def report_html(board: Board, title: str = "datavine run") -> str:
    """The page for ``board`` as one HTML document with Bokeh's JavaScript inlined."""
    from bokeh.embed import file_html
    from bokeh.resources import INLINE

    from datavine.dashboard.views import build

    page = build(board, title=title)
    return file_html(page.roots, INLINE, title)


def write_report(events: str | os.PathLike[str], path: str | os.PathLike[str], *,
                 title: str = "datavine run", run: int | None = None) -> Path:
    """Write the saved view of the events file ``events`` (its last run, or ``run``) to
    ``path``; returns ``path``."""
    board = board_of(read_events(events), run)
    out = Path(path)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(report_html(board, title), encoding="utf-8")
    return out


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m datavine.dashboard.report",
                                     description="Save a run's view as one HTML file.")
    parser.add_argument("events", type=Path, help="the run's events.jsonl")
    parser.add_argument("out", type=Path, help="the HTML file to write")
    parser.add_argument("--run", type=int, help="which run of the file (default: the last)")
    parser.add_argument("--title", default="datavine run")
    args = parser.parse_args(argv)
    print(write_report(args.events, args.out, title=args.title, run=args.run))
    return 0


if __name__ == "__main__":
    sys.exit(main())
