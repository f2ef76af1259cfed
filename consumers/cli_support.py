"""What every `pkgq` command group shares: settings with logging set up, route arguments, who
an operator is, and how data from messages is shown on a terminal."""

from __future__ import annotations

import getpass
import re
import socket
import sys

import typer
from rich.text import Text

from events.routes import Route, UnknownRouteError, route_named
from infra.logging import configure_logging
from infra.settings import Settings


def load_settings(*, logs_to_stdout: bool = False) -> Settings:
    """Settings, with logging set up: to stdout for long-running processes, else stderr."""
    settings = Settings.load()
    configure_logging(
        settings.log_format, settings.log_level, sys.stdout if logs_to_stdout else sys.stderr
    )
    return settings


def route_argument(name: str) -> Route:
    """A route named on the command line (full or short name), or a usage error."""
    try:
        return route_named(name)
    except UnknownRouteError as exc:
        raise typer.BadParameter(str(exc.args[0])) from None


def operator() -> str:
    """Who runs the command, recorded with replays, discards and pauses: `user@host`."""
    try:
        user = getpass.getuser()
    except (KeyError, OSError):
        user = "unknown"
    return f"{user}@{socket.gethostname()}"


# C0 controls but tab and newline, DEL, C1 controls, and the Unicode bidi overrides and isolates:
# each can rewrite or hide what an operator sees (ESC starts ANSI sequences, CR overwrites a
# line, U+202E reverses text), so a message must never get them to the terminal.
_CONTROLS = re.compile(r"[\x00-\x08\x0b-\x1f\x7f-\x9f\u200e\u200f\u202a-\u202e\u2066-\u2069]")


def _visible(match: re.Match[str]) -> str:
    code = ord(match.group())
    return f"\\x{code:02x}" if code < 0x100 else f"\\u{code:04x}"


def clean(value: object) -> str:
    """Data from a message or another process (type, route, error text, traceback) as printable
    text: every control character but tab and newline is shown as its escape (`\\x1b`), so it
    can neither drive the terminal nor vanish from what the operator reads."""
    return _CONTROLS.sub(_visible, "" if value is None else str(value))


def text(value: object, style: str = "") -> Text:
    """`clean(value)` as a rich Text: printed literally, never parsed as rich markup (a message
    type of `[/]` would otherwise crash the command, and `[bold]` would restyle the output)."""
    return Text(clean(value), style=style)
