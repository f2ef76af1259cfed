"""Message keys for tests that build pkgq's bookkeeping by hand (holds, parked messages, the
inbox, retries): the key events/identity.py derives from a message's id, its first publisher
and the user its body names, which everything on the failure path matches on.

A dead letter filed by tests/support/dead_letters.consumer_dead_letter has no publisher, so its
key uses `unverified` (what `publisher=None` gives here too); a hold or retry that is to be that
letter's must be given the same key. The rows are written through pkgq's own writers
(infra/postgres/holds.py, inbox.py), which know where each table keeps a key."""

from __future__ import annotations

from uuid import UUID

import asyncpg

from events.decoding import RawDelivery
from events.envelope import publisher_of
from events.identity import message_key
from infra.postgres import holds, inbox
from infra.postgres.pool import Conn


def blocker_key(message_id: UUID | str, user_id: UUID | None, publisher: str | None = None) -> UUID:
    """The key of the message `message_id` for `user_id`, first published by `publisher`
    (None: nobody vouched for it, `unverified`)."""
    return message_key(UUID(str(message_id)), publisher, user_id)


def delivery_key(raw: RawDelivery, user_id: UUID | None) -> UUID:
    """The key a consumer knows the delivery `raw` by, its body naming `user_id`."""
    assert raw.message_id is not None
    return blocker_key(raw.message_id, user_id, publisher_of(raw.headers, raw.publisher))


async def hold(
    conn: Conn | asyncpg.Pool,
    consumer: str,
    user_id: UUID,
    message_id: UUID | str,
    state: str = "buried",
    publisher: str | None = None,
    attempts: int = 0,
    error: str = "",
) -> UUID:
    """Hold `user_id` on `consumer` behind the message `message_id` (first published by
    `publisher`) as pkgq holds it: shown by its message_id, matched by its key. Returns the
    key."""
    key = blocker_key(message_id, user_id, publisher)
    blocker = holds.NewHold(user_id, key, state, attempts, error, message_id=UUID(str(message_id)))
    if isinstance(conn, asyncpg.Pool):
        async with conn.acquire() as acquired:
            await holds.hold_many(acquired, consumer, [blocker])
    else:
        await holds.hold_many(conn, consumer, [blocker])
    return key


async def applied(
    conn: Conn,
    consumer: str,
    message_id: UUID | str,
    user_id: UUID | None,
    publisher: str | None = None,
) -> UUID:
    """Record the message in `consumer`'s inbox as applied, as its consumer records it.
    Returns its key."""
    key = blocker_key(message_id, user_id, publisher)
    assert await inbox.claim(conn, consumer, key, UUID(str(message_id)), user_id)
    return key


async def attempts_counted(pool: asyncpg.Pool, consumer: str, key: UUID) -> int | None:
    """How many failures `consumer` counted of the message `key` (None: none): the count is
    kept under the message's key (migration 0022)."""
    async with pool.acquire() as conn:
        found: int | None = await conn.fetchval(
            "SELECT attempts FROM telecom.attempts WHERE consumer = $1 AND message_id = $2",
            consumer,
            key,
        )
    return found
