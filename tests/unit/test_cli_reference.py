"""The command references and the exit-status tables are the program's: every command
`pkgq --help` offers is listed, nothing else is, and every exit status is explained as
consumers/cli/exit_codes.py defines it.

Where: the documentation site's generated docs/reference/cli.md (devtools/docs_reference.py) and
its docs/explanation/cli.md (the README links to them and repeats neither)."""

from __future__ import annotations

import re
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import typer.main
from typer.testing import CliRunner

from consumers.cli import exit_codes
from consumers.cli.app import app
from tests.support.cli_tree import subcommands

ROOT = Path(__file__).resolve().parents[2]
REFERENCE = ROOT / "docs" / "reference" / "cli.md"
CONTRACT = ROOT / "docs" / "explanation" / "cli.md"
EXIT_TABLE = "| exit status | meaning |"


def commands(command: Any, prefix: str = "pkgq") -> Iterator[str]:
    """Every command the program offers, as an operator types it (`pkgq dlq list`); a group
    too when it runs alone (`pkgq web`)."""
    for name, sub in subcommands(command).items():
        if not subcommands(sub) or sub.invoke_without_command:
            yield f"{prefix} {name}"
        yield from commands(sub, f"{prefix} {name}")


def generated_commands() -> list[str]:
    """The commands docs/reference/cli.md lists (groups included: `pkgq dlq`)."""
    return re.findall(r"^\| \[`(pkgq [a-z -]+)`\]", REFERENCE.read_text(), flags=re.MULTILINE)


def offered_by_help() -> set[str]:
    result = CliRunner().invoke(app, ["--help"], env={"COLUMNS": "200"})
    assert result.exit_code == 0
    offered = set(re.findall(r"^│ (\w[\w-]*) ", result.output, flags=re.MULTILINE))
    return offered - {"--version", "--install-completion", "--show-completion"}


def test_the_generated_reference_lists_every_command_of_the_program_once() -> None:
    documented = generated_commands()
    assert len(documented) == len(set(documented)), "a command is listed twice"
    root = typer.main.get_command(app)
    groups = {f"pkgq {name}" for name, sub in subcommands(root).items() if subcommands(sub)}
    assert set(documented) - groups == set(commands(root)) - groups
    assert {name.split()[1] for name in documented} == offered_by_help()


def test_each_exit_status_is_explained_as_the_program_defines_it() -> None:
    text = CONTRACT.read_text()
    table = text[text.index(EXIT_TABLE) :]
    rows = dict(re.findall(r"^\| (\d+) \| (.+) \|$", table.split("\n\n")[0], flags=re.MULTILINE))
    assert {int(code) for code in rows} == set(exit_codes.MEANINGS)
    for code, meaning in exit_codes.MEANINGS.items():
        word = meaning.split(":")[0]
        assert rows[str(code)].startswith(word + ":"), (code, rows[str(code)])
