"""The command-line page: every `pkgq` command and option, read from the typer app's click tree."""

from __future__ import annotations

import inspect
from collections.abc import Iterator
from typing import Any

import typer.main

from devtools.reference.common import HEADER, code, one_line, table
from devtools.reference.settings_page import type_name

# typer >= 0.25 carries a click of its own (typer._click): its classes are not click's, so the
# tree is read by duck typing: a group has `list_commands` (pkgq's root builds its commands as
# they are named: consumers/cli/lazy.py), an option has `opts`.


def _subcommands(command: Any) -> dict[str, Any]:
    if not hasattr(command, "list_commands"):
        return {}
    ctx = typer.Context(command)
    return {name: command.get_command(ctx, name) for name in command.list_commands(ctx)}


def _walk(command: Any, path: str) -> Iterator[tuple[str, Any]]:
    yield path, command
    subcommands = _subcommands(command)
    for name in sorted(subcommands):
        yield from _walk(subcommands[name], f"{path} {name}")


def _param_row(param: Any) -> tuple[str, ...]:
    if hasattr(param, "opts") and getattr(param, "param_type_name", "") == "option":
        names = ", ".join(f"`{o}`" for o in [*param.opts, *param.secondary_opts])
        helptext = one_line(param.help)
        default = param.default
        shown = "" if default is None or default is False or param.is_flag else str(default)
    else:
        names = f"`{(param.metavar or param.name or '').upper()}`"
        helptext = "(argument" + (", required)" if param.required else ")")
        default = param.default
        shown = "" if default is None else str(default)
    descriptor = getattr(param, "type_descriptor", None)
    kind = type_name(getattr(descriptor, "annotation", None)) if descriptor else ""
    if getattr(param, "is_flag", False):
        kind = "flag"
    return names, kind, code(shown) if shown else "", helptext


def cli_page() -> str:
    from consumers.cli.app import app

    root = typer.main.get_command(app)
    out = [
        "# Command line\n\n",
        HEADER,
        "Every `pkgq` command with its options, as `pkgq COMMAND --help` prints them. The "
        "exit statuses are in [the command line's contract](../explanation/cli.md).\n\n",
    ]
    summary: list[tuple[str, ...]] = []
    sections: list[str] = []
    for path, command in _walk(root, "pkgq"):
        if path == "pkgq":
            continue
        helptext = inspect.cleandoc(command.help or "").partition("\f")[0]
        first = one_line(helptext.split("\n\n")[0])
        anchor = path.replace(" ", "-")
        summary.append((f"[`{path}`](#{anchor})", first))
        rest = [one_line(p) for p in helptext.split("\n\n")[1:]]
        params = [p for p in command.params if p.name != "help"]
        block = [f"## `{path}` {{#{anchor}}}\n\n", first + "\n\n"]
        block += [p + "\n\n" for p in rest if p]
        if subcommands := _subcommands(command):
            block.append(
                "Commands: "
                + ", ".join(f"[`{path} {n}`](#{anchor}-{n})" for n in sorted(subcommands))
                + ".\n\n"
            )
        if params:
            rows = [_param_row(p) for p in params]
            block.append(table(("option", "type", "default", "meaning"), rows) + "\n")
        sections.append("".join(block))
    out.append(table(("command", "what it does"), summary) + "\n")
    out += sections
    return "".join(out).rstrip() + "\n"
