"""How data from messages is made safe for an operator's terminal: command output and logs."""

from __future__ import annotations

import logging
from io import StringIO

import structlog
from rich.console import Console

from consumers.cli.output import clean, text
from infra.logging import configure_logging


def test_control_characters_are_shown_as_escapes_and_tab_and_newline_are_kept() -> None:
    raw = "a\x1b[31mb\rc\x00d\x7fe\x9bf\u202eg\th\ni"
    assert clean(raw) == "a\\x1b[31mb\\x0dc\\x00d\\x7fe\\x9bf\\u202eg\th\ni"
    assert clean(None) == ""


def test_text_is_printed_literally_and_never_parsed_as_markup() -> None:
    out = StringIO()
    console = Console(file=out, width=200, force_terminal=False, color_system=None)
    console.print(text("[/] [bold]x[/bold] \x1b[31m"))
    assert out.getvalue() == "[/] [bold]x[/bold] \\x1b[31m\n"


def test_console_logs_show_control_characters_from_message_data_as_escapes() -> None:
    out = StringIO()
    configure_logging("console", "info", out)
    try:
        structlog.get_logger("t").warning("bury", error="bad \x1b[2J type \u202e[/]")
        logging.getLogger("aiormq").warning("lost \x1b]0;title\x07 channel")
    finally:
        configure_logging("json", "info")
    written = out.getvalue()
    assert "\x1b" not in written
    assert "\\x1b[2J" in written
    assert "\\u202e[/]" in written
    assert "\\x1b]0;title\\x07" in written
