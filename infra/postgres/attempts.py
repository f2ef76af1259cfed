"""Attempts per message, counted in Postgres only: the retry policy's count.

No header plays a part: whoever publishes can write `x-attempt`, and a forged value would skip,
repeat or lose retries. The batch reads its messages' counts with its snapshot
(infra/postgres/batch_read.py) and the writer adds the failures it decided (`add_many`), in the
batch's transaction, so a rollback takes the count back with the decision. A replay starts the
count over (`forget`). Rows of generation 0 are the count; the column stays from migration
0006, when a replay generation read from a header started a new count. A message's count is
kept under its key (events/identity.py) in `message_id`, the id it was sent under in `sent_as`
(migration 0022): another publisher's or user's copy under its message_id counts its own.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from uuid import UUID

from infra.postgres.compound import Part, part_of
from infra.postgres.pool import Conn
from infra.postgres.pruning import Rule

# A message's failed attempts, last counted before the retention: its retries are long over
# (the longest backoff is days shorter), and a replay starts the count over anyway.
RETENTION = Rule("attempts", "telecom.attempts", "ctid", "last_at < {cutoff}")


def add_many(consumer: str, failures: Mapping[tuple[UUID, UUID], int]) -> Part[None] | None:
    """Add each message's failures of this batch to its count (by (key, message_id): the
    count is the key's, events/identity.py): a part of the batch's write statement (none:
    nothing)."""
    if not failures:
        return None
    return part_of(
        """
        INSERT INTO telecom.attempts AS a
            (consumer, message_id, sent_as, generation, attempts, last_claim)
        SELECT $1, k, m, 0, n, 0 FROM unnest($2::uuid[], $3::uuid[], $4::int[]) AS f(k, m, n)
        ON CONFLICT (consumer, message_id, generation) DO UPDATE SET
            attempts = a.attempts + excluded.attempts, last_at = now()
        """,
        (
            consumer,
            [k for k, _ in failures],
            [m for _, m in failures],
            list(failures.values()),
        ),
        ("attempts",),
        name="attempts_added",
    )


async def forget(conn: Conn, keys: Sequence[UUID]) -> None:
    """The messages (by key) start over (a dead-letter replay): their counts, on every
    consumer, go."""
    if keys:
        await conn.execute(
            "DELETE FROM telecom.attempts WHERE message_id = ANY($1::uuid[])", list(keys)
        )
