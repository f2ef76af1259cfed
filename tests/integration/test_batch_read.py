"""The batch's one read under its users' locks (infra/postgres/batch_read.py): holds, the
messages' inbox and attempt states, and items come back as one statement's rows, each kind
read right, and the holds stay locked until the transaction ends."""

from __future__ import annotations

from uuid import uuid4

import asyncpg
import pytest

from devtools.postgres.statements import StatementLog
from domain.delivery import Hold
from domain.model import ItemStatus
from infra.postgres import attempts, batch_read, holds, inbox
from infra.postgres.compound import run
from tests.support.queue_items import queue_of

CONSUMER = "telecom.usage_record"


async def test_holds_states_and_items_of_a_batch_come_back_from_one_statement(
    pool: asyncpg.Pool,
) -> None:
    held_user, plain_user, stranger = uuid4(), uuid4(), uuid4()
    blocker, applied, failed, fresh = uuid4(), uuid4(), uuid4(), uuid4()
    items = await queue_of(pool, plain_user, 6)  # 2 consumed or cancelled, 1 active, 3 queued
    gone = items[0]
    async with pool.acquire() as conn:
        await holds.hold_many(
            conn,
            CONSUMER,
            [
                holds.NewHold(held_user, blocker, "retrying", 2, "boom"),
                holds.NewHold(stranger, uuid4(), "buried", 1, "not in this batch"),
            ],
        )
        await inbox.claim(conn, CONSUMER, applied, applied)
        await run(conn, attempts.add_many(CONSUMER, {(failed, failed): 3, (applied, applied): 1}))
        # Once before counting: the connection's first use introspects the result's types.
        await batch_read.read_locked(conn, CONSUMER, hold_users=[], keys=[], item_users=[stranger])
        log = StatementLog()
        conn.add_query_logger(log)
        async with conn.transaction():
            read = await batch_read.read_locked(
                conn,
                CONSUMER,
                hold_users=[plain_user, held_user],
                keys=[(m, m) for m in (blocker, applied, failed, fresh, applied)],
                item_users=[plain_user, held_user],
                extra_item_ids=[gone],
            )
        conn.remove_query_logger(log)
    assert len(log.statements) == 3  # BEGIN, the read, COMMIT
    assert read.held == {held_user: Hold(blocker, "retrying")}
    assert read.seen == {applied}
    assert read.counted == {failed: 3, applied: 1}
    loaded = read.items[plain_user]
    assert {i.id for i in loaded} == {gone, *items[2:]}  # the live ones and the one asked for
    assert sum(i.status is ItemStatus.ACTIVE for i in loaded) == 1
    assert held_user not in read.items


async def test_a_batch_with_nothing_to_read_sends_no_statement(pool: asyncpg.Pool) -> None:
    async with pool.acquire() as conn:
        log = StatementLog()
        conn.add_query_logger(log)
        read = await batch_read.read_locked(conn, CONSUMER, hold_users=[], keys=[], item_users=[])
        conn.remove_query_logger(log)
    assert log.statements == []
    assert (read.held, read.seen, read.counted, read.items) == ({}, set(), {}, {})


async def test_the_holds_read_stay_locked_until_the_batch_commits(pool: asyncpg.Pool) -> None:
    user = uuid4()
    async with pool.acquire() as conn:
        await holds.hold_many(conn, CONSUMER, [holds.NewHold(user, uuid4(), "retrying", 1, "x")])
    async with pool.acquire() as batch, pool.acquire() as other:
        async with batch.transaction():
            read = await batch_read.read_locked(
                batch, CONSUMER, hold_users=[user], keys=[(k, k) for k in [uuid4()]], item_users=[]
            )
            assert user in read.held
            with pytest.raises(asyncpg.LockNotAvailableError):
                await other.execute(
                    "SELECT 1 FROM telecom.holds WHERE consumer = $1 AND user_id = $2 "
                    "FOR UPDATE NOWAIT",
                    CONSUMER,
                    user,
                )
        # committed: the lock is gone
        unlocked = await other.fetch(
            "SELECT user_id FROM telecom.holds WHERE consumer = $1 AND user_id = $2 "
            "FOR UPDATE NOWAIT",
            CONSUMER,
            user,
        )
        assert [r["user_id"] for r in unlocked] == [user]
