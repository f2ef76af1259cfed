"""`pkgq COMMAND` imports COMMAND's module and no other command's (consumers/cli/lazy.py), and
the command tree it builds a command at a time is the one typer builds with every command
registered up front: the same commands in the same order, with the same options, help and
callbacks. So a command missing from app.py's table, or listed out of order, fails here."""

from __future__ import annotations

import contextlib
import copy
import importlib
import io
import json
import pkgutil
import re
import subprocess
import sys
from collections.abc import Mapping
from importlib import metadata
from pathlib import Path
from typing import Any, ClassVar

import pytest
import typer.main

import consumers.cli
from consumers.cli.app import COMMANDS, GROUPS, PLUGINS, app
from consumers.cli.help_text import ReflowedGroup
from consumers.cli.lazy import LazyGroup, Source
from tests.support.cli_tree import subcommands, walk

COMMAND_MODULES = {source.module for source in (*COMMANDS.values(), *GROUPS.values())}
PLUGIN_MODULES = {entry.module for entry in metadata.entry_points(group=PLUGINS)}
HEAVY = {"fastapi", "uvicorn", "starlette"}  # the console's server: `pkgq web` only

PROBE = """
import json, sys
from consumers.cli import main
report = sys.argv.pop(1)
sys.argv[0] = "pkgq"
try:
    main()
except SystemExit:
    pass
with open(report, "w") as out:
    json.dump(sorted(sys.modules), out)
"""


def imported_by(tmp_path: Path, *args: str) -> set[str]:
    """The modules a fresh `pkgq ARGS` process has imported when it ends."""
    report = tmp_path / "modules.json"
    subprocess.run(
        [sys.executable, "-c", PROBE, str(report), *args],
        capture_output=True,
        check=True,
        timeout=60,
    )
    modules: list[str] = json.loads(report.read_text())
    return set(modules)


@pytest.mark.parametrize(
    ("args", "its_module"),
    [
        (("--version",), None),
        (("doctor", "--help"), "consumers.cli.doctor"),
        (("dlq", "--help"), "consumers.cli.dlq"),
        (("route", "status", "--help"), "consumers.cli.routes"),
    ],
)
def test_a_command_imports_its_own_module_and_no_other_commands(
    tmp_path: Path, args: tuple[str, ...], its_module: str | None
) -> None:
    modules = imported_by(tmp_path, *args)
    assert its_module is None or its_module in modules
    assert modules & COMMAND_MODULES <= {its_module}
    assert not modules & HEAVY
    if args[0] in ("--version", *COMMANDS):  # only a group may have a plugin's commands
        assert not modules & PLUGIN_MODULES


# -- the eager tree: what typer builds from an app with everything registered up front ------


def eager_app() -> typer.Typer:
    """`pkgq` registered as app.py did before its commands were lazy: each source of the table
    registered in order, then the plugins, whose group under the name of one of pkgq's joins
    it; built by typer alone, on a plain ReflowedGroup."""
    eager = copy.copy(app)
    eager.info = copy.copy(app.info)
    eager.info.cls = ReflowedGroup
    eager.registered_commands, eager.registered_groups = [], []
    registered: set[Source] = set()
    for name, source in {**COMMANDS, **GROUPS}.items():
        defined = getattr(importlib.import_module(source.module), source.attribute)
        if isinstance(defined, typer.Typer):
            eager.add_typer(defined, name=name)
        elif source not in registered:  # once for all the names it adds
            defined(eager)
            registered.add(source)
    for entry in metadata.entry_points(group=PLUGINS):
        extra = typer.Typer()
        entry.load()(extra)
        eager.registered_commands += extra.registered_commands
        for group in extra.registered_groups:
            _join(eager, group)
    return eager


def _join(eager: typer.Typer, group: Any) -> None:
    for i, ours in enumerate(eager.registered_groups):
        if ours.name == group.name and ours.typer_instance:
            merged = copy.copy(ours.typer_instance)
            merged.registered_commands = [
                *ours.typer_instance.registered_commands,
                *group.typer_instance.registered_commands,
            ]
            eager.registered_groups[i] = copy.copy(ours)
            eager.registered_groups[i].typer_instance = merged
            return
    eager.registered_groups.append(group)


def described(command: Any) -> str:
    """What a command is made of, but its commands and its callback: its settings and each
    option's, as text without the objects' addresses."""
    fields = {k: v for k, v in vars(command).items() if k not in {"commands", "callback"}}
    fields["params"] = [{**vars(p), "type": getattr(p, "type", None)} for p in command.params]
    kind = "root" if isinstance(command, ReflowedGroup) else type(command).__name__
    return re.sub(r" at 0x[0-9a-f]+", "", f"{kind} {fields}")


def callback(command: Any) -> Any:
    """The function a command runs (typer wraps it)."""
    return getattr(command.callback, "__wrapped__", command.callback)


def rendered_help(root: Any, path: tuple[str, ...]) -> str:
    out = io.StringIO()
    with pytest.MonkeyPatch.context() as env, contextlib.redirect_stdout(out):
        env.setenv("COLUMNS", "100")
        root.main(args=[*path, "--help"], prog_name="pkgq", standalone_mode=False)
    return out.getvalue()


def test_the_lazy_tree_is_the_tree_typer_builds_with_everything_registered() -> None:
    lazy = typer.main.get_command(app)
    eager = typer.main.get_command(eager_app())
    assert isinstance(lazy, LazyGroup)
    assert [path for path, _ in walk(lazy)] == [path for path, _ in walk(eager)]
    for (path, ours), (_, theirs) in zip(walk(lazy), walk(eager), strict=True):
        assert described(ours) == described(theirs), path
        assert callback(ours) is callback(theirs), path
        assert rendered_help(lazy, path) == rendered_help(eager, path), path


def test_every_command_module_is_in_the_table() -> None:
    """Every command that a module of consumers/cli registers (its `register(app)`) or defines
    (in a command group) is in the tree: else the table of app.py misses its source."""
    in_tree = {callback(command) for _, command in walk(typer.main.get_command(eager_app()))}

    def missing(group: typer.Typer) -> list[str]:
        for command in group.registered_commands:
            assert command.name, f"{command.callback} is registered without an explicit name"
        commands = [c.callback for c in group.registered_commands]
        if group.registered_callback:
            commands.append(group.registered_callback.callback)
        groups = [g.typer_instance for g in group.registered_groups if g.typer_instance]
        return [f.__qualname__ for f in commands if f and f not in in_tree] + [
            name for sub in groups for name in missing(sub)
        ]

    for info in pkgutil.iter_modules(consumers.cli.__path__, "consumers.cli."):
        module = importlib.import_module(info.name)
        if callable(register := getattr(module, "register", None)):
            scratch = typer.Typer()
            register(scratch)
            assert not missing(scratch), f"{info.name}.register adds commands pkgq has not"
        for name, value in vars(module).items():
            if isinstance(value, typer.Typer) and value is not app:
                assert not missing(value), f"commands of {info.name}.{name} are not in pkgq"


def test_a_table_entry_whose_module_does_not_add_it_is_an_error() -> None:
    class Wrong(LazyGroup):
        command_sources: ClassVar[Mapping[str, Source]] = {
            "nothing": Source("consumers.cli.doctor")
        }

        def typer_app(self) -> typer.Typer:
            return app

    wrong = Wrong(name="pkgq")
    with pytest.raises(LookupError, match=r"consumers\.cli\.doctor\.register adds no 'nothing'"):
        wrong.get_command(typer.Context(wrong), "nothing")


def test_an_unknown_command_is_none_and_the_suggestions_see_every_name() -> None:
    root = typer.main.get_command(app)
    assert isinstance(root, LazyGroup)
    assert root.get_command(typer.Context(root), "stat") is None
    assert list(root.commands) != [], "typer's 'Did you mean' picks from these"
    assert set(root.commands) == set(subcommands(root))
