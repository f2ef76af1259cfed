"""Operator output: data from messages reaches the terminal as literal text, never as rich
markup or terminal control sequences."""

from __future__ import annotations

import json
from uuid import uuid4

import asyncpg
import pytest

from infra.postgres import dead_letters
from infra.settings import Settings
from tests.support.processes import cli

pytestmark = pytest.mark.e2e

ESC = "\x1b"
TYPE = "[/]"
ERROR = f"type {TYPE} is [bold]unknown[/bold] {ESC}[31mred"
SHOWN_ERROR = ERROR.replace(ESC, "\\x1b")  # how the operator sees it: the escape, not the byte
TRACEBACK = f"Traceback (most recent call last):\n  [/] in [bold]handler[/bold]\n{ESC}[2J\n"


async def file_hostile_dead_letter(pool: asyncpg.Pool) -> int:
    """A broker dead letter whose type, route, error text and traceback are all markup and
    escape sequences, as anyone who can publish could make them."""
    async with pool.acquire() as conn:
        return await dead_letters.bury(
            conn,
            dead_letters.NewDeadLetter(
                source="broker",
                route=f"telecom.{TYPE}",
                consumer="pkgq.dead_letters",
                message_id=str(uuid4()),
                user_id=None,
                message_type=TYPE,
                content_type="application/json",
                body=json.dumps({"type": TYPE, "note": f"[bold]{ESC}[31m"}).encode(),
                headers={"type": TYPE, "x-note": f"{ESC}]0;title{ESC}\\"},
                reason="rejected",
                error_type=f"[/]{ESC}[31m",
                error_message=ERROR,
                error_location=f"[bold]{TYPE}[/bold]:1",
                traceback=TRACEBACK,
            ),
        )


async def test_dlq_list_show_and_groups_print_markup_and_escapes_from_messages_literally(
    settings: Settings, pool: asyncpg.Pool, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("COLUMNS", "400")  # wide enough that no cell is wrapped or cut
    dead_letter_id = await file_hostile_dead_letter(pool)

    listed = await cli(settings, "dlq", "list")
    assert listed.returncode == 0, listed.stderr
    assert f"telecom.{TYPE}" in listed.stdout
    assert f"[/]\\x1b[31m: {SHOWN_ERROR}" in listed.stdout

    shown = await cli(settings, "dlq", "show", str(dead_letter_id))
    assert shown.returncode == 0, shown.stderr
    for literal in (
        f"message_type  {TYPE}",
        f"route  telecom.{TYPE}",
        f"error_message  {SHOWN_ERROR}",
        "[/] in [bold]handler[/bold]",
        "\\x1b[2J",
        '"type": "[/]"',
    ):
        assert literal in shown.stdout, literal

    groups = await cli(settings, "dlq", "groups")
    assert groups.returncode == 0, groups.stderr
    assert f"[bold]{TYPE}[/bold]:1" in groups.stdout
    assert f"telecom.{TYPE}" in groups.stdout

    for out in (listed, shown, groups):
        assert ESC not in out.stdout
        assert ESC not in out.stderr


async def test_catalog_list_prints_a_package_name_of_markup_and_escapes_literally(
    settings: Settings, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("COLUMNS", "400")
    name = f"[/] [bold]{ESC}[31mplan"
    added = await cli(settings, "catalog", "add", name, "--traffic", "1GiB", "--duration", "1d")
    assert added.returncode == 0, added.stderr
    listed = await cli(settings, "catalog", "list")
    assert listed.returncode == 0, listed.stderr
    assert "[/] [bold]\\x1b[31mplan" in listed.stdout
    assert ESC not in listed.stdout
