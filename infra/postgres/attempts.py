"""Attempts per message, counted in Postgres: the retry policy's count.

The `x-attempt` header is informative only: whoever publishes can set it, and a forged value
would skip or multiply retries. Each failed attempt of a message on a consumer adds one here, in
the delivery's transaction (a rollback takes the count back with the verdict). A replay starts
a new generation, with attempts of its own.
"""

from __future__ import annotations

from uuid import UUID

from infra.postgres.pool import Conn
from infra.postgres.pruning import Rule

# A message's failed attempts, last counted before the retention: its retries are long over
# (the longest backoff is days shorter), and a replay counts in a new generation anyway.
RETENTION = Rule("attempts", "telecom.attempts", "ctid", "last_at < {cutoff}")


async def count_failure(
    conn: Conn, consumer: str, message_id: UUID, generation: int, claim: int
) -> int:
    """Count one more failed attempt; returns how many the message has had in its generation.

    `claim` is the delivery's own x-attempt (pkgq writes count + 1 on each retry). A delivery
    whose claim is the one counted last is that same attempt delivered again: not counted
    again, so its retry's dedup key (made from the count) finds the retry already scheduled.
    A forged claim can thus neither skip attempts (the count moves by one at most) nor
    multiply retries (one retry per count)."""
    attempts: int = await conn.fetchval(
        """
        INSERT INTO telecom.attempts (consumer, message_id, generation, attempts, last_claim)
        VALUES ($1, $2, $3, 1, $4)
        ON CONFLICT (consumer, message_id, generation) DO UPDATE SET
            attempts = attempts.attempts
                       + CASE WHEN attempts.last_claim = excluded.last_claim THEN 0 ELSE 1 END,
            last_claim = excluded.last_claim,
            last_at = now()
        RETURNING attempts
        """,
        consumer,
        message_id,
        generation,
        claim,
    )
    return attempts
