"""The access read model for node management: who may use the network, on which package.

Updates carry the per-user event sequence number; an event older than the last one applied
(events on different routes may be consumed out of order) changes nothing.
"""

from __future__ import annotations

from uuid import UUID

import asyncpg

from infra.postgres.pool import Conn


async def get_access(conn: Conn, user_id: UUID) -> asyncpg.Record | None:
    return await conn.fetchrow("SELECT * FROM telecom.access WHERE user_id = $1", user_id)
