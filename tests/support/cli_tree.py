"""The `pkgq` command tree as click reads it: a group's commands through `list_commands` and
`get_command`, never its `commands` dict, which holds only what the root has built so far
(consumers/cli/lazy.py builds each command when it is named)."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import typer


def subcommands(command: Any) -> dict[str, Any]:
    """`command`'s commands by name, in the order `--help` lists them ({} for a command)."""
    if not hasattr(command, "list_commands"):
        return {}
    ctx = typer.Context(command)
    return {name: command.get_command(ctx, name) for name in command.list_commands(ctx)}


def walk(command: Any, path: tuple[str, ...] = ()) -> Iterator[tuple[tuple[str, ...], Any]]:
    """Every command below `command` and itself, with its path (the root's is ()), depth first
    in `--help` order."""
    yield path, command
    for name, sub in subcommands(command).items():
        yield from walk(sub, (*path, name))
