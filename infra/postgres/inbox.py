"""The inbox: which messages each consumer has already applied.

A message is recorded by its key (events/identity.py: its message_id, first publisher and the
user its body names), kept in `message_id`, with the message_id it was sent under in `sent_as`
(migration 0022). A row whose `sent_as` is NULL was written before keys, by its message_id:
the batch's read still counts it (infra/postgres/batch_read.py)."""

from __future__ import annotations

from uuid import UUID

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
