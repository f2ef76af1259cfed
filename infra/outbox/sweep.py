"""The expiry sweep: re-send the time-expiry trigger of active items that are overdue.

Time expiry is normally an outbox row due at `expire_at`, written with the activation. The sweep
covers the case where that row is gone or was lost downstream: an active item `grace` seconds
past its `expire_at` with no outstanding timer gets a new one. A duplicate timer is harmless:
`expire_due` ignores items that are no longer active, and it emits nothing then.
"""

from __future__ import annotations

import asyncpg

from domain.events import ExpiryScheduled
from events.outgoing import outgoing
from infra.postgres import outbox, overdue, queue_repo


async def sweep_overdue_expiries(pool: asyncpg.Pool, grace: float, limit: int = 500) -> int:
    async with pool.acquire() as conn:
        items = await overdue.overdue_items(conn, grace, limit)
        count = 0
        for item in items:
            async with conn.transaction():
                await queue_repo.lock_user(conn, item.user_id)
                if not await overdue.still_overdue(conn, grace, item.id):
                    continue
                out = outgoing(
                    ExpiryScheduled(item.user_id, item.id, item.package_id, item.expire_at)
                )
                assert out is not None  # ExpiryScheduled always maps to a message
                await outbox.emit(conn, item.user_id, [out])
                count += 1
        return count
