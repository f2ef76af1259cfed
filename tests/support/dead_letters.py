"""Dead letters for tests: one filed as a consumer files it (dead_letters.bury), every field
defaulted and any of them given; and the id of one pkgq files, once it is there."""

from __future__ import annotations

from typing import Any
from uuid import UUID, uuid4

import asyncpg

from events.routes import ROUTES
from infra.postgres import dead_letters
from tests.support.observing import eventually


def consumer_dead_letter(
    route: str = "telecom.usage_record", **fields: Any
) -> dead_letters.NewDeadLetter:
    """A dead letter of `route` as its consumer gives it up: a fresh message_id and user, an
    empty JSON body, reason `max_attempts`; `fields` replace any of them."""
    known = ROUTES.get(route)
    values: dict[str, Any] = {
        "source": "consumer",
        "route": route,
        "consumer": route.removeprefix("telecom."),
        "message_id": str(uuid4()),
        "user_id": uuid4(),
        "message_type": known.message_type if known else "RecordUsage",
        "content_type": "application/json",
        "body": b"{}",
        "headers": {},
        "reason": "max_attempts",
        "error_type": "RuntimeError",
        "error_message": "boom",
    }
    return dead_letters.NewDeadLetter(**{**values, **fields})


async def buried(pool: asyncpg.Pool, route: str = "telecom.usage_record", **fields: Any) -> int:
    """File consumer_dead_letter(route, **fields) through dead_letters.bury; its id."""
    async with pool.acquire() as conn:
        return await dead_letters.bury(conn, consumer_dead_letter(route, **fields))


async def buried_id(pool: asyncpg.Pool, message_id: str | UUID) -> int:
    """The id of the buried dead letter of `message_id`, once it is filed (the test fails if
    it is not within eventually's time)."""
    found: list[int] = []

    async def filed() -> bool:
        async with pool.acquire() as conn:
            dead_id = await conn.fetchval(
                "SELECT id FROM telecom.dead_letters WHERE message_id = $1 AND status = 'buried'",
                str(message_id),
            )
        found[:] = [dead_id] if dead_id is not None else []
        return bool(found)

    await eventually(filed)
    return found[0]
