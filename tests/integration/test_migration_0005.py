"""Migration 0005 carries data: a database at version 4, filled in the old shape, keeps every
item's terms and every order when it is migrated to version 5."""

from __future__ import annotations

from datetime import timedelta
from uuid import uuid4

import asyncpg
import pytest

from infra.postgres import batch_read, catalog, queue_repo
from infra.postgres.migrate import migrate
from infra.settings import Settings


async def test_migrating_a_filled_version_4_database_keeps_terms_and_orders(
    settings: Settings,
) -> None:
    conn = await asyncpg.connect(settings.postgres_dsn)
    try:
        await conn.execute("DROP SCHEMA telecom CASCADE")
        assert await migrate(conn, target=4) == [1, 2, 3, 4]
        user, order, resent = uuid4(), uuid4(), uuid4()
        monthly = await conn.fetchval(
            "INSERT INTO telecom.packages (name, traffic_limit, duration) "
            "VALUES ('monthly', 1000, interval '30 days') RETURNING id"
        )
        untimed = await conn.fetchval(
            "INSERT INTO telecom.packages (name, traffic_limit) VALUES ('untimed', 500) "
            "RETURNING id"
        )
        # The old shape: items name their package only. A consumed item of one order, and an
        # order resent before orders were deduplicated (it queued twice).
        await conn.execute(
            """
            INSERT INTO telecom.package_queue (user_id, package_id, by_order, status, upload)
            VALUES ($1, $2, $3, 'consumed', 1000), ($1, $4, $5, 'active', 10),
                   ($1, $4, $5, 'in_queue', 0), ($1, $4, NULL, 'in_queue', 0)
            """,
            user,
            monthly,
            order,
            untimed,
            resent,
        )
        ids = [
            r["id"] for r in await conn.fetch("SELECT id FROM telecom.package_queue ORDER BY id")
        ]

        assert await migrate(conn, target=5) == [5]  # this test is about 0005 alone

        # A catalog edit after the migration reaches none of the items bought before it.
        await catalog.edit_package(conn, monthly, "monthly v2", 10, timedelta(hours=1))
        await catalog.retire_package(conn, untimed)
        items = {i.id: i for i in await queue_repo.load_user_items(conn, user)}
        orders = await batch_read.load_orders(conn, [(user, order), (user, resent)])
    finally:
        await conn.close()

    assert [(items[i].terms.package_name, items[i].quota) for i in ids] == [
        ("monthly", 1000),
        ("untimed", 500),
        ("untimed", 500),
        ("untimed", 500),
    ]
    assert items[ids[0]].terms.duration == timedelta(days=30)
    assert items[ids[1]].terms.duration is None
    assert items[ids[0]].by_order == order
    assert orders == {user: {order: (ids[0],), resent: (ids[1], ids[2])}}


async def test_migration_5_refuses_a_package_with_neither_a_limit_nor_a_duration(
    pool: asyncpg.Pool,
) -> None:
    async with pool.acquire() as conn:
        with pytest.raises(asyncpg.CheckViolationError, match="packages_some_limit"):
            await conn.execute(
                "INSERT INTO telecom.packages (name, traffic_limit) VALUES ('x', NULL)"
            )
