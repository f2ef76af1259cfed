"""Discarding a buried dead letter releases the hold its message is: on its own consumer, for
its own user only, and none when its message_id is not a UUID (a blocker always is one). A
message_id in any form Python reads as that UUID (capitals, no hyphens, braces) names the same
blocker, in the list's held-back count, in purge's guard, in a replay's retry and in discard."""

from __future__ import annotations

from collections.abc import Callable
from datetime import timedelta
from uuid import UUID, uuid4

import asyncpg
import pytest

from infra.postgres import dead_letters, holds
from infra.postgres.pool import Conn
from tests.support.dead_letters import consumer_dead_letter
from tests.support.keys import blocker_key, hold

CONSUMER = "usage_record"


async def _hold(conn: Conn, consumer: str, blocker: UUID, user: UUID | None = None) -> UUID:
    """A hold on `consumer` behind the message `blocker` of `user` (a new one by default), by
    its key as _bury's letters have it (no publisher vouched for them)."""
    user = user or uuid4()
    await hold(conn, consumer, user, blocker)
    return user


async def _bury(conn: Conn, consumer: str, message_id: str | None, user: UUID | None) -> int:
    """Filed as pkgq files it (dead_letters.bury parses the message_id once, as decoding does)."""
    dead = consumer_dead_letter(
        consumer=consumer,
        message_id=message_id,
        user_id=user,
        body=str(uuid4()).encode(),  # a key of its own for the id-less ones
    )
    return await dead_letters.bury(conn, dead)


async def _discard(pool: asyncpg.Pool, dead_id: int) -> int:
    async with pool.acquire() as conn, conn.transaction():
        return await dead_letters.discard(conn, [dead_id], "ops-test")


async def _blockers(pool: asyncpg.Pool, users: list[UUID]) -> list[UUID | None]:
    async with pool.acquire() as conn:
        rows = await conn.fetch(
            "SELECT user_id, blocker FROM telecom.holds WHERE user_id = ANY($1::uuid[])", users
        )
    by_user = {r["user_id"]: r["blocker"] for r in rows}
    return [by_user[u] for u in users]


@pytest.mark.parametrize("message_id", ["not-a-uuid", "", "1234", None])
async def test_discarding_a_dead_letter_whose_message_id_is_not_a_uuid_releases_nothing(
    pool: asyncpg.Pool, message_id: str | None
) -> None:
    blocker = uuid4()
    async with pool.acquire() as conn:
        held = await _hold(conn, CONSUMER, blocker)
        dead_id = await _bury(conn, CONSUMER, message_id, held)
    assert await _discard(pool, dead_id) == 1  # no error: the letter is discarded
    async with pool.acquire() as conn:
        status = await conn.fetchval(
            "SELECT status::text FROM telecom.dead_letters WHERE id = $1", dead_id
        )
    assert status == "discarded"
    assert await _blockers(pool, [held]) == [blocker]  # the hold still waits on its blocker


async def test_discarding_a_dead_letter_releases_the_hold_it_is_on_its_consumer_and_user_only(
    pool: asyncpg.Pool,
) -> None:
    blocker, other = uuid4(), uuid4()
    async with pool.acquire() as conn:
        mine = await _hold(conn, CONSUMER, blocker)
        # the same id: on another consumer (another user's hold, and this user's), and on this
        # consumer for another user
        elsewhere = await _hold(conn, "package_purchase", blocker, uuid4())
        await _hold(conn, "package_purchase", blocker, mine)
        theirs = await _hold(conn, CONSUMER, blocker)
        unrelated = await _hold(conn, CONSUMER, other)
        dead_id = await _bury(conn, CONSUMER, str(blocker), mine)
    assert await _discard(pool, dead_id) == 1
    async with pool.acquire() as conn:
        rows = await conn.fetch("SELECT consumer, user_id, blocker FROM telecom.holds")
    assert {(r["consumer"], r["user_id"]): r["blocker"] for r in rows} == {
        (CONSUMER, mine): None,
        ("package_purchase", mine): blocker,
        ("package_purchase", elsewhere): blocker,
        (CONSUMER, theirs): blocker,
        (CONSUMER, unrelated): other,
    }


@pytest.mark.parametrize(
    "spelled", [str.upper, lambda text: text.replace("-", ""), lambda text: f"{{{text}}}"]
)
async def test_a_dead_letter_whose_message_id_is_spelled_otherwise_still_names_its_blocker(
    pool: asyncpg.Pool, spelled: Callable[[str], str]
) -> None:
    blocker = uuid4()
    async with pool.acquire() as conn:
        held = await _hold(conn, CONSUMER, blocker)
        parked = uuid4()
        await holds.park_many(
            conn,
            CONSUMER,
            [
                holds.NewParked(
                    held,
                    parked,
                    blocker_key(parked, held),
                    "telecom.usage_record",
                    "RecordUsage",
                    b"{}",
                    {},
                )
            ],
        )
        dead_id = await _bury(conn, CONSUMER, spelled(str(blocker)), held)
        listed = await dead_letters.get(conn, dead_id)
    assert listed is not None
    assert listed["held_back"] == 1  # the parked message behind it is counted
    assert await _discard(pool, dead_id) == 1
    assert await _blockers(pool, [held]) == [None]  # and released when it is discarded


async def test_a_replayed_dead_letter_whose_id_is_in_capitals_is_not_purged_while_it_holds(
    pool: asyncpg.Pool,
) -> None:
    blocker = uuid4()
    async with pool.acquire() as conn, conn.transaction():
        held = await _hold(conn, CONSUMER, blocker)
        dead_id = await _bury(conn, CONSUMER, str(blocker).upper(), held)
        await dead_letters.mark_replayed(conn, [dead_id], "ops-test")
        await holds.retry_replayed(conn, [dead_id])
        await conn.execute(
            "UPDATE telecom.dead_letters SET replayed_at = now() - interval '2 days', "
            "last_failed_at = now() - interval '2 days' WHERE id = $1",
            dead_id,
        )
        state = await conn.fetchval("SELECT state FROM telecom.holds WHERE user_id = $1", held)
        purged = await dead_letters.purge(conn, timedelta(days=1))
    assert state == "retrying"  # the replay's retry found the hold by its blocker
    assert purged == 0  # and purge keeps the letter while its message holds the user back
