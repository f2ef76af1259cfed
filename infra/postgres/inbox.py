"""The inbox: which messages each consumer has already applied.

A message is recorded by its key (events/identity.py: its message_id, first publisher and the
user its body names), kept in `message_id`, with the message_id it was sent under in `sent_as`
(migration 0022). A row whose `sent_as` is NULL was written before keys, by its message_id:
the batch's read still counts it (infra/postgres/batch_read.py)."""

from __future__ import annotations

from collections.abc import Mapping
from typing import NamedTuple
from uuid import UUID

from infra.postgres.compound import Part
from infra.postgres.pool import Conn
from infra.postgres.pruning import Rule

RETENTION = Rule("inbox", "telecom.inbox", "ctid", "processed_at < {cutoff}", "consumer")
"""Processed messages past retention (counted as their route's `delete` transition)."""


async def claim(
    conn: Conn, consumer: str, key: UUID, message_id: UUID, user_id: UUID | None = None
) -> bool:
    """Record the message (its key: events/identity.py) as applied by `consumer`. False: it
    was applied before (a duplicate)."""
    inserted = await conn.fetchval(
        "INSERT INTO telecom.inbox (consumer, message_id, sent_as, user_id) "
        "VALUES ($1, $2, $3, $4) ON CONFLICT DO NOTHING RETURNING true",
        consumer,
        key,
        message_id,
        user_id,
    )
    return bool(inserted)


class Claim(NamedTuple):
    """A message recorded as applied: its key (events/identity.py), the message_id people
    see, and the user its body names."""

    message_id: UUID
    user_id: UUID | None


def claim_many(consumer: str, messages: Mapping[UUID, Claim]) -> Part[int] | None:
    """Claim messages (their key -> what it is): a part of the batch's write statement
    (infra/postgres/compound.py), None when there are none. Its value is how many were claimed
    now (not applied before): the caller knows which it asked for, so only a shortfall, which
    means another transaction claimed some meanwhile, needs telling. The user is kept with the
    message (a user's timeline reads it).

    The same part marks `superseded` every dead letter of the consumer for a message it
    claims, by its key, whatever its status (buried; replayed or discarded, which a forced
    replay would otherwise send again): such a dead letter is never replayed, however long
    after the inbox forgets the message (infra/postgres/replay.py). Another publisher's or
    another user's message under the same message_id has another key: it supersedes nothing."""
    if not messages:
        return None
    return Part(
        (
            (
                "inbox_claimed",
                """
                INSERT INTO telecom.inbox (consumer, message_id, sent_as, user_id)
                SELECT $1, k, m, u FROM unnest($2::uuid[], $3::uuid[], $4::uuid[]) AS y(k, m, u)
                ON CONFLICT DO NOTHING RETURNING message_id
                """,
            ),
            (
                "inbox_superseded",
                """
                UPDATE telecom.dead_letters d SET status = 'superseded', superseded_at = now()
                WHERE d.status <> 'superseded' AND d.consumer = $1
                  AND d.message_key IN (SELECT message_id FROM inbox_claimed)
                """,
            ),
        ),
        (
            consumer,
            list(messages),
            [c.message_id for c in messages.values()],
            [c.user_id for c in messages.values()],
        ),
        # dead_letter_counts: what the dead letters' triggers write
        frozenset({"inbox", "dead_letters", "dead_letter_counts"}),
        "(SELECT count(*) FROM inbox_claimed)",
        int,
    )
