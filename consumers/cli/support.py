"""What every `pkgq` command group shares: settings with logging set up, route arguments, who
an operator is, and how data from messages is shown on a terminal."""

from __future__ import annotations

import getpass
import socket
import sys

import typer
from rich.text import Text

from events.routes import Route, UnknownRouteError, route_named
from infra.logging import configure_logging
from infra.settings import Settings
from infra.terminal import printable


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


def clean(value: object) -> str:
    """Data from a message or another process (type, route, error text, traceback) as printable
    text: control characters shown as their escapes (infra/terminal.py)."""
    return printable(value)


def text(value: object, style: str = "") -> Text:
    """`clean(value)` as a rich Text: printed literally, never parsed as rich markup (a message
    type of `[/]` would otherwise crash the command, and `[bold]` would restyle the output)."""
    return Text(clean(value), style=style)
