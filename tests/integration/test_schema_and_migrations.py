"""The database refuses what the domain forbids, and migrations are idempotent."""

from __future__ import annotations

from uuid import uuid4

import asyncpg
import pytest

from infra.postgres.migrate import available_migrations, migrate
from infra.postgres.pool import Conn
from infra.settings import Settings
from tests.support.deliveries import add_package


async def _insert_item(conn: Conn, user: object, package: int, status: str) -> None:
    await conn.execute(
        "INSERT INTO telecom.package_queue (user_id, package_id, status) "
        "VALUES ($1, $2, $3::telecom.package_status)",
        user,
        package,
        status,
    )


async def test_partial_unique_index_refuses_a_second_active_item_for_a_user(
    pool: asyncpg.Pool,
) -> None:
    package = await add_package(pool, 1000)
    user = uuid4()
    async with pool.acquire() as conn:
        await _insert_item(conn, user, package, "active")
        with pytest.raises(asyncpg.UniqueViolationError, match="package_queue_one_active"):
            await _insert_item(conn, user, package, "active")


async def test_partial_unique_index_allows_one_active_item_per_user_and_many_consumed(
    pool: asyncpg.Pool,
) -> None:
    package = await add_package(pool, 1000)
    first, second = uuid4(), uuid4()
    async with pool.acquire() as conn:
        await _insert_item(conn, first, package, "active")
        await _insert_item(conn, second, package, "active")
        for _ in range(3):
            await _insert_item(conn, first, package, "consumed")
        count = await conn.fetchval("SELECT count(*) FROM telecom.package_queue")
    assert count == 5


async def test_package_queue_has_its_lookup_indexes_and_one_active_item_per_user(
    pool: asyncpg.Pool,
) -> None:
    async with pool.acquire() as conn:
        rows = await conn.fetch(
            "SELECT indexdef FROM pg_indexes WHERE schemaname = 'telecom' "
            "AND tablename = 'package_queue'"
        )
    defs = " | ".join(r["indexdef"] for r in rows)
    assert "(user_id, status)" in defs
    assert "(user_id, status, created_at)" in defs
    assert "(package_id)" in defs
    assert "UNIQUE INDEX package_queue_one_active" in defs


async def test_migrate_twice_applies_nothing_the_second_time(settings: Settings) -> None:
    conn = await asyncpg.connect(settings.postgres_dsn)
    try:
        assert await migrate(conn) == []  # the template was migrated already
        recorded = await conn.fetchval("SELECT count(*) FROM telecom.schema_migrations")
    finally:
        await conn.close()
    assert recorded == len(available_migrations())


async def test_migrate_builds_the_schema_on_an_empty_database(settings: Settings) -> None:
    conn = await asyncpg.connect(settings.postgres_dsn)
    try:
        await conn.execute("DROP SCHEMA telecom CASCADE")
        applied = await migrate(conn)
        tables = await conn.fetchval(
            "SELECT count(*) FROM information_schema.tables WHERE table_schema = 'telecom'"
        )
    finally:
        await conn.close()
    assert applied == [m.version for m in available_migrations()]
    assert tables >= 7
