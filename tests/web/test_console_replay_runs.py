"""The console's replay runs in process against real Postgres: a bulk replay at a set rate runs
in the background and its page, refreshing while it runs, shows its progress from the run's
record; a run stopped by a tripped circuit breaker says why there and is resumed from it."""

from __future__ import annotations

import html
import re
from collections.abc import AsyncIterator

import asyncpg
import httpx
import pytest

from events.routes import USAGE_RECORD
from infra.postgres import consumer_pauses
from infra.settings import Settings
from tests.support.dead_letters import buried
from tests.support.observing import eventually, fetch
from tests.web.client import client, csrf_of, sign_in


@pytest.fixture
async def http(settings: Settings, pool: asyncpg.Pool) -> AsyncIterator[httpx.AsyncClient]:
    async with client(settings, pool) as found:
        assert (await sign_in(found)).status_code == 303
        yield found


def _shown(page: httpx.Response, field: str) -> str:
    found = re.search(rf'<td id="{field}">([^<]*)</td>', page.text)
    assert found, page.text
    return html.unescape(found.group(1))


async def _replay_at(http: httpx.AsyncClient, ids: list[int], rate: str) -> httpx.Response:
    confirm = await http.get(f"/dead-letters/confirm?action=replay&route={USAGE_RECORD.name}")
    assert 'name="rate"' in confirm.text
    form = {"csrf": csrf_of(confirm.text), "action": "replay", "ids": ",".join(map(str, ids))}
    return await http.post("/dead-letters/act", data={**form, "rate": rate})


async def test_a_bulk_replay_at_a_rate_runs_in_the_background_and_its_page_shows_its_progress(
    http: httpx.AsyncClient, pool: asyncpg.Pool
) -> None:
    ids = [await buried(pool) for _ in range(12)]
    started = await _replay_at(http, ids, "40")
    assert started.status_code == 303
    page_url = started.headers["location"]
    assert re.fullmatch(r"/dead-letters/replays/\d+", page_url)
    first = await http.get(page_url)
    assert first.status_code == 200
    for field in ("sent", "failed-again", "left", "rate", "ends"):
        _shown(first, field)  # every progress field is on the page

    async def done() -> bool:
        return "done" in (await http.get(page_url)).text.split("</h1>")[0]

    await eventually(done, within=30)
    final = await http.get(page_url)
    assert (_shown(final, "sent"), _shown(final, "left")) == ("12 of 12", "0")
    assert 'http-equiv="refresh"' not in final.text  # it refreshes only while it runs
    sent = await fetch(pool, "SELECT dedup_key FROM telecom.outbox WHERE dedup_key LIKE 'replay:%'")
    assert sorted(int(r["dedup_key"].split(":")[1]) for r in sent) == sorted(ids)
    listed = await http.get("/dead-letters/replays")
    assert page_url in listed.text


async def test_a_run_stopped_by_a_tripped_breaker_says_why_and_is_resumed_from_its_page(
    http: httpx.AsyncClient, pool: asyncpg.Pool
) -> None:
    ids = [await buried(pool) for _ in range(5)]
    async with pool.acquire() as conn:
        await consumer_pauses.pause(
            conn, USAGE_RECORD.name, "breaker@test", "circuit breaker: 8 of 10", automatic=True
        )
    page_url = (await _replay_at(http, ids, "100")).headers["location"]

    async def stopped() -> bool:
        return "stopped_breaker" in (await http.get(page_url)).text

    await eventually(stopped, within=30)
    page = await http.get(page_url)
    assert "circuit breaker of telecom.usage_record tripped" in html.unescape(page.text)
    assert "Resume: the 5 not sent yet" in page.text

    async with pool.acquire() as conn:
        await consumer_pauses.resume(conn, USAGE_RECORD.name, "ops")
    resumed = await http.post(f"{page_url}/resume", data={"csrf": csrf_of(page.text)})
    assert resumed.status_code == 303

    async def done() -> bool:
        return "done" in (await http.get(page_url)).text.split("</h1>")[0]

    await eventually(done, within=30)
    assert _shown(await http.get(page_url), "sent") == "5 of 5"
