"""The access read model for node management: who may use the network, on which package.

Updates carry the per-user event sequence number; an event older than the last one applied
(events on different routes may be consumed out of order) changes nothing.
"""

from __future__ import annotations

from uuid import UUID

import asyncpg

from infra.postgres.pool import Conn


async def grant(conn: Conn, user_id: UUID, item_id: int, seq: int) -> bool:
    """Grant access on `item_id`, with its remaining traffic and expiry read from the queue."""
    # Wait for a transaction billing this user to commit, so `remaining` is not read stale.
    await conn.execute("SELECT 1 FROM telecom.queue_users WHERE user_id = $1 FOR SHARE", user_id)
    status = await conn.execute(
        """
        INSERT INTO telecom.access AS a
            (user_id, granted, item_id, package_id, remaining, expire_at, seq)
        SELECT q.user_id, true, q.id, q.package_id,
               CASE WHEN q.status = 'active'
                    THEN greatest(p.traffic_limit + q.adjust_quota - q.upload - q.download, 0)
                    ELSE 0  -- consumed before this (late) activation event was applied
               END,
               q.expire_at, $3
        FROM telecom.package_queue q JOIN telecom.packages p ON p.id = q.package_id
        WHERE q.id = $2 AND q.user_id = $1
        ON CONFLICT (user_id) DO UPDATE
        SET granted = true, item_id = EXCLUDED.item_id, package_id = EXCLUDED.package_id,
            remaining = EXCLUDED.remaining, expire_at = EXCLUDED.expire_at,
            seq = EXCLUDED.seq, updated_at = now()
        WHERE a.seq < EXCLUDED.seq
        """,
        user_id,
        item_id,
        seq,
    )
    return status.endswith(" 1")


async def revoke(conn: Conn, user_id: UUID, seq: int) -> bool:
    status = await conn.execute(
        """
        INSERT INTO telecom.access AS a (user_id, granted, seq) VALUES ($1, false, $2)
        ON CONFLICT (user_id) DO UPDATE
        SET granted = false, item_id = NULL, package_id = NULL, remaining = NULL,
            expire_at = NULL, seq = EXCLUDED.seq, updated_at = now()
        WHERE a.seq < EXCLUDED.seq
        """,
        user_id,
        seq,
    )
    return status.endswith(" 1")


async def set_remaining(conn: Conn, user_id: UUID, item_id: int, remaining: int) -> None:
    await conn.execute(
        "UPDATE telecom.access SET remaining = $3, updated_at = now() "
        "WHERE user_id = $1 AND item_id = $2 AND granted",
        user_id,
        item_id,
        remaining,
    )


async def get_access(conn: Conn, user_id: UUID) -> asyncpg.Record | None:
    return await conn.fetchrow("SELECT * FROM telecom.access WHERE user_id = $1", user_id)
