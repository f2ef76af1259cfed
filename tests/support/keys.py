"""Message keys for tests that build pkgq's bookkeeping by hand (holds, parked messages, the
inbox, attempts, retries): the key events/identity.py derives from a message's id, its first
publisher and the user its body names, which everything on the failure path matches on.

A dead letter filed by tests/support/dead_letters.consumer_dead_letter has no publisher, so its
key uses `unverified` (what `publisher=None` gives here too); a hold or retry that is to be that
letter's must be given the same key."""

from __future__ import annotations

from uuid import UUID

import asyncpg

from events.decoding import RawDelivery
from events.envelope import publisher_of
from events.identity import message_key


def blocker_key(message_id: UUID | str, user_id: UUID | None, publisher: str | None = None) -> UUID:
    """The key of the message `message_id` for `user_id`, first published by `publisher`
    (None: nobody vouched for it, `unverified`)."""
    return message_key(UUID(str(message_id)), publisher, user_id)


def delivery_key(raw: RawDelivery, user_id: UUID | None) -> UUID:
    """The key a consumer knows the delivery `raw` by, its body naming `user_id`."""
    assert raw.message_id is not None
    return blocker_key(raw.message_id, user_id, publisher_of(raw.headers, raw.publisher))


async def hold(
    conn: asyncpg.Connection | asyncpg.Pool,
    consumer: str,
    user_id: UUID,
    message_id: UUID | str,
    state: str = "buried",
    publisher: str | None = None,
    attempts: int = 0,
) -> UUID:
    """Hold `user_id` on `consumer` behind the message `message_id` (first published by
    `publisher`) as pkgq holds it: its message_id as `blocker`, its key as `blocker_key`.
    Returns the key."""
    key = blocker_key(message_id, user_id, publisher)
    await conn.execute(
        "INSERT INTO telecom.holds (consumer, user_id, blocker, blocker_key, state, attempts) "
        "VALUES ($1, $2, $3, $4, $5, $6)",
        consumer,
        user_id,
        UUID(str(message_id)),
        key,
        state,
        attempts,
    )
    return key
