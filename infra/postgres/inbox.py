"""The inbox: which messages each consumer has already applied."""

from __future__ import annotations

from collections.abc import Mapping
from uuid import UUID

from infra.postgres.compound import Part
from infra.postgres.pool import Conn
from infra.postgres.pruning import Rule

RETENTION = Rule("inbox", "telecom.inbox", "ctid", "processed_at < {cutoff}", "consumer")
"""Processed messages past retention (counted as their route's `delete` transition)."""


async def claim(conn: Conn, consumer: str, message_id: UUID) -> bool:
    """Record the message as applied by `consumer`. False: it was applied before (a duplicate)."""
    inserted = await conn.fetchval(
        "INSERT INTO telecom.inbox (consumer, message_id) VALUES ($1, $2) "
        "ON CONFLICT DO NOTHING RETURNING true",
        consumer,
        message_id,
    )
    return bool(inserted)


def claim_many(consumer: str, messages: Mapping[UUID, UUID | None]) -> Part[int] | None:
    """Claim messages (message_id -> its user): a part of the batch's write statement
    (infra/postgres/compound.py), None when there are none. Its value is how many were claimed
    now (not applied before): the caller knows which it asked for, so only a shortfall, which
    means another transaction claimed some meanwhile, needs telling. The user is kept with the
    message (a user's timeline reads it).

    The same part marks `superseded` every dead letter of the consumer for a message it
    claims, for the same user, whatever its status (buried; replayed or discarded, which a
    forced replay would otherwise send again): such a dead letter is never replayed, however
    long after the inbox forgets the message (infra/postgres/replay.py). Another user's message
    under the same message_id supersedes nothing of this user's."""
    if not messages:
        return None
    return Part(
        (
            (
                "inbox_claimed",
                """
                INSERT INTO telecom.inbox (consumer, message_id, user_id)
                SELECT $1, m, u FROM unnest($2::uuid[], $3::uuid[]) AS y(m, u)
                ON CONFLICT DO NOTHING RETURNING message_id
                """,
            ),
            (
                "inbox_superseded",
                """
                UPDATE telecom.dead_letters d SET status = 'superseded', superseded_at = now()
                FROM unnest($2::uuid[], $3::uuid[]) AS x(m, u)
                WHERE d.status <> 'superseded' AND d.consumer = $1
                  AND d.message_uuid = x.m AND d.user_id IS NOT DISTINCT FROM x.u
                  AND x.m IN (SELECT message_id FROM inbox_claimed)
                """,
            ),
        ),
        (consumer, list(messages), list(messages.values())),
        # dead_letter_counts: what the dead letters' triggers write
        frozenset({"inbox", "dead_letters", "dead_letter_counts"}),
        "(SELECT count(*) FROM inbox_claimed)",
        int,
    )


async def seen_many(conn: Conn, consumer: str, message_ids: list[UUID]) -> set[UUID]:
    """Which of the messages `consumer` has applied already: one statement for a batch."""
    rows = await conn.fetch(
        "SELECT message_id FROM telecom.inbox WHERE consumer = $1 AND message_id = ANY($2::uuid[])",
        consumer,
        message_ids,
    )
    return {r["message_id"] for r in rows}


async def seen(conn: Conn, consumer: str, message_id: UUID) -> bool:
    """Whether `consumer` has applied the message already (without claiming it)."""
    found = await conn.fetchval(
        "SELECT true FROM telecom.inbox WHERE consumer = $1 AND message_id = $2",
        consumer,
        message_id,
    )
    return bool(found)
