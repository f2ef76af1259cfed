"""The console's workers page in process against real Postgres: at most WORKERS_SHOWN workers,
running ones first, the most recently started first, and a note of how many there are when the
list is cut."""

from __future__ import annotations

import re
from collections.abc import AsyncIterator
from uuid import uuid4

import asyncpg
import httpx
import pytest

from consumers.web.pages import WORKERS_SHOWN
from infra.postgres import partition_owners, workers
from infra.settings import Settings
from tests.web.client import VIEWER_PASSWORD, client, sign_in


@pytest.fixture
async def http(settings: Settings, pool: asyncpg.Pool) -> AsyncIterator[httpx.AsyncClient]:
    async with client(settings, pool) as found:
        assert (await sign_in(found, "vic", VIEWER_PASSWORD)).status_code == 303
        yield found


async def _register(pool: asyncpg.Pool, count: int) -> None:
    """`count` workers named w1, w2, …: w1 started last, each one a minute before the one
    named before it; every tenth one stopped."""
    async with pool.acquire() as conn:
        await conn.execute(
            "INSERT INTO telecom.workers (id, name, role, host, pid, started_at, stopped_at) "
            "SELECT gen_random_uuid(), 'w' || n, 'consumer', 'host', n, "
            "now() - n * interval '1 minute', "
            "CASE WHEN n % 10 = 0 THEN now() END "
            "FROM generate_series(1, $1) n",
            count,
        )


def _names(page: httpx.Response) -> list[str]:
    return re.findall(r'<tr><td class="nowrap">(w\d+)</td>', page.text)


async def test_the_workers_page_shows_the_first_workers_and_says_how_many_there_are(
    http: httpx.AsyncClient, pool: asyncpg.Pool
) -> None:
    await _register(pool, WORKERS_SHOWN + 3)
    page = await http.get("/workers")
    assert page.status_code == 200
    assert f"showing {WORKERS_SHOWN} of {WORKERS_SHOWN + 3}" in page.text
    running = [f"w{n}" for n in range(1, WORKERS_SHOWN + 4) if n % 10]
    stopped = [f"w{n}" for n in range(10, WORKERS_SHOWN + 4, 10)]
    # Running ones first, each part most recently started first: the order the CLI lists.
    assert _names(page) == (running + stopped)[:WORKERS_SHOWN]


async def test_the_workers_page_says_nothing_of_a_cut_when_every_worker_is_shown(
    http: httpx.AsyncClient, pool: asyncpg.Pool
) -> None:
    await _register(pool, 12)
    page = await http.get("/workers")
    assert page.status_code == 200
    assert len(_names(page)) == 12
    assert "showing" not in page.text


async def test_the_workers_page_shows_which_replica_owns_which_partition_since_when(
    http: httpx.AsyncClient, pool: asyncpg.Pool
) -> None:
    owner = uuid4()
    async with pool.acquire() as conn:
        await workers.register(conn, owner, "pkgq-run@pod-7:1", "run", "pod-7", 1)
        await partition_owners.claim(conn, owner, "telecom.usage_record", [11])
        since = await conn.fetchval("SELECT since FROM telecom.partition_owners")
    page = await http.get("/workers")
    assert page.status_code == 200
    row = re.search(r"<tr><td>usage_record</td><td class=\"num\">11</td>.*?</tr>", page.text, re.S)
    assert row is not None, page.text
    assert "pkgq-run@pod-7:1" in row.group(0)
    assert since.isoformat()[:19].replace("T", " ") in row.group(0)
