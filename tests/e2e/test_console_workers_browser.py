"""Which replica owns which partition, in the operator console, in a real headless Chromium
against two real `pkgq run` replicas of a four-partition route and `pkgq web`: the workers page
lists every partition once, each owned by one of the two replicas since the moment it took it.

Screenshot: build/screenshots/workers-partition-owners.png (git-ignored)."""

from __future__ import annotations

import json
from collections.abc import AsyncIterator, Callable

import pytest
from aio_pika.abc import AbstractRobustConnection
from playwright.async_api import Page, expect

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


async def test_the_workers_page_shows_each_partition_owned_by_one_of_the_live_replicas(
    four: Settings, spawn: Callable[..., PkgqProcess]
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

        async def shared() -> bool:
            await page.goto(f"{base}/workers")
            owners = await _owners(page)
            return sorted(p for p, _ in owners) == ["0", "1", "2", "3"] and (
                len({o for _, o in owners}) == 2
            )

        await eventually(shared, within=60, every=1.0)
        await expect(page.locator("h2:has-text('Partition owners')")).to_be_visible()
        await shoot(page, "workers-partition-owners")
        owners = await _owners(page)
    assert len(owners) == 4  # each partition once
    assert all("@" in owner for _, owner in owners)  # a replica's worker name
