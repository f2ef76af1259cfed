"""A user's timeline and the message search in the console, in process against real Postgres:
the timeline's pages follow one another through their `Older` links (each entry once), a
cursor pkgq did not give out is refused with 422, and message data is escaped."""

from __future__ import annotations

import html
import re
from collections.abc import AsyncIterator
from datetime import datetime
from uuid import uuid4

import asyncpg
import httpx
import pytest

from infra.postgres import timeline
from infra.settings import Settings
from tests.support.deliveries import add_package
from tests.support.timeline_story import story
from tests.web.client import client, sign_in


@pytest.fixture
async def http(settings: Settings, pool: asyncpg.Pool) -> AsyncIterator[httpx.AsyncClient]:
    async with client(settings, pool) as found:
        assert (await sign_in(found)).status_code == 303
        yield found


async def test_the_timeline_pages_through_every_entry_once_and_the_search_escapes_what_it_shows(
    http: httpx.AsyncClient, pool: asyncpg.Pool
) -> None:
    package = await add_package(pool, 1000, name="<b>plan</b>")
    user = uuid4()
    async with pool.acquire() as conn:
        message = await story(conn, user, package, datetime.fromisoformat("2026-01-02T03:04:05Z"))
    url: str | None = f"/users/{user}/timeline?limit=4"
    kinds: list[str] = []
    while url is not None:
        page = await http.get(url)
        assert page.status_code == 200, page.text
        kinds += re.findall(r'<tr data-source="\w+" data-kind="(\w+)"', page.text)
        older = re.search(r'<a class="button" rel="next" href="([^"]+)"', page.text)
        url = html.unescape(older.group(1)) if older else None
    assert len(kinds) == len(timeline.RANKS) + 1  # the dead letter buried and replayed
    assert kinds[0] == "cancel"
    assert kinds[-1] == "received"
    assert "<b>plan</b>" not in page.text  # the package's name, escaped
    assert "&lt;b&gt;plan&lt;/b&gt;" in (await http.get(f"/users/{user}/timeline")).text

    refused = await http.get(f"/users/{user}/timeline?after=not-a-cursor")
    assert refused.status_code == 422

    found = await http.get("/messages", params={"message_id": str(message)})
    assert found.status_code == 200
    assert f'href="/users/{user}/timeline"' in found.text
    assert 'data-place="dead_letter"' in found.text
    typed = await http.get("/messages", params={"message_id": "<script>x</script>"})
    assert typed.status_code == 422
    assert "<script>x" not in typed.text
