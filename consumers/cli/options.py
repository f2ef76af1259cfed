"""What the commands' arguments share: route names (full or short), durations and sizes read by
the one parser of each, the `--json`, `--yes` and `--dry-run` options, and who the operator is."""

from __future__ import annotations

import getpass
import socket
from collections.abc import Callable, Mapping
from datetime import timedelta
from typing import Annotated, TypeVar

import typer

from consumers.cli.durations import parse_duration
from consumers.cli.durations import seconds as duration_seconds
from events.routes import ROUTES, Route

T = TypeVar("T")

JsonOpt = Annotated[bool, typer.Option("--json", help="Print JSON instead of text.")]
YesOpt = Annotated[bool, typer.Option("--yes", "-y", help="Do it without asking.")]
DryRunOpt = Annotated[
    bool, typer.Option("--dry-run", help="Only say what would be done; change nothing.")
]
ByOpt = Annotated[str | None, typer.Option("--by", help="Who does it (default: user@host).")]


def route_argument(name: str, among: Mapping[str, Route] = ROUTES) -> Route:
    """A route named on the command line, full (`telecom.usage_record`) or short
    (`usage_record`), among the routes pkgq consumes (or `among`); an unknown one is a usage
    error that lists the known routes."""
    full = name if name.startswith("telecom.") else f"telecom.{name}"
    if full not in among:
        known = ", ".join(route.short_name for route in among.values())
        raise typer.BadParameter(f"unknown route {name!r}; known routes: {known}")
    return among[full]


def as_parameter(parse: Callable[[str], T], text: str) -> T:
    """`parse(text)`, with a ValueError turned into a usage error naming the value."""
    try:
        return parse(text)
    except ValueError as exc:
        raise typer.BadParameter(str(exc)) from None


def duration(text: str) -> timedelta:
    """A duration option (the one parser: `90`, `90s`, `15m`, `1.5h`, `7d`, `1w`)."""
    return as_parameter(parse_duration, text)


def seconds(text: str | None) -> float | None:
    """An optional duration option, in seconds."""
    return None if text is None else as_parameter(duration_seconds, text)


def operator() -> str:
    """Who runs the command, recorded with replays, discards, cancels and pauses: `user@host`."""
    try:
        user = getpass.getuser()
    except (KeyError, OSError):
        user = "unknown"
    return f"{user}@{socket.gethostname()}"
