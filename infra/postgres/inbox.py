"""The inbox: which messages each consumer has already applied."""

from __future__ import annotations

from uuid import UUID

from infra.postgres.pool import Conn


async def claim(conn: Conn, consumer: str, message_id: UUID) -> bool:
    """Record the message as applied by `consumer`. False: it was applied before (a duplicate)."""
    inserted = await conn.fetchval(
        "INSERT INTO telecom.inbox (consumer, message_id) VALUES ($1, $2) "
        "ON CONFLICT DO NOTHING RETURNING true",
        consumer,
        message_id,
    )
    return bool(inserted)
