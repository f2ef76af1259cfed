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

from domain.delivery import Hold
from events.envelope import clean_text
from infra.postgres.pool import Conn, from_row, in_uuid_order

HOLD_KEY = "telecom.blocker_key(h.consumer, h.user_id, h.blocker, h.blocker_key, h.blocker_key_of)"
"""The key (events/identity.py) of hold `h`'s blocker (migration 0022): what every release
matches, never the blocker's message_id alone."""


@dataclass(frozen=True, slots=True)
class NewHold:
    """A hold as a batch leaves it: `blocker` (the blocker's key, events/identity.py) None and
    state `releasing` when lifted. `message_id`: the blocker's, as people see it."""

    user_id: UUID
    blocker: UUID | None
    state: str
    attempts: int = 0
    error: str = ""
    message_id: UUID | None = None


@dataclass(frozen=True, slots=True)
class NewParked:
    user_id: UUID
    message_id: UUID
    key: UUID
    """The message's key (events/identity.py): a message is parked once, by its key (kept in
    the row's `message_id`, the message_id in `sent_as`: migration 0022)."""
    route: str
    message_type: str
    body: bytes
    headers: dict[str, Any]
    """JSON-ready (events.envelope.jsonable)."""


@dataclass(frozen=True, slots=True)
class ParkedMessage(NewParked):
    """A parked message as stored: its place in its user's line is `id`."""

    id: int = 0


async def lock_many(conn: Conn, consumer: str, user_ids: Sequence[UUID]) -> dict[UUID, Hold]:
    """Inside a transaction: the holds on these users, locked in user_id order. The batch's
    user rows are locked first (the lock order of every writer of holds: user, then hold)."""
    if not user_ids:
        return {}
    rows = await conn.fetch(
        f"SELECT h.user_id, {HOLD_KEY} AS blocker_key, h.state FROM telecom.holds h "
        "WHERE h.consumer = $1 AND h.user_id = ANY($2::uuid[]) ORDER BY h.user_id FOR UPDATE",
        consumer,
        in_uuid_order(user_ids),
    )
    return {r["user_id"]: Hold(r["blocker_key"], r["state"]) for r in rows}


async def hold_many(conn: Conn, consumer: str, holds: Sequence[NewHold]) -> None:
    """Make each hold's blocker the message its user's later messages on `consumer` wait
    behind (or lift it: blocker None), in one statement."""
    if not holds:
        return
    await conn.execute(
        """
        INSERT INTO telecom.holds
            (consumer, user_id, blocker_key, state, attempts, last_error, blocker, blocker_key_of)
        SELECT $1, u, k, s, a, e, m, m
        FROM unnest($2::uuid[], $3::uuid[], $4::text[], $5::int[], $6::text[], $7::uuid[])
             AS h(u, k, s, a, e, m)
        ON CONFLICT (consumer, user_id) DO UPDATE SET
            blocker_key = excluded.blocker_key, blocker = excluded.blocker,
            blocker_key_of = excluded.blocker_key_of,
            state = excluded.state, attempts = excluded.attempts,
            last_error = excluded.last_error, updated_at = now()
        """,
        consumer,
        [h.user_id for h in holds],
        [h.blocker for h in holds],
        [h.state for h in holds],
        [max(0, min(h.attempts, 2**31 - 1)) for h in holds],
        [clean_text(h.error[:2000]) for h in holds],
        [(h.message_id or h.blocker) if h.blocker is not None else None for h in holds],
    )


async def drop_lifted(conn: Conn, consumer: str, user_ids: Sequence[UUID]) -> list[UUID]:
    """These users' holds are lifted: a hold with nothing parked behind it is dropped, the
    others wait for the drain (`releasing`). Returns the users whose parked messages may go."""
    if not user_ids:
        return []
    rows = await conn.fetch(
        """
        WITH lifted AS (
            SELECT h.user_id, EXISTS (SELECT 1 FROM telecom.parked p
                                      WHERE p.consumer = h.consumer AND p.user_id = h.user_id)
                              AS parked
            FROM telecom.holds h
            WHERE h.consumer = $1 AND h.user_id = ANY($2::uuid[])
        ), dropped AS (
            DELETE FROM telecom.holds h USING lifted l
            WHERE h.consumer = $1 AND h.user_id = l.user_id AND NOT l.parked
        )
        UPDATE telecom.holds h
        SET blocker = NULL, blocker_key = NULL, state = 'releasing', updated_at = now()
        FROM lifted l
        WHERE h.consumer = $1 AND h.user_id = l.user_id AND l.parked
        RETURNING h.user_id
        """,
        consumer,
        in_uuid_order(user_ids),
    )
    return [r["user_id"] for r in rows]


@dataclass(frozen=True, slots=True)
class Blocker:
    """A hold as what it is: the message `key` (events/identity.py: message_id, first
    publisher, user) on `consumer`. A hold is released by its own blocker only, never by a
    message_id alone: anyone can publish a message under an id they know, for another user,
    on another route or as another publisher."""

    consumer: str
    user_id: UUID
    key: UUID


def blocker_of_retry(cancel_key: str, user_id: UUID) -> Blocker:
    """The blocker a pending retry of `user_id`'s is, from its cancel key (outbox.retry_key)."""
    _, consumer, key = cancel_key.split(":", 2)
    return Blocker(consumer, user_id, UUID(key))


async def release_blocked_by(conn: Conn, blockers: Sequence[Blocker]) -> int:
    """Messages that will never be delivered again (withdrawn by a group cancel, expired before
    their retry was published) block nothing any more: release the holds they are, each on its
    own consumer and user, so that the consumers' release poll applies what is parked behind
    them. Returns how many."""
    if not blockers:
        return 0
    status = await conn.execute(
        f"""
        UPDATE telecom.holds h
        SET blocker = NULL, blocker_key = NULL, state = 'releasing', updated_at = now()
        FROM unnest($1::text[], $2::uuid[], $3::uuid[]) AS b(consumer, user_id, key)
        WHERE h.consumer = b.consumer AND h.user_id = b.user_id AND h.blocker IS NOT NULL
          AND {HOLD_KEY} = b.key
        """,
        [b.consumer for b in blockers],
        [b.user_id for b in blockers],
        [b.key for b in blockers],
    )
    return int(status.split()[-1])


async def release_discarded(conn: Conn, dead_letter_ids: Sequence[int]) -> int:
    """These dead letters were discarded: the holds their messages are (on the dead letter's
    consumer, for its user) are released, in one statement. Returns how many."""
    return await _held_by(
        conn, dead_letter_ids, "blocker = NULL, blocker_key = NULL, state = 'releasing'"
    )


async def retry_replayed(conn: Conn, dead_letter_ids: Sequence[int]) -> None:
    """These dead letters were replayed: a hold waiting on one waits for its new delivery."""
    await _held_by(conn, dead_letter_ids, "state = 'retrying'")


async def _held_by(conn: Conn, dead_letter_ids: Sequence[int], assignment: str) -> int:
    """Set `assignment` on the holds these dead letters' messages are: on the dead letter's
    consumer, for its user, with its message (by key) as the blocker (a dead letter without a
    user, or whose message_id is not a UUID, is no hold: its `user_id` or key is NULL)."""
    status = await conn.execute(
        f"""
        UPDATE telecom.holds h SET {assignment}, updated_at = now()
        FROM telecom.dead_letters d
        WHERE d.id = ANY($1::bigint[]) AND h.consumer = d.consumer AND h.user_id = d.user_id
          AND {HOLD_KEY} = d.message_key
        """,
        list(dead_letter_ids),
    )
    return int(status.split()[-1])


async def release_expired_retry(conn: Conn, message_id: UUID) -> int:
    """The broker dead-lettered `message_id` as expired: if it is a retry pkgq itself sent with
    a TTL that has run out, it will never come, so the hold it is released: the one on the
    retry's own route's consumer (a consumer is named after its route), user and key. Only then:
    anyone can publish a message that expires on the broker, and its message_id proves nothing.
    Returns how many holds were released."""
    status = await conn.execute(
        f"""
        UPDATE telecom.holds h
        SET blocker = NULL, blocker_key = NULL, state = 'releasing', updated_at = now()
        FROM telecom.outbox o
        WHERE o.message_id = $1 AND h.user_id = o.user_id AND o.route = 'telecom.' || h.consumer
          -- the retry of the very message the hold waits on (its key: events/identity.py)
          AND o.cancel_key = 'retry:' || h.consumer || ':' || {HOLD_KEY}::text
          -- (a minute of slack: the broker's clock ran the TTL, not this one)
          AND o.expires_at <= now() + interval '1 minute'
        """,
        message_id,
    )
    return int(status.split()[-1])


async def park_many(conn: Conn, consumer: str, parked: Sequence[NewParked]) -> None:
    """Keep messages behind their users' holds, in the given order. Parking the same message
    twice keeps its first place."""
    if not parked:
        return
    await conn.execute(
        """
        INSERT INTO telecom.parked
            (consumer, user_id, sent_as, route, message_type, body, headers, message_id)
        SELECT $1, u, m, r, t, b, h::jsonb, k
        FROM unnest($2::uuid[], $3::uuid[], $4::text[], $5::text[], $6::bytea[], $7::text[],
                    $8::uuid[])
             WITH ORDINALITY AS p(u, m, r, t, b, h, k, ord)
        ORDER BY ord
        ON CONFLICT (consumer, message_id) DO NOTHING
        """,
        consumer,
        [p.user_id for p in parked],
        [p.message_id for p in parked],
        [p.route for p in parked],
        [p.message_type for p in parked],
        [p.body for p in parked],
        [json.dumps(p.headers) for p in parked],
        [p.key for p in parked],
    )


async def first_parked(
    conn: Conn, consumer: str, user_ids: Sequence[UUID], per_user: int
) -> list[ParkedMessage]:
    """The first `per_user` parked messages of each of these users, in arrival order (read
    without a lock: the drain's transaction locks them with `lock_parked`)."""
    if not user_ids:
        return []
    rows = await conn.fetch(
        """
        SELECT p.id, p.user_id, coalesce(p.sent_as, p.message_id) AS message_id,
               p.message_id AS key, p.route, p.message_type, p.body, p.headers::text AS headers
        FROM unnest($2::uuid[]) AS u(user_id)
        CROSS JOIN LATERAL (
            SELECT * FROM telecom.parked p
            WHERE p.consumer = $1 AND p.user_id = u.user_id ORDER BY p.id LIMIT $3
        ) p
        ORDER BY p.id
        """,
        consumer,
        in_uuid_order(user_ids),
        per_user,
    )
    return [
        from_row(ParkedMessage, r, body=bytes(r["body"]), headers=json.loads(r["headers"]))
        for r in rows
    ]


async def lock_parked(conn: Conn, consumer: str, ids: Sequence[int]) -> set[int]:
    """Inside a transaction, after the users' holds: lock these parked rows; returns those
    still parked (another drain may have applied some meanwhile). A parked message is its row:
    never found by a message_id, which another publisher's copy may share."""
    if not ids:
        return set()
    rows = await conn.fetch(
        "SELECT id FROM telecom.parked WHERE consumer = $1 AND id = ANY($2::bigint[]) "
        "ORDER BY id FOR UPDATE",
        consumer,
        list(ids),
    )
    return {r["id"] for r in rows}


async def unpark(conn: Conn, consumer: str, ids: Sequence[int]) -> None:
    """These parked rows were decided (applied, buried, ...): they leave the lot."""
    if ids:
        await conn.execute(
            "DELETE FROM telecom.parked WHERE consumer = $1 AND id = ANY($2::bigint[])",
            consumer,
            list(ids),
        )


async def releasing_users(conn: Conn, consumer: str, limit: int = 100) -> list[UUID]:
    """Users whose hold on `consumer` was released but may still have parked messages."""
    rows = await conn.fetch(
        "SELECT user_id FROM telecom.holds WHERE consumer = $1 AND blocker IS NULL "
        "ORDER BY updated_at LIMIT $2",
        consumer,
        limit,
    )
    return [r["user_id"] for r in rows]


async def touch(conn: Conn, consumer: str, user_ids: Sequence[UUID]) -> None:
    """Send released holds to the back of the release line (after a failed release)."""
    await conn.execute(
        "UPDATE telecom.holds SET updated_at = now() "
        "WHERE consumer = $1 AND user_id = ANY($2::uuid[])",
        consumer,
        list(user_ids),
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
        "UPDATE telecom.holds SET blocker = NULL, blocker_key = NULL, state = 'releasing', "
        "updated_at = now() WHERE consumer = $1 AND user_id = $2 AND blocker = $3",
        consumer,
        user_id,
        blocker,
    )
    return status.endswith(" 1")
