"""How data from messages is made safe for an operator's terminal (consumers/cli_support)."""

from __future__ import annotations

from io import StringIO

from rich.console import Console

from consumers.cli_support import clean, text


def test_control_characters_are_shown_as_escapes_and_tab_and_newline_are_kept() -> None:
    raw = "a\x1b[31mb\rc\x00d\x7fe\x9bf\u202eg\th\ni"
    assert clean(raw) == "a\\x1b[31mb\\x0dc\\x00d\\x7fe\\x9bf\\u202eg\th\ni"
    assert clean(None) == ""


def test_text_is_printed_literally_and_never_parsed_as_markup() -> None:
    out = StringIO()
    console = Console(file=out, width=200, force_terminal=False, color_system=None)
    console.print(text("[/] [bold]x[/bold] \x1b[31m"))
    assert out.getvalue() == "[/] [bold]x[/bold] \\x1b[31m\n"
