"""Usage billed to an item that changes nothing else is written as its counters alone (three
short arrays, a plain UPDATE), not through the items' upsert; beside items that change more
(consumed, bought), the counters ride on the upsert's statement. Either way the rows end up
exactly as the domain left them."""
# An item whose time is up is expired by the usage that finds it (a status change: the upsert).

from __future__ import annotations

from uuid import UUID

import asyncpg

from consumers.delivery import DeliveryPipeline
from consumers.registry import HANDLERS
from consumers.retry_policy import RetryPolicy
from devtools.postgres.statements import StatementLog
from domain.delivery import Fate
from events.models import RecordUsage
from events.routes import USAGE_RECORD
from tests.support.deliveries import raw_for
from tests.support.queue_items import active_users, item_counters

LIMIT = 1000
COUNTERS = "queue_counted AS ( UPDATE telecom.package_queue AS q SET upload = c.upload"
UPSERT = "queue_saved AS ( INSERT INTO telecom.package_queue"
"""The CTEs of the batch's write statement (infra/postgres/compound.py) that write items: the
counters' update and the items' upsert (the statement log folds whitespace)."""


def _counters_alone(statement: str) -> bool:
    return COUNTERS in statement and UPSERT not in statement


async def _bill(
    pool: asyncpg.Pool, log: StatementLog, usage: list[tuple[UUID, int, int]]
) -> list[str]:
    pipeline = DeliveryPipeline(
        pool, USAGE_RECORD, HANDLERS[USAGE_RECORD.name], RetryPolicy(), max_body_bytes=2**20
    )
    await log.settled()
    log.clear()
    raws = [
        raw_for(USAGE_RECORD, RecordUsage(user_id=u, upload=up, download=down))
        for u, up, down in usage
    ]
    results = await pipeline.process_batch(raws)
    assert [r.fate for r in results] == [Fate.ACKED] * len(raws)
    await log.settled()
    return list(log.statements)


async def test_usage_that_changes_only_counters_is_written_by_the_counters_update_alone(
    counted: tuple[asyncpg.Pool, StatementLog],
) -> None:
    pool, log = counted
    users = await active_users(pool, 3, limit=LIMIT, name="counters")
    statements = await _bill(pool, log, [(u, 10 * (n + 1), n) for n, u in enumerate(users)])
    assert sum(_counters_alone(s) for s in statements) == 1
    assert not any(UPSERT in s for s in statements)
    assert await item_counters(pool, users) == {
        u: ("active", 10 * (n + 1), n) for n, u in enumerate(users)
    }


async def test_counters_ride_on_the_upsert_beside_an_item_that_is_consumed(
    counted: tuple[asyncpg.Pool, StatementLog],
) -> None:
    pool, log = counted
    billed, consumed = await active_users(pool, 2, limit=LIMIT, name="counters")
    async with pool.acquire() as conn:  # its time is up: the usage expires it first
        await conn.execute(
            "UPDATE telecom.package_queue SET expire_at = now() - interval '1 minute' "
            "WHERE user_id = $1",
            consumed,
        )
    statements = await _bill(pool, log, [(billed, 7, 3), (consumed, 5, 0)])
    # One statement writes both items: the counters' update is a CTE of the upsert.
    assert sum(UPSERT in s and COUNTERS in s for s in statements) == 1
    assert not any(_counters_alone(s) for s in statements)
    assert await item_counters(pool, [billed, consumed]) == {
        billed: ("active", 7, 3),
        consumed: ("consumed", 0, 0),  # expired by time; the usage was kept as unbilled
    }
