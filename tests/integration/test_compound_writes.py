"""A batch's writes gathered into few statements (infra/postgres/compound.py), against Postgres:
parts on different tables share one statement; a part on a table an earlier part touched goes
after it and sees its write; a failing part takes the whole statement down with it."""

from __future__ import annotations

from uuid import uuid4

import asyncpg
import pytest

from devtools.postgres.statements import StatementLog
from infra.postgres import batch_write, compound
from infra.settings import Settings


async def _sent(log: StatementLog) -> int:
    """The statements the test's code sent: not asyncpg's own look-ups of the array types a
    fresh connection meets for the first time (and the jit setting around them)."""
    await log.settled()
    return sum(1 for s in log.statements if "typeinfo" not in s and "'jit'" not in s)


async def test_parts_on_different_tables_go_as_one_statement_and_each_gives_its_value(
    counted: tuple[asyncpg.Pool, StatementLog],
) -> None:
    pool, log = counted
    user, message = uuid4(), uuid4()
    async with pool.acquire() as conn, conn.transaction():
        await log.settled()
        log.clear()
        batch = compound.Batch(conn)
        granted_part, _ = batch_write.write_access(
            {user: batch_write.Change(user, seq=1, item_id=7, package_id=1)}, {}
        )
        claimed = await batch.add(
            batch_write.claim_many("usage_record", {message: batch_write.Claim(message, user)})
        )
        granted = await batch.add(granted_part)
        await batch.send()
        assert await _sent(log) == 1
        assert batch.statements == 1
        assert claimed.get() == 1
        assert granted.get() == {user}
        row = await conn.fetchrow(
            "SELECT item_id, granted FROM telecom.access WHERE user_id = $1", user
        )
        assert row is not None
        assert (row["item_id"], row["granted"]) == (7, True)
        assert (
            await conn.fetchval("SELECT count(*) FROM telecom.inbox WHERE message_id = $1", message)
            == 1
        )


async def test_a_part_on_a_table_an_earlier_part_wrote_goes_after_it_and_sees_that_write(
    counted: tuple[asyncpg.Pool, StatementLog],
) -> None:
    pool, log = counted
    user = uuid4()
    async with pool.acquire() as conn, conn.transaction():
        await log.settled()
        log.clear()
        batch = compound.Batch(conn)
        # A grant and the traffic then billed on the granted item, in one batch: in one
        # statement the update would not see the row the grant inserts and would change nothing.
        grant, remaining = batch_write.write_access(
            {user: batch_write.Change(user, seq=1, item_id=7, package_id=1, remaining=100)},
            {(user, 7): 60},
        )
        await batch.add(grant)
        await batch.add(remaining)
        await batch.send()
        assert batch.statements == 2
        assert await _sent(log) == 2
        assert (
            await conn.fetchval("SELECT remaining FROM telecom.access WHERE user_id = $1", user)
            == 60
        )


async def test_a_failing_part_fails_its_statement_and_undoes_the_parts_sent_with_it(
    settings: Settings,
) -> None:
    conn = await asyncpg.connect(settings.postgres_dsn)
    try:
        user, message = uuid4(), uuid4()
        batch = compound.Batch(conn)  # no transaction: the statement alone is atomic
        await batch.add(
            batch_write.claim_many("usage_record", {message: batch_write.Claim(message, user)})
        )
        await batch.add(
            compound.part_of(
                "INSERT INTO telecom.access (user_id, granted, seq) VALUES ($1, NULL, 1)",
                (user,),
                ("access",),
                name="access_broken",
            )
        )
        with pytest.raises(asyncpg.NotNullViolationError):
            await batch.send()
        assert (
            await conn.fetchval("SELECT count(*) FROM telecom.inbox WHERE message_id = $1", message)
            == 0
        )
    finally:
        await conn.close()
