"""What every `pkgq` command group shares: settings with logging set up, route arguments, and
who an operator is."""

from __future__ import annotations

import getpass
import socket

import typer

from events.routes import Route, UnknownRouteError, route_named
from infra.logging import configure_logging
from infra.settings import Settings


def load_settings() -> Settings:
    settings = Settings.load()
    configure_logging(settings.log_format, settings.log_level)
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
