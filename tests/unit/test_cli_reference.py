"""The README's command reference and exit-status table are the program's: every command
`pkgq --help` offers is listed, nothing else is, and every exit status is explained as
consumers/cli/exit_codes.py defines it."""

from __future__ import annotations

import re
from collections.abc import Iterator
from pathlib import Path

import typer
from typer.testing import CliRunner

from consumers.cli import exit_codes
from consumers.cli.app import app

README = Path(__file__).resolve().parents[2] / "README.md"


def commands(group: typer.Typer, prefix: str = "pkgq") -> Iterator[str]:
    """Every command the app registers, as an operator types it (`pkgq dlq list`)."""
    for command in group.registered_commands:
        assert command.name, "every command is registered under an explicit name"
        yield f"{prefix} {command.name}"
    for sub in group.registered_groups:
        assert sub.name is not None
        assert sub.typer_instance is not None
        if sub.typer_instance.info.invoke_without_command:  # the group runs alone too (pkgq web)
            yield f"{prefix} {sub.name}"
        yield from commands(sub.typer_instance, f"{prefix} {sub.name}")


def readme_section(heading: str) -> str:
    text = README.read_text()
    start = text.index(heading)
    return text[start : text.index("\n\n**", start + len(heading))]


def documented_commands() -> list[str]:
    table = readme_section("**Command reference**")
    return re.findall(r"^\| `(pkgq [a-z -]+)` \|", table, flags=re.MULTILINE)


def test_the_readme_lists_every_command_of_the_program_once_and_no_other() -> None:
    documented = documented_commands()
    assert len(documented) == len(set(documented)), "a command is listed twice"
    assert set(documented) == set(commands(app))


def test_every_top_level_command_in_the_readme_is_offered_by_pkgq_help() -> None:
    result = CliRunner().invoke(app, ["--help"], env={"COLUMNS": "200"})
    assert result.exit_code == 0
    offered = set(re.findall(r"^│ (\w[\w-]*) ", result.output, flags=re.MULTILINE))
    top_level = {name.split()[1] for name in documented_commands()}
    assert top_level == offered - {"--version", "--install-completion", "--show-completion"}


def test_the_readme_explains_each_exit_status_as_the_program_defines_it() -> None:
    text = README.read_text()
    table = text[text.index("| exit status | meaning |") :]
    rows = dict(re.findall(r"^\| (\d+) \| (.+) \|$", table.split("\n\n")[0], flags=re.MULTILINE))
    assert {int(code) for code in rows} == set(exit_codes.MEANINGS)
    for code, meaning in exit_codes.MEANINGS.items():
        word = meaning.split(":")[0]
        assert rows[str(code)].startswith(word + ":"), (code, rows[str(code)])
