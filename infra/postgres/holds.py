"""Holds and parked messages: per-user order on a route that survives a failure.

While one of a user's messages on a consumer waits for a retry or lies buried, the hold on
(consumer, user) names it as the blocker, and that user's later messages on the consumer are
parked here in arrival order. When the blocker is applied, replayed and applied, or discarded,
the hold is released (blocker NULL) and the consumer applies the parked messages in order.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any
from uuid import UUID

from infra.postgres.pool import Conn, from_row


@dataclass(frozen=True, slots=True)
class Hold:
    consumer: str
    user_id: UUID
    blocker: UUID | None
    state: str


@dataclass(frozen=True, slots=True)
class ParkedMessage:
    id: int
    message_id: UUID
    route: str
    message_type: str
    body: bytes
    headers: dict[str, Any]


async def lock(conn: Conn, consumer: str, user_id: UUID) -> Hold | None:
    """Inside a transaction: the hold on (consumer, user), locked until the transaction ends."""
    row = await conn.fetchrow(
        "SELECT blocker, state FROM telecom.holds WHERE consumer = $1 AND user_id = $2 FOR UPDATE",
        consumer,
        user_id,
    )
    if row is None:
        return None
    return Hold(consumer, user_id, row["blocker"], row["state"])


async def lock_many(conn: Conn, consumer: str, user_ids: list[UUID]) -> dict[UUID, Hold]:
    """Inside a transaction: the holds on these users, locked in user_id order."""
    rows = await conn.fetch(
        "SELECT user_id, blocker, state FROM telecom.holds "
        "WHERE consumer = $1 AND user_id = ANY($2::uuid[]) ORDER BY user_id FOR UPDATE",
        consumer,
        user_ids,
    )
    return {r["user_id"]: Hold(consumer, r["user_id"], r["blocker"], r["state"]) for r in rows}


async def hold(
    conn: Conn,
    consumer: str,
    user_id: UUID,
    blocker: UUID,
    *,
    state: str,
    attempts: int,
    error: str,
) -> None:
    """Make `blocker` the message the user's later messages on `consumer` wait behind."""
    await conn.execute(
        """
        INSERT INTO telecom.holds (consumer, user_id, blocker, state, attempts, last_error)
        VALUES ($1, $2, $3, $4, $5, $6)
        ON CONFLICT (consumer, user_id) DO UPDATE SET
            blocker = excluded.blocker, state = excluded.state, attempts = excluded.attempts,
            last_error = excluded.last_error, updated_at = now()
        """,
        consumer,
        user_id,
        blocker,
        state,
        attempts,
        error[:2000],
    )


async def lift(conn: Conn, consumer: str, user_id: UUID) -> None:
    """The blocker is done with: its parked messages may now be applied, in order."""
    await conn.execute(
        "UPDATE telecom.holds SET blocker = NULL, state = 'releasing', updated_at = now() "
        "WHERE consumer = $1 AND user_id = $2",
        consumer,
        user_id,
    )


async def release_blocked_by(conn: Conn, message_ids: Sequence[UUID]) -> int:
    """Messages that will never be delivered again (withdrawn by a group cancel, expired before
    their retry was published) block nothing any more: release the holds they block, so that
    the consumers' release poll applies what is parked behind them. Returns how many."""
    if not message_ids:
        return 0
    status = await conn.execute(
        "UPDATE telecom.holds SET blocker = NULL, state = 'releasing', updated_at = now() "
        "WHERE blocker = ANY($1::uuid[])",
        list(message_ids),
    )
    return int(status.split()[-1])


async def release_discarded(conn: Conn, dead_letter_ids: Sequence[int]) -> int:
    """These dead letters were discarded: the holds their messages block on their consumers
    are released, in one statement. Returns how many."""
    return await _held_by(conn, dead_letter_ids, "blocker = NULL, state = 'releasing'")


async def retry_replayed(conn: Conn, dead_letter_ids: Sequence[int]) -> None:
    """These dead letters were replayed: a hold waiting on one waits for its new delivery."""
    await _held_by(conn, dead_letter_ids, "state = 'retrying'")


async def _held_by(conn: Conn, dead_letter_ids: Sequence[int], assignment: str) -> int:
    """Set `assignment` on the holds these dead letters' messages block on their consumers (a
    dead letter whose message_id is not a UUID blocks nothing: its `message_uuid` is NULL)."""
    status = await conn.execute(
        f"""
        UPDATE telecom.holds h SET {assignment}, updated_at = now()
        FROM telecom.dead_letters d
        WHERE d.id = ANY($1::bigint[]) AND h.consumer = d.consumer
          AND h.blocker = d.message_uuid
        """,
        list(dead_letter_ids),
    )
    return int(status.split()[-1])


async def release_expired_retry(conn: Conn, message_id: UUID) -> int:
    """The broker dead-lettered `message_id` as expired: if it is a retry pkgq itself sent with
    a TTL that has run out, it will never come, so the holds it blocks are released. Only then:
    anyone can publish a message that expires on the broker, and its message_id proves nothing.
    Returns how many holds were released."""
    status = await conn.execute(
        """
        UPDATE telecom.holds SET blocker = NULL, state = 'releasing', updated_at = now()
        WHERE blocker = $1
          -- (a minute of slack: the broker's clock ran the TTL, not this one)
          AND EXISTS (SELECT 1 FROM telecom.outbox o
                      WHERE o.message_id = $1 AND o.expires_at <= now() + interval '1 minute')
        """,
        message_id,
    )
    return int(status.split()[-1])


async def drop(conn: Conn, consumer: str, user_id: UUID) -> None:
    await conn.execute(
        "DELETE FROM telecom.holds WHERE consumer = $1 AND user_id = $2", consumer, user_id
    )


async def park(
    conn: Conn,
    consumer: str,
    user_id: UUID,
    message_id: UUID,
    route: str,
    message_type: str,
    body: bytes,
    headers_json: str,
) -> None:
    """Keep a message behind the hold. Parking the same message twice keeps its first place."""
    await conn.execute(
        """
        INSERT INTO telecom.parked
            (consumer, user_id, message_id, route, message_type, body, headers)
        VALUES ($1, $2, $3, $4, $5, $6, $7::text::jsonb)
        ON CONFLICT (consumer, message_id) DO NOTHING
        """,
        consumer,
        user_id,
        message_id,
        route,
        message_type,
        body,
        headers_json,
    )


async def pop_parked(conn: Conn, consumer: str, user_id: UUID) -> ParkedMessage | None:
    """Inside a transaction (holding the hold's lock): take the user's oldest parked message."""
    row = await conn.fetchrow(
        """
        DELETE FROM telecom.parked
        WHERE id = (SELECT min(id) FROM telecom.parked WHERE consumer = $1 AND user_id = $2)
        RETURNING id, message_id, route, message_type, body, headers::text AS headers
        """,
        consumer,
        user_id,
    )
    if row is None:
        return None
    return from_row(ParkedMessage, row, body=bytes(row["body"]), headers=json.loads(row["headers"]))


async def releasing_users(conn: Conn, consumer: str, limit: int = 100) -> list[UUID]:
    """Users whose hold on `consumer` was released but may still have parked messages."""
    rows = await conn.fetch(
        "SELECT user_id FROM telecom.holds WHERE consumer = $1 AND blocker IS NULL "
        "ORDER BY updated_at LIMIT $2",
        consumer,
        limit,
    )
    return [r["user_id"] for r in rows]


async def touch(conn: Conn, consumer: str, user_id: UUID) -> None:
    """Send a released hold to the back of the release line (after a failed release)."""
    await conn.execute(
        "UPDATE telecom.holds SET updated_at = now() WHERE consumer = $1 AND user_id = $2",
        consumer,
        user_id,
    )


async def overview(conn: Conn, limit: int = 100) -> list[dict[str, Any]]:
    """Every hold, oldest first, with how many messages are parked behind it."""
    rows = await conn.fetch(
        """
        SELECT h.consumer, h.user_id, h.blocker, h.state, h.attempts, h.last_error, h.since,
               h.updated_at,
               (SELECT count(*) FROM telecom.parked p
                WHERE p.consumer = h.consumer AND p.user_id = h.user_id) AS parked
        FROM telecom.holds h
        ORDER BY h.since
        LIMIT $1
        """,
        limit,
    )
    return [dict(r) for r in rows]


async def release_hold(conn: Conn, consumer: str, user_id: UUID, blocker: UUID) -> bool:
    """An operator's release of the hold on (consumer, user), matched by both and by the
    blocker the operator was shown (a hold that moved on to another blocker is left alone;
    never by the message_id alone, which another consumer's hold may name too): its blocker is
    dropped and the consumer's release poll applies what is parked behind it, in order.
    Returns whether it was released."""
    status = await conn.execute(
        "UPDATE telecom.holds SET blocker = NULL, state = 'releasing', updated_at = now() "
        "WHERE consumer = $1 AND user_id = $2 AND blocker = $3",
        consumer,
        user_id,
        blocker,
    )
    return status.endswith(" 1")
