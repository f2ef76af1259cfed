"""TTR strikes: how many times a message ran past its route's TTR (the Fn queue's timed-out
reservations). The count survives the rollback of the run that timed out, because it is
written in a transaction of its own."""

from __future__ import annotations

from collections.abc import Sequence
from uuid import UUID

from infra.postgres.pool import Conn
from infra.postgres.pruning import Rule

RETENTION = Rule("ttr_strikes", "telecom.ttr_strikes", "ctid", "last_at < {cutoff}")


async def strike(conn: Conn, consumer: str, key: UUID, message_id: UUID) -> int:
    """Count one more strike of the message `key` (events/identity.py: kept in `message_id`
    since migration 0022, the id it was sent under in `sent_as`); returns its strikes so far."""
    strikes: int = await conn.fetchval(
        """
        INSERT INTO telecom.ttr_strikes (consumer, message_id, sent_as) VALUES ($1, $2, $3)
        ON CONFLICT (consumer, message_id)
            DO UPDATE SET strikes = ttr_strikes.strikes + 1, last_at = now()
        RETURNING strikes
        """,
        consumer,
        key,
        message_id,
    )
    return strikes


async def forget(conn: Conn, keys: Sequence[UUID]) -> None:
    """The messages (by key) start over (a dead-letter replay): their strikes go."""
    await conn.execute(
        "DELETE FROM telecom.ttr_strikes WHERE message_id = ANY($1::uuid[])", list(keys)
    )
