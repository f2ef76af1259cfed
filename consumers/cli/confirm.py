"""The confirmation every destructive command asks for (bulk discards, purges, cancels)."""

from __future__ import annotations

import sys

import typer

from consumers.cli import exit_codes
from infra.terminal import printable


def confirm(question: str, *, yes: bool) -> None:
    """Go on only if the operator said yes: `--yes`, or `y` at the prompt on a terminal.
    Without a terminal to ask on (a script, a pipe), `--yes` is required. A refusal ends the
    command with exit status 7, having changed nothing."""
    if yes:
        return
    if not sys.stdin.isatty():
        exit_codes.fail(
            exit_codes.NOT_CONFIRMED,
            f"{question} Not confirmed: stdin is not a terminal; pass --yes to go on "
            "(or --dry-run to see what it would do)",
        )
    if not typer.confirm(printable(question), default=False):
        typer.echo("not confirmed: nothing changed", err=True)
        raise typer.Exit(exit_codes.NOT_CONFIRMED)
