"""The access read model for node management: who may use the network, on which package.

Updates carry the per-user event sequence number; an event older than the last one applied
(events on different routes may be consumed out of order) changes nothing.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime
from uuid import UUID

import asyncpg

from infra.postgres.pool import Conn


@dataclass(frozen=True, slots=True)
class Change:
    """The whole access row a grant (item set) or a revoke (item None) leaves, at `seq`."""

    user_id: UUID
    seq: int
    item_id: int | None = None
    package_id: int | None = None
    remaining: int | None = None
    """Traffic left on the granted item; None when granted: unlimited traffic."""
    expire_at: datetime | None = None

    @property
    def granted(self) -> bool:
        return self.item_id is not None


async def get_access(conn: Conn, user_id: UUID) -> asyncpg.Record | None:
    return await conn.fetchrow("SELECT * FROM telecom.access WHERE user_id = $1", user_id)
