"""Unique windows (`unique_for`): `telecom.unique_keys`, route + sha256(arguments),
taken by one message for a window; a repeat within it is dropped."""

from __future__ import annotations

from uuid import UUID

from infra.postgres.pool import Conn
from infra.postgres.pruning import Rule

RETENTION = Rule("unique_keys", "telecom.unique_keys", "unique_key", "expires_at < now()")
"""A unique key goes as soon as its window has passed, whatever the retention."""


async def take_unique(conn: Conn, key: str, message_id: UUID, window_s: float) -> UUID | None:
    """Take the unique window `key` for `window_s` seconds. None: taken; else the message that
    holds the window."""
    taken = await conn.fetchval(
        """
        INSERT INTO telecom.unique_keys AS u (unique_key, message_id, expires_at)
        VALUES ($1, $2, now() + make_interval(secs => $3))
        ON CONFLICT (unique_key) DO UPDATE
            SET message_id = excluded.message_id, expires_at = excluded.expires_at
            WHERE u.expires_at <= now()
        RETURNING true
        """,
        key,
        message_id,
        window_s,
    )
    if taken:
        return None
    holder: UUID = await conn.fetchval(
        "SELECT message_id FROM telecom.unique_keys WHERE unique_key = $1", key
    )
    return holder
