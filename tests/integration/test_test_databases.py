"""The suite's own machinery: a used test database is handed to another test only if its reset
leaves it exactly as a fresh copy of the template (tests/support/db_state.py)."""

from __future__ import annotations

from collections.abc import AsyncIterator
from uuid import uuid4

import asyncpg
import pytest

from infra.settings import Settings
from tests.support import db_state


@pytest.fixture
async def conn(settings: Settings) -> AsyncIterator[asyncpg.Connection]:
    found = await asyncpg.connect(settings.postgres_dsn)  # the superuser's, as the reset's
    yield found
    await found.close()


async def test_rows_and_used_sequences_are_reset_to_exactly_the_fresh_state(
    conn: asyncpg.Connection,
) -> None:
    fresh = await db_state.reference(conn)
    await conn.execute(
        "INSERT INTO telecom.inbox (consumer, message_id) VALUES ('usage_record', $1)", uuid4()
    )
    await conn.execute("SELECT nextval('telecom.outbox_id_seq')")
    assert await db_state.digest(conn, fresh) != fresh.digest

    assert await db_state.reset(conn, fresh)
    assert await conn.fetchval("SELECT count(*) FROM telecom.inbox") == 0
    assert await conn.fetchval("SELECT nextval('telecom.outbox_id_seq')") == 1


@pytest.mark.parametrize(
    "change",
    [
        "ALTER TABLE telecom.inbox ADD COLUMN note text",
        "CREATE INDEX inbox_note ON telecom.inbox (processed_at, consumer)",
        "REVOKE SELECT ON telecom.inbox FROM PUBLIC; GRANT SELECT ON telecom.inbox TO PUBLIC",
        "ALTER TABLE telecom.inbox SET (fillfactor = 50)",
        "CREATE TABLE public.left_behind (a int)",
        "DROP TRIGGER outbox_count_puts ON telecom.outbox",
        "ANALYZE telecom.schema_migrations",
        "UPDATE telecom.schema_migrations SET name = 'edited' WHERE version = 1",
    ],
)
async def test_a_database_a_test_changed_beyond_its_rows_is_not_reset_but_dropped(
    conn: asyncpg.Connection, change: str
) -> None:
    fresh = await db_state.reference(conn)
    await conn.execute(change)

    assert not await db_state.reset(conn, fresh)
