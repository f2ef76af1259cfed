"""`pkgq --help` and every command's help read as sentences at any terminal width: no help text
carries a hard line break inside a paragraph (consumers/cli/help_text.py joins a docstring's or
option help's wrapped lines when the app is built), so the terminal wraps it, never the source.

The check on the rendered help, precisely: two consecutive lines of one paragraph (the same
table cell of a panel, at the same column, or two lines of the free text above the panels) are a
hard break when the second line's first word would have fitted on the first line: rich wraps
greedily, so only a newline in the text can end a line that early. A blank line (a paragraph
break) and a line opening a list item (`- `, `* `, `1. `) are not continuations."""

from __future__ import annotations

import contextlib
import io
import re
from itertools import pairwise
from typing import Any

import pytest
import typer.main

from consumers.cli.app import app
from consumers.cli.help_text import reflow
from tests.support.cli_tree import walk

LIST_ITEM = re.compile(r"^(?:[-*•] |\d+[.)] )")
WIDTHS = (60, 200)


def test_reflow_joins_wrapped_lines_keeps_paragraphs_list_items_and_no_rewrap_blocks() -> None:
    text = """First line
    goes on here.

    Second paragraph,
    wrapped.

    - an item
      that wraps
    - another

    \b
    kept
    as is
    """
    assert reflow(text) == (
        "First line goes on here.\n\nSecond paragraph, wrapped.\n\n"
        "- an item that wraps\n- another\n\n\b\nkept\nas is"
    )
    assert reflow("Before.\f\nafter\nthe cut") == "Before.\f\nafter\nthe cut"


def _indent(line: str) -> int:
    return len(line) - len(line.lstrip())


def hard_breaks(output: str, width: int) -> list[str]:
    """The places in rendered help where a line ends although the next word would have fitted."""
    found = []
    lines = output.splitlines()
    help_column = {}  # per panel line: where its panel's last column (the help) starts
    panel: list[int] = []
    for i, line in enumerate([*lines, "╰"]):
        if line.startswith("│") and line[1:].strip("│ "):
            panel.append(i)
        elif panel:
            # continuation lines start at the help column, the deepest indent of the panel;
            # rows start further left (a required row's `*` leftmost, option names after it)
            indents = [_indent(lines[j][1:]) for j in panel]
            deepest = max(indents) if max(indents) > min(indents) + 3 else -1
            help_column.update(dict.fromkeys(panel, deepest))
            panel = []
    for i, (above, below) in enumerate(pairwise(lines)):
        if i in help_column and i + 1 in help_column:
            a, b = above[1:].rstrip("│"), below[1:].rstrip("│")
            column = _indent(b)
            # b continues the help cell, and a holds that cell's text, as its first line or as
            # a continuation (an option name at that depth starts a row)
            if column != help_column[i + 1] or b.lstrip().startswith("-") or a[column - 1] != " ":
                continue
            cell, text, room = a[column:].rstrip(), b.strip(), len(a) - column - 1
        elif not above.startswith(("│", "╭", "╰")) and not below.startswith(("│", "╭", "╰")):
            cell, text, room = above.strip(), below.strip(), width - 2
            if above.lstrip().startswith("Usage:"):
                continue
        else:
            continue
        # typer's own notes ([default: 90.0], [required]) start a line of their own
        if not cell or not text or LIST_ITEM.match(text) or text.startswith("["):
            continue
        if len(cell) + 1 + len(text.split()[0]) < room:
            found.append(f"{cell!r} / {text!r}")
    return found


def test_the_check_finds_a_hard_break_in_a_cell_and_in_free_text() -> None:
    rendered = (
        " Usage: pkgq stats [OPTIONS]\n\n"
        " Per route, how many messages are in each state: R ready, T taken\n"
        " (delivered, not yet acknowledged).\n\n"
        "╭─ Commands ─────────────────────────────────────────╮\n"
        "│ stats   Per route: R ready to deliver, T taken     │\n"
        "│         (delivered,                                │\n"
        "│         not yet acknowledged).                     │\n"
        "╰────────────────────────────────────────────────────╯\n"
    )
    in_the_cell = "'(delivered,' / 'not yet acknowledged).'"
    in_the_text = "'Per route, how many messages are in each state: R ready, T taken' / "
    assert hard_breaks(rendered, 80) == [
        in_the_text + "'(delivered, not yet acknowledged).'",
        in_the_cell,
    ]
    assert hard_breaks(rendered, 60) == [in_the_cell]  # "(delivered," would not fit there


def render_help(root: Any, path: tuple[str, ...], width: int) -> str:
    """`pkgq PATH --help` as a terminal `width` columns wide shows it (one built command tree
    for every call: typer's CliRunner would build it again each time)."""
    out = io.StringIO()
    with pytest.MonkeyPatch.context() as env, contextlib.redirect_stdout(out):
        env.setenv("COLUMNS", str(width))
        root.main(args=[*path, "--help"], prog_name="pkgq", standalone_mode=False)
    return out.getvalue()


def test_no_help_text_breaks_a_sentence_with_a_hard_newline() -> None:
    root = typer.main.get_command(app)
    broken: dict[str, list[str]] = {}
    for width in WIDTHS:
        for path, _ in walk(root):
            output = render_help(root, path, width)
            assert "Usage: pkgq" in output, (path, output)
            if found := hard_breaks(output, width):
                broken[" ".join(("pkgq", *path, f"(COLUMNS={width})"))] = found
    assert not broken, broken
