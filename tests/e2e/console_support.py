"""What the console's browser tests arrange and read: a malformed purchase its consumer refuses,
the dead letter it becomes, and the statuses a user's page shows."""

from __future__ import annotations

import json
from uuid import UUID

import asyncpg
from aio_pika.abc import AbstractRobustConnection
from playwright.async_api import Page

from events.envelope import H_SCHEMA_VERSION, H_USER_ID
from events.routes import PACKAGE_PURCHASE
from infra.settings import Settings
from tests.support.deliveries import send_raw


async def malformed_purchase(
    settings: Settings, amqp: AbstractRobustConnection, user: UUID, package: int
) -> str:
    """A purchase its consumer refuses: `amount` is a string (strict JSON wants a number)."""
    body = json.dumps({"user_id": str(user), "package_id": package, "amount": "2"}).encode()
    message_id = await send_raw(
        settings,
        amqp,
        PACKAGE_PURCHASE,
        body,
        headers={H_SCHEMA_VERSION: 1, H_USER_ID: str(user)},
    )
    assert message_id is not None
    return message_id


async def item_statuses(page: Page) -> list[tuple[int, str]]:
    rows = await page.query_selector_all("#items tbody tr[data-item]")
    return [
        (int(await r.get_attribute("data-item") or 0), await r.get_attribute("data-status") or "")
        for r in rows
    ]


async def dead_letter_status(pool: asyncpg.Pool, dead: int) -> str:
    async with pool.acquire() as conn:
        status: str = await conn.fetchval(
            "SELECT status::text FROM telecom.dead_letters WHERE id = $1", dead
        )
    return status
