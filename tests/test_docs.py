"""The documentation points at things that exist.

- Every relative link in README.md, docs/*.md and deploy/*.md names an existing file
  (links in code blocks and inline code are not links; URLs with a scheme and pure
  anchors are not checked).
- Every `webagent COMMAND [ACTION]` in a fenced code block of docs/sites.md is a command
  (and, for a command group, an action) of the CLI's own parser
  (`runtime.cli.build_parser`).

The checkers are also run on broken input, so a test that passes has checked something.
"""

from __future__ import annotations

import argparse
import re
from pathlib import Path

import pytest

from runtime.cli import build_parser

ROOT = Path(__file__).resolve().parent.parent
DOCS = sorted([ROOT / "README.md", *(ROOT / "docs").glob("*.md"), *(ROOT / "deploy").glob("*.md")])
SITES_DOC = ROOT / "docs" / "sites.md"

_FENCE = re.compile(r"^\s*(```|~~~)")
_INLINE_CODE = re.compile(r"`+[^`]*`+")
_LINK = re.compile(r"\[[^\]]*\]\(\s*<?([^)\s>]+)>?(?:\s+\"[^\"]*\")?\s*\)")
_REFERENCE = re.compile(r"^\s*\[[^\]]+\]:\s*<?(\S+?)>?(?:\s|$)", re.MULTILINE)
_SCHEME = re.compile(r"^[A-Za-z][A-Za-z0-9+.-]*:")
_COMMAND = re.compile(r"(?<![\w.-])webagent[ \t]+([a-z][\w-]*)(?:[ \t]+([a-z][\w-]*))?")


def split_fences(text: str) -> tuple[str, list[str]]:
    """(the text outside fenced code blocks, the fenced blocks' contents)."""
    prose: list[str] = []
    blocks: list[str] = []
    current: list[str] | None = None
    for line in text.splitlines():
        if _FENCE.match(line):
            if current is None:
                current = []
            else:
                blocks.append("\n".join(current))
                current = None
        elif current is None:
            prose.append(line)
        else:
            current.append(line)
    if current is not None:  # an unclosed fence runs to the end, as Markdown renders it
        blocks.append("\n".join(current))
    return "\n".join(prose), blocks


def broken_links(path: Path) -> list[str]:
    """The relative link targets in the Markdown file `path` that name no existing file."""
    prose, _ = split_fences(path.read_text(encoding="utf-8"))
    prose = _INLINE_CODE.sub("", prose)
    targets = [*_LINK.findall(prose), *_REFERENCE.findall(prose)]
    broken = []
    for target in targets:
        if target.startswith("#") or _SCHEME.match(target):
            continue
        relative = target.split("#", 1)[0].split("?", 1)[0]
        if not (path.parent / relative).exists():
            broken.append(target)
    return broken


def _subcommands(parser: argparse.ArgumentParser) -> dict[str, argparse.ArgumentParser]:
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            return dict(action.choices)
    return {}


def unknown_commands(text: str, parser: argparse.ArgumentParser) -> tuple[list[str], int]:
    """(the `webagent ...` mentions in fenced blocks of `text` the parser does not know,
    how many mentions were checked)."""
    _, blocks = split_fences(text)
    commands = _subcommands(parser)
    unknown: list[str] = []
    checked = 0
    for block in blocks:
        for name, action in _COMMAND.findall(block):
            checked += 1
            group = commands.get(name)
            if group is None:
                unknown.append(f"webagent {name}")
                continue
            actions = _subcommands(group)
            if actions and action and action not in actions:
                unknown.append(f"webagent {name} {action}")
    return unknown, checked


# --------------------------------------------------------------------------- the docs


@pytest.mark.parametrize("doc", DOCS, ids=[str(d.relative_to(ROOT)) for d in DOCS])
def test_relative_links_name_existing_files(doc: Path) -> None:
    assert broken_links(doc) == [], f"{doc.relative_to(ROOT)} links to missing files"


def test_the_doc_globs_find_the_new_pages() -> None:
    assert ROOT / "docs" / "sites.md" in DOCS
    assert ROOT / "deploy" / "MULTI_GPU.md" in DOCS


def test_sites_doc_commands_exist_in_the_cli() -> None:
    unknown, checked = unknown_commands(SITES_DOC.read_text(encoding="utf-8"), build_parser())
    assert checked >= 5, "docs/sites.md shows fewer webagent commands than expected"
    assert unknown == []


# --------------------------------------------------------------------------- the checkers


def test_link_checker_reports_missing_files(tmp_path: Path) -> None:
    (tmp_path / "there.md").write_text("# there\n")
    page = tmp_path / "page.md"
    page.write_text(
        "See [there](there.md#part), [gone](gone.md), [web](https://example.com/x.md),\n"
        "[anchor](#top), `[code](inline.md)` and [ref][r].\n\n"
        "[r]: missing/ref.md\n\n"
        "```md\n[in a block](block.md)\n```\n"
    )
    assert broken_links(page) == ["gone.md", "missing/ref.md"]


def test_command_checker_reports_unknown_commands() -> None:
    text = (
        "webagent prose-is-not-checked\n\n"
        "```sh\n"
        "webagent sites serve --port 18400\n"
        ".venv/bin/webagent tasks stats\n"
        "webagent nosuch --flag\n"
        "webagent tasks nosuch\n"
        "webagent train --config FILE\n"
        "```\n"
    )
    unknown, checked = unknown_commands(text, build_parser())
    assert checked == 5
    assert unknown == ["webagent nosuch", "webagent tasks nosuch"]
