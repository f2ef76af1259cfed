"""The expiry sweep re-sends a lost timer, and only a lost one."""

from __future__ import annotations

from uuid import UUID, uuid4

import asyncpg

from infra.outbox.sweep import sweep_overdue_expiries
from tests.support.deliveries import add_package
from tests.support.keys import applied

GRACE = 60.0


async def _overdue_item(pool: asyncpg.Pool) -> tuple[UUID, int]:
    package = await add_package(pool, 1000)
    user = uuid4()
    async with pool.acquire() as conn:
        item: int = await conn.fetchval(
            "INSERT INTO telecom.package_queue (user_id, package_id, status, activated_at, "
            "expire_at) VALUES ($1, $2, 'active', now() - interval '2 hours', "
            "now() - interval '1 hour') RETURNING id",
            user,
            package,
        )
    return user, item


async def _timer(pool: asyncpg.Pool, user: UUID, item: int, published_ago: float | None) -> UUID:
    message_id = uuid4()
    async with pool.acquire() as conn:
        await conn.execute(
            "INSERT INTO telecom.outbox (message_id, route, message_type, schema_version, "
            "user_id, body, cancel_key, published_at) VALUES ($1, 'telecom.expiry_due', "
            "'PackageExpiryDue', 1, $2, '{}', $3, "
            "CASE WHEN $4::float8 IS NULL THEN NULL "
            "ELSE now() - make_interval(secs => $4::float8) END)",
            message_id,
            user,
            f"expire:{item}",
            published_ago,
        )
    return message_id


async def test_an_overdue_item_with_no_timer_gets_exactly_one(pool: asyncpg.Pool) -> None:
    await _overdue_item(pool)
    assert await sweep_overdue_expiries(pool, GRACE) == 1
    assert await sweep_overdue_expiries(pool, GRACE) == 0  # the new timer is pending


async def test_a_published_timer_still_waiting_in_a_backlog_is_not_sent_again(
    pool: asyncpg.Pool,
) -> None:
    user, item = await _overdue_item(pool)
    await _timer(pool, user, item, published_ago=5 * GRACE)
    assert await sweep_overdue_expiries(pool, GRACE) == 0


async def test_a_timer_consumed_without_effect_is_sent_again_after_the_grace(
    pool: asyncpg.Pool,
) -> None:
    user, item = await _overdue_item(pool)
    message_id = await _timer(pool, user, item, published_ago=2 * GRACE)
    async with pool.acquire() as conn:
        await applied(conn, "expiry_due", message_id, user, publisher="pkgq")  # its own timer
    assert await sweep_overdue_expiries(pool, GRACE) == 1


async def test_a_timer_published_long_ago_and_never_consumed_is_sent_again(
    pool: asyncpg.Pool,
) -> None:
    user, item = await _overdue_item(pool)
    await _timer(pool, user, item, published_ago=11 * GRACE)
    assert await sweep_overdue_expiries(pool, GRACE) == 1
