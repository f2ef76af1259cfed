"""Which replica owns which partition, in the operator console, in a real headless Chromium
against two real `pkgq run` replicas of a four-partition route and `pkgq web`: the workers page
lists every partition once, each owned by the replica the assignment (rendezvous hashing over
the two live replicas) gives it.

Screenshot: build/screenshots/workers-partition-owners.png (git-ignored)."""

from __future__ import annotations

import json
from collections.abc import AsyncIterator, Callable

import asyncpg
import pytest
from aio_pika.abc import AbstractRobustConnection
from playwright.async_api import Page, expect

from domain.assignment import assign
from events.routes import USAGE_RECORD
from infra.settings import Settings
from tests.e2e.test_partitions_e2e import declared, wait_logged
from tests.support.observing import eventually
from tests.support.processes import PkgqProcess, free_port
from tests.web.client import OPERATOR_PASSWORD
from tests.web.stack import _ready, browser, shoot, sign_in, web_env

pytestmark = pytest.mark.e2e

PARTITIONS = {USAGE_RECORD.name: 4}


@pytest.fixture
async def four(settings: Settings, amqp: AbstractRobustConnection) -> AsyncIterator[Settings]:
    parted = settings.model_copy(update={"partitions": PARTITIONS})
    async with declared(parted, amqp):
        yield parted


async def _owners(page: Page) -> list[tuple[str, str]]:
    """(partition, owner) of each usage_record row of the partition owners' table."""
    rows = page.locator("section:has(h2:has-text('Partition owners')) tbody tr")
    found = []
    for k in range(await rows.count()):
        cells = rows.nth(k).locator("td")
        if await cells.count() == 4 and await cells.nth(0).inner_text() == "usage_record":
            found.append((await cells.nth(1).inner_text(), await cells.nth(2).inner_text()))
    return found


async def _assigned(pool: asyncpg.Pool, replicas: list[PkgqProcess]) -> dict[str, str]:
    """What the assignment gives each partition: its owner's worker name."""
    async with pool.acquire() as conn:
        rows = await conn.fetch(
            "SELECT id, name FROM telecom.workers WHERE pid = ANY($1::int[]) AND role = 'run'",
            [r.proc.pid for r in replicas],
        )
    names = {str(r["id"]): r["name"] for r in rows}
    owners = assign(USAGE_RECORD.name, PARTITIONS[USAGE_RECORD.name], list(names))
    return {str(k): names[owner] for k, owner in owners.items()}


async def test_the_workers_page_shows_each_partition_owned_by_the_replica_assigned_it(
    four: Settings, pool: asyncpg.Pool, spawn: Callable[..., PkgqProcess]
) -> None:
    env = {"PKGQ_PARTITIONS": json.dumps(PARTITIONS)}
    replicas = [spawn("run", **env), spawn("run", **env)]
    for replica in replicas:
        await wait_logged(replica, "ready", within=60)
    port = free_port()
    spawn("web", **env, **web_env(port))

    async def up() -> bool:
        return await _ready(port)

    await eventually(up, within=60)
    base = f"http://127.0.0.1:{port}"
    async with browser() as chromium:
        page = await sign_in(chromium, base, "olga", OPERATOR_PASSWORD)

        expected = await _assigned(pool, replicas)

        async def shared() -> bool:
            await page.goto(f"{base}/workers")
            return dict(await _owners(page)) == expected

        await eventually(shared, within=60, every=1.0)
        await expect(page.locator("h2:has-text('Partition owners')")).to_be_visible()
        await shoot(page, "workers-partition-owners")
        owners = await _owners(page)
    assert sorted(p for p, _ in owners) == ["0", "1", "2", "3"]  # each partition once
    assert set(expected.values()) <= {o for _, o in owners}
