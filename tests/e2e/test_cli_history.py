"""`pkgq user history` and `pkgq find` as an operator runs them: the user's timeline as stable
JSON a page at a time (the `next` cursor leads through the rest, each entry once), as a table
without --json, and a message's places, with exit status 3 for a message kept nowhere."""

from __future__ import annotations

import json
from datetime import datetime
from uuid import uuid4

import asyncpg
import pytest

from infra.postgres import timeline
from infra.settings import Settings
from tests.support.deliveries import add_package
from tests.support.processes import cli
from tests.support.timeline_story import story

pytestmark = pytest.mark.e2e

ENTRY_KEYS = {
    "at",
    "source",
    "kind",
    "summary",
    "message_id",
    "route",
    "item_id",
    "dead_letter_id",
    "body",
    "caused_by",
    "detail",
    "cursor",
}


async def test_user_history_prints_the_timeline_as_json_pages_and_find_prints_a_messages_places(
    settings: Settings, pool: asyncpg.Pool
) -> None:
    package = await add_package(pool, 1000, name="1 kB")
    user = uuid4()
    async with pool.acquire() as conn:
        message = await story(conn, user, package, datetime.fromisoformat("2026-01-02T03:04:05Z"))
        await story(conn, uuid4(), package, datetime.fromisoformat("2026-01-02T03:04:05Z"))

    first = await cli(settings, "user", "history", str(user), "--json", "--limit", "6")
    assert first.returncode == 0, first.stderr
    page = json.loads(first.stdout)
    assert (page["user_id"], len(page["entries"])) == (str(user), 6)
    assert all(set(e) == ENTRY_KEYS for e in page["entries"])
    rest = await cli(
        settings, "user", "history", str(user), "--json", "--after", page["next"], "--limit", "50"
    )
    assert rest.returncode == 0, rest.stderr
    last = json.loads(rest.stdout)
    assert last["next"] is None
    entries = page["entries"] + last["entries"]
    assert {e["source"] for e in entries} == set(timeline.RANKS)
    assert len({e["cursor"] for e in entries}) == len(entries) == 11
    assert [e["at"] for e in entries] == sorted((e["at"] for e in entries), reverse=True)
    dead = next(e for e in entries if e["kind"] == "dead_lettered")
    assert (dead["message_id"], dead["body"]) == (str(message), '{"package_id": 7}')

    shown = await cli(settings, "user", "history", str(user), COLUMNS="240")
    assert shown.returncode == 0, shown.stderr
    assert "dead-lettered from telecom.package_purchase" in shown.stdout

    found = await cli(settings, "find", str(message), "--json")
    assert found.returncode == 0, found.stderr
    places = json.loads(found.stdout)
    assert {p["place"] for p in places} >= {"inbox", "outbox", "dead_letter", "audit", "usage"}
    assert {p["user_id"] for p in places if p["user_id"]} == {str(user)}
    nowhere = await cli(settings, "find", str(uuid4()))
    assert nowhere.returncode == 3
    assert "recorded nowhere" in nowhere.stderr
