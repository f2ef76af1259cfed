"""The console's overview in process against real Postgres: per route, messages processed and
dead letters filed in the last minute (a failure shows at once, not only as a buried total)."""

from __future__ import annotations

import re
from collections.abc import AsyncIterator

import asyncpg
import httpx
import pytest

from infra.settings import Settings
from tests.support.dead_letters import buried
from tests.web.client import VIEWER_PASSWORD, client, sign_in


@pytest.fixture
async def http(settings: Settings, pool: asyncpg.Pool) -> AsyncIterator[httpx.AsyncClient]:
    async with client(settings, pool) as found:
        assert (await sign_in(found, "vic", VIEWER_PASSWORD)).status_code == 303
        yield found


async def _bury(pool: asyncpg.Pool, route: str, minutes_ago: int) -> None:
    dead_id = await buried(pool, route)
    async with pool.acquire() as conn:
        await conn.execute(
            "UPDATE telecom.dead_letters "
            "SET last_failed_at = now() - make_interval(mins => $2) WHERE id = $1",
            dead_id,
            minutes_ago,
        )


def _failed_per_minute(page: httpx.Response, short: str) -> str:
    row = re.search(rf'<tr data-route="{short}">(.*?)</tr>', page.text, re.S)
    assert row is not None, page.text
    cell = re.search(r'data-col="failed">(\d+)<', row.group(1))
    assert cell is not None, row.group(1)
    return cell.group(1)


async def test_the_overview_counts_dead_letters_filed_in_the_last_minute_per_route(
    http: httpx.AsyncClient, pool: asyncpg.Pool
) -> None:
    for _ in range(2):
        await _bury(pool, "telecom.usage_record", minutes_ago=0)
    await _bury(pool, "telecom.usage_record", minutes_ago=5)  # buried, but not this minute
    page = await http.get("/overview/live")
    assert page.status_code == 200
    assert _failed_per_minute(page, "usage_record") == "2"
    assert _failed_per_minute(page, "package_purchase") == "0"
