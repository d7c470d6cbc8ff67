"""The documents point at things that exist: README.md, docs/*.md and benchmarks/*.md.

- Every relative link (``[text](path)``, ``![image](path)``) names a file or folder of the
  repository, and a ``#anchor`` names a heading of the target (GitHub's slugs).
- Every ``datavine <command> [<subcommand>] [--option ...]`` shown in code (fenced blocks and
  inline code) is one the CLI's parser (:func:`datavine.apps.cli.build_parser`) has.
- Every repository path shown (``scripts/...``, ``benchmarks/...``, ``tests/...``,
  ``examples/...``, ``workers/...``, ``docs/...``) exists; ``*`` globs match
  at least one file.

Pure file reads and the parser: no TaskVine, no network.
"""

from __future__ import annotations

import argparse
import re
import unicodedata
from collections.abc import Iterator
from dataclasses import dataclass
from functools import cache
from pathlib import Path

import pytest

from datavine.apps.cli import build_parser

ROOT = Path(__file__).resolve().parent.parent
DOCUMENTS = sorted([ROOT / "README.md", *(ROOT / "docs").glob("*.md"),
                    *(ROOT / "benchmarks").glob("*.md")])
FENCE = re.compile(r"^\s*(```|~~~)")
INLINE_CODE = re.compile(r"(`+)(.+?)\1")
LINK = re.compile(r"!?\[(?:[^\[\]]|\[[^\]]*\])*\]\(\s*<?([^)\s>]+)>?(?:\s+\"[^\"]*\")?\s*\)")
REPO_PATH = re.compile(
    r"(?<![\w./~$-])((?:scripts|benchmarks|tests|examples|workers|docs)/[\w./*-]*)")
# ``datavine`` where a shell reads a command: a line's or a code span's start (after ``$ ``,
# variable settings, ``nice``/``timeout N``, a path such as ``.venv/bin/``), or after ``;``,
# ``&&``, ``|``, ``(`` or `` -- `` (``datavine box exec HOST -- datavine run``); not
# ``--peers datavine threads`` or ``the datavine command``.
COMMAND = re.compile(
    r"(?:^|[;&|(]|\s--\s)[ \t]*(?:\$[ \t]+)?(?:[A-Za-z_][A-Za-z0-9_]*=\S*[ \t]+)*"
    r"(?:(?:nice|sudo|time|timeout[ \t]+\S+)[ \t]+)*(?:[\w.$/~-]*/)?datavine[ \t]+([a-z][a-z-]*)\b",
    re.M)
COMMAND_ENDS = re.compile(r"\n|\s(?:;|&&|\|\||\||#|--(?=\s|$))|;|`|\)")
OPTION = re.compile(r"(?<![\w-])(--[a-z][a-z0-9-]*)")


@dataclass(frozen=True)
class Text:
    """A piece of a document: ``code`` (a fenced block or an inline code span) or prose,
    with the line it starts on."""

    doc: Path
    line: int
    text: str
    code: bool

    def where(self) -> str:
        return f"{self.doc.relative_to(ROOT)}:{self.line}"


def pieces(doc: Path) -> Iterator[Text]:
    """The document's fenced blocks (one piece each, continuation lines joined), its inline
    code spans and its prose lines (inline code blanked out)."""
    block: list[str] = []
    start = 0
    for n, line in enumerate(doc.read_text(encoding="utf-8").splitlines(), 1):
        if FENCE.match(line):
            if block:
                yield Text(doc, start, "\n".join(block[1:]).replace("\\\n", " "), code=True)
                block = []
            else:
                block, start = [line], n
            continue
        if block:
            block.append(line)
            continue
        for m in INLINE_CODE.finditer(line):
            yield Text(doc, n, m.group(2), code=True)
        yield Text(doc, n, INLINE_CODE.sub(lambda m: " " * len(m.group(0)), line), code=False)


# --- headings and GitHub's anchors -----------------------------------------------------------

def slug(heading: str) -> str:
    """GitHub's anchor for a heading's text (github-slugger): markup dropped, lower case,
    every character but letters, digits, spaces, ``-`` and ``_`` removed, spaces to ``-``."""
    text = re.sub(r"!?\[([^\]]*)\]\([^)]*\)", r"\1", heading)  # a link: its text
    text = re.sub(r"<[^>]+>", "", text).replace("`", "").replace("*", "")
    text = text.strip().lower()
    kept = "".join(c for c in text if c in " -_" or unicodedata.category(c)[0] in "LN")
    return kept.replace(" ", "-")


@cache
def anchors(doc: Path) -> frozenset[str]:
    """The anchors of a Markdown file's headings (outside fenced code), repeated ones
    numbered as GitHub numbers them (``x``, ``x-1``, ``x-2``)."""
    seen: dict[str, int] = {}
    out: set[str] = set()
    fenced = False
    for line in doc.read_text(encoding="utf-8").splitlines():
        if FENCE.match(line):
            fenced = not fenced
            continue
        m = re.match(r"^ {0,3}(#{1,6})\s+(.*?)\s*#*\s*$", line)
        if fenced or not m:
            continue
        base = slug(m.group(2))
        n = seen.get(base, 0)
        seen[base] = n + 1
        out.add(base if n == 0 else f"{base}-{n}")
    return frozenset(out)


def test_slugs_follow_github() -> None:
    assert slug("Hosts and racks: describing a facility") == "hosts-and-racks-describing-a-facility"
    assert slug("`datavine doctor`") == "datavine-doctor"
    assert slug("Again after issues 21 and 23 (2026-11-26)") == (
        "again-after-issues-21-and-23-2026-11-26")
    assert slug("One dependency level: `--shape sum` (issue 21, point 5)") == (
        "one-dependency-level---shape-sum-issue-21-point-5")
    assert slug("Values at memory speed (issue 29, item 5: 2026-11-26 17:01 UTC, load 1.0)") == (
        "values-at-memory-speed-issue-29-item-5-2026-11-26-1701-utc-load-10")


# --- links ------------------------------------------------------------------------------------

def links() -> list[tuple[str, Path, str]]:
    """(where, document, target) of every relative link in the documents."""
    out = []
    for doc in DOCUMENTS:
        for piece in pieces(doc):
            if piece.code:
                continue
            for m in LINK.finditer(piece.text):
                target = m.group(1)
                if not re.match(r"^[a-zA-Z][a-zA-Z0-9+.-]*:", target):  # not http:, mailto:
                    out.append((piece.where(), doc, target))
    return out


def link_problem(doc: Path, target: str) -> str | None:
    """What is wrong with a relative link ``target`` of ``doc``, or None."""
    path, _, anchor = target.partition("#")
    file = (doc.parent / path).resolve() if path else doc
    if not file.is_relative_to(ROOT):
        return f"{target}: outside the repository"
    if not file.exists():
        return f"{target}: no such file or folder"
    if anchor and file.suffix == ".md" and anchor not in anchors(file):
        return f"{target}: {file.relative_to(ROOT)} has no heading with the anchor #{anchor}"
    return None


def test_every_document_is_read() -> None:
    names = {d.relative_to(ROOT).as_posix() for d in DOCUMENTS}
    assert {"README.md", "docs/operator.md", "benchmarks/README.md"} <= names, names
    assert len(links()) > 50  # the parser finds the links it should check


def test_relative_links_resolve() -> None:
    problems = [f"{where}: {problem}" for where, doc, target in links()
                if (problem := link_problem(doc, target))]
    assert not problems, "\n".join(problems)


def test_link_checks_catch_a_missing_file_and_anchor(tmp_path: Path) -> None:
    assert link_problem(ROOT / "README.md", "docs/operator.md#security") is None
    assert link_problem(ROOT / "README.md", "docs/nothing.md") is not None
    assert "no heading" in str(link_problem(ROOT / "README.md", "docs/operator.md#nothing"))
    assert link_problem(ROOT / "docs" / "operator.md", "../README.md") is None


# --- commands ---------------------------------------------------------------------------------

def subcommands(parser: argparse.ArgumentParser) -> dict[str, argparse.ArgumentParser]:
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            return dict(action.choices)
    return {}


def options(parser: argparse.ArgumentParser) -> set[str]:
    return {o for action in parser._actions for o in action.option_strings}


@cache
def cli() -> argparse.ArgumentParser:
    return build_parser()


def command_problem(text: str) -> str | None:
    """What is wrong with the ``datavine ...`` command at the start of ``text`` (the words
    after ``datavine``), or None: its command, subcommand and options must exist."""
    line = COMMAND_ENDS.split(" " + text, maxsplit=1)[0]
    words = line.split()
    parser, name = cli(), "datavine"
    while words and (subs := subcommands(parser)):
        word = words[0]
        if word not in subs:
            return f"`{name} {word}`: no such command (there are: {', '.join(sorted(subs))})"
        parser, name, words = subs[word], f"{name} {word}", words[1:]
    known = options(parser)
    unknown = sorted({o for o in OPTION.findall(" ".join(words)) if o not in known})
    if unknown:
        return f"`{name}` has no option {', '.join(unknown)}"
    return None


def commands() -> list[tuple[str, str]]:
    """(where, text after ``datavine ``) of every command shown in code."""
    out = []
    for doc in DOCUMENTS:
        for piece in pieces(doc):
            if not piece.code:
                continue
            for m in COMMAND.finditer(piece.text):
                out.append((piece.where(), piece.text[m.start(1):]))
    return out


def test_commands_shown_exist() -> None:
    found = commands()
    assert len(found) > 20, found  # the parser finds the commands it should check
    problems = [f"{where}: {problem}" for where, text in found
                if (problem := command_problem(text))]
    assert not problems, "\n".join(problems)


@pytest.mark.parametrize(("text", "problem"), [
    ("run --facility site.toml", None),
    ("pool start --batch condor --rack A \\ --wait", None),
    ("box exec mgr -- .venv/bin/datavine run --facility f", None),
    ("doctor --json", None),
    ("runs --json X", "no such command"),
    ("pool begin --batch local", "no such command"),
    ("run --workers 2 --no-such-option", "has no option --no-such-option"),
])
def test_command_check_catches_what_does_not_exist(text: str, problem: str | None) -> None:
    found = command_problem(text.replace("\\ ", ""))
    assert (found is None) if problem is None else (problem in str(found)), found


# --- paths ------------------------------------------------------------------------------------

def repo_paths() -> list[tuple[str, str]]:
    """(where, path) of every repository path a document shows, in code or prose."""
    out = []
    for doc in DOCUMENTS:
        for piece in pieces(doc):
            text = re.sub(r"\[[^\]]*\]\([^)]*\)", "", piece.text)  # links are checked above
            for m in REPO_PATH.finditer(text):
                out.append((piece.where(), m.group(1).rstrip(".,:;")))
    return out


def path_problem(path: str) -> str | None:
    if "*" in path:
        return None if any(ROOT.glob(path)) else f"{path}: matches nothing"
    return None if (ROOT / path).exists() else f"{path}: no such file or folder"


def test_paths_shown_exist() -> None:
    found = repo_paths()
    assert len(found) > 50, found
    problems = [f"{where}: {problem}" for where, path in found
                if (problem := path_problem(path))]
    assert not problems, "\n".join(problems)


# --- what datavine doctor names ---------------------------------------------------------------

def test_the_operator_page_lists_every_capability_doctor_checks() -> None:
    """docs/operator.md's table of what a stock TaskVine lacks names every capability of
    :data:`datavine.manager.capabilities.CAPABILITIES`, with the patch that brings it."""
    from datavine.manager.capabilities import CAPABILITIES, INTERNALS

    page = (ROOT / "docs" / "operator.md").read_text(encoding="utf-8")
    rows = {line.split("|")[1].strip(): line for line in page.splitlines()
            if line.startswith("| ") and line.count("|") >= 4}
    missing = [c.what for c in (*CAPABILITIES, INTERNALS)
               if c.what not in rows or c.patch not in rows[c.what]]
    assert not missing, f"docs/operator.md (datavine doctor) lacks rows for: {missing}"
