"""`pkgq COMMAND` imports COMMAND's module and no other command's: the root group finds each
top-level command or group by name in a table (name -> the module and attribute that define it,
in app.py) and builds it when click asks for it, as click's documented lazy subcommands do
(`get_command`, `list_commands`). Listing the names imports nothing; `pkgq --help`, which shows
each command's help, imports them all.

A command is built as typer builds it in an app with everything registered: its source adds it
to a scratch `typer.Typer` (`register(app)`, or `add_typer(the_group, name=NAME)`), and typer's
own conversion makes click's objects of it with the root app's settings.

Plugins (entry points whose `register(app)` adds commands) are loaded for a name the table does
not have, to list every name, and to build a group: a plugin adds to one of pkgq's groups by
adding a Typer under the group's name (`app.add_typer(extra, name="web")`), whose commands then
join the group's. A plugin cannot take the name of one of pkgq's own commands.
"""

from __future__ import annotations

import functools
import importlib
from collections.abc import Mapping
from dataclasses import dataclass
from importlib import metadata
from typing import ClassVar

import typer
from typer._click import Command, Context  # typer >= 0.25 carries a click of its own
from typer.core import TyperGroup
from typer.main import get_command_from_info, get_command_name, get_group_from_info
from typer.models import CommandInfo, TyperInfo

from consumers.cli.help_text import ReflowedGroup, reflow_tree

Registered = CommandInfo | TyperInfo
"""A command or a group as typer holds it before building it (`app.command`, `app.add_typer`)."""


@dataclass(frozen=True)
class Source:
    """Where a top-level command or group is defined: `attribute` of `module` is either a
    `register(app)` function that adds it to the app, or the `typer.Typer` that is the group."""

    module: str
    attribute: str = "register"


@functools.cache
def _scratch(source: Source, name: str) -> typer.Typer:
    """An app holding only what `source` adds, registered once per process (`name`: the group's,
    when the source is a `typer.Typer`)."""
    app = typer.Typer()
    defined = getattr(importlib.import_module(source.module), source.attribute)
    if isinstance(defined, typer.Typer):
        app.add_typer(defined, name=name)
    else:
        defined(app)
    return app


@functools.cache
def _plugins(group: str) -> typer.Typer:
    """An app holding what the installed plugins (the entry points `group`) add."""
    app = typer.Typer()
    for entry in metadata.entry_points(group=group):
        try:
            register = entry.load()
        except ModuleNotFoundError as missing:
            if missing.name != entry.module.partition(".")[0]:
                raise  # the plugin is there but broken: say so rather than hide its commands
            continue  # declared by the project's metadata, not shipped here
        register(app)
    return app


def _name(registered: Registered) -> str | None:
    if isinstance(registered, TyperInfo):
        return registered.name if isinstance(registered.name, str) else None
    if registered.name:
        return registered.name
    return get_command_name(registered.callback.__name__) if registered.callback else None


def _named(app: typer.Typer, name: str) -> list[Registered]:
    registered: list[Registered] = [*app.registered_commands, *app.registered_groups]
    return [r for r in registered if _name(r) == name]


class LazyGroup(ReflowedGroup):
    """A root group whose commands are imported and built when named. A subclass sets the
    tables and the plugins' entry-point group, and says which `typer.Typer` it is built from."""

    command_sources: ClassVar[Mapping[str, Source]] = {}
    """The top-level commands, in the order `--help` lists them."""
    group_sources: ClassVar[Mapping[str, Source]] = {}
    """The top-level groups, in that order: after the commands (and the plugins' commands),
    as typer lists an app's groups after its commands."""
    plugins: ClassVar[str] = ""
    """The entry-point group of the plugins' `register(app)` functions ("": none)."""

    def typer_app(self) -> typer.Typer:
        """The app this group is built from, whose settings each command is built with."""
        raise NotImplementedError

    def list_commands(self, ctx: Context) -> list[str]:
        plugins = _plugins(self.plugins) if self.plugins else typer.Typer()
        names = [
            *self.command_sources,
            *map(_name, plugins.registered_commands),
            *self.group_sources,
            *map(_name, plugins.registered_groups),
            *self.commands,  # any registered on the app itself
        ]
        return [name for name in dict.fromkeys(names) if name]

    def get_command(self, ctx: Context, cmd_name: str) -> Command | None:
        command = self._load(cmd_name)
        if command is None:  # typer's "Did you mean …?" picks from self.commands: fill it
            for name in self.list_commands(ctx):
                self._load(name)
        return command

    def _load(self, name: str) -> Command | None:
        if name not in self.commands:
            built = self._build(name)
            if built is None:
                return None
            self.commands[name] = built
        return self.commands[name]

    def _build(self, name: str) -> Command | None:
        source = self.command_sources.get(name) or self.group_sources.get(name)
        found = _named(_scratch(source, name), name) if source else []
        if source and not found:
            raise LookupError(
                f"{source.module}.{source.attribute} adds no {name!r}: correct the table of "
                "commands in consumers/cli/app.py"
            )
        if self.plugins and (source is None or name in self.group_sources):
            found += _named(_plugins(self.plugins), name)
        if not found:
            return None
        command, *more = map(self._convert, found)
        for extra in more:  # a plugin's commands for this group
            if isinstance(command, TyperGroup) and isinstance(extra, TyperGroup):
                for sub_name, sub in extra.commands.items():
                    command.add_command(sub, sub_name)
        reflow_tree(command)
        return command

    def _convert(self, registered: Registered) -> Command:
        """`registered` as click's objects, as typer makes them for a command of the app."""
        app = self.typer_app()
        if isinstance(registered, TyperInfo):
            return get_group_from_info(
                registered,
                pretty_exceptions_short=app.pretty_exceptions_short,
                rich_markup_mode=app.rich_markup_mode,
                suggest_commands=app.suggest_commands,
            )
        return get_command_from_info(
            registered,
            pretty_exceptions_short=app.pretty_exceptions_short,
            rich_markup_mode=app.rich_markup_mode,
        )
