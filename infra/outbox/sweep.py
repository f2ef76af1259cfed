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
from events.routes import EXPIRY_DUE
from infra.postgres import outbox, queue_repo

# A timer is outstanding while it is pending, or published within `grace`, or published within
# ten times `grace` and not yet consumed (a backlog on telecom.expiry_due is not a lost timer).
_OVERDUE_CONDITION = f"""
    q.status = 'active' AND q.expire_at <= now() - make_interval(secs => $1)
      -- a timer waiting behind a failed one (parked or retrying) is not lost
      AND NOT EXISTS (
          SELECT 1 FROM telecom.holds h
          WHERE h.consumer = '{EXPIRY_DUE.short_name}' AND h.user_id = q.user_id)
      AND NOT EXISTS (
          SELECT 1 FROM telecom.outbox o
          WHERE o.cancel_key = 'expire:' || q.id  -- events.outgoing.expiry_key
            AND (o.published_at IS NULL
                 OR o.published_at > now() - make_interval(secs => $1)
                 OR (o.published_at > now() - make_interval(secs => $1 * 10)
                     AND NOT EXISTS (
                         SELECT 1 FROM telecom.inbox i
                         WHERE i.consumer = '{EXPIRY_DUE.short_name}'
                           AND i.message_id = o.message_id)))
      )
"""
_OVERDUE = f"""
    SELECT q.id, q.user_id, q.package_id, q.expire_at FROM telecom.package_queue q
    WHERE {_OVERDUE_CONDITION}
    ORDER BY q.expire_at
    LIMIT $2
"""
# Checked again under the user's lock: another relay's sweep may have just re-sent it.
_STILL_OVERDUE = f"""
    SELECT true FROM telecom.package_queue q WHERE q.id = $2 AND {_OVERDUE_CONDITION}
"""


async def sweep_overdue_expiries(pool: asyncpg.Pool, grace: float, limit: int = 500) -> int:
    async with pool.acquire() as conn:
        overdue = await conn.fetch(_OVERDUE, grace, limit)
        count = 0
        for row in overdue:
            async with conn.transaction():
                await queue_repo.lock_user(conn, row["user_id"])
                if not await conn.fetchval(_STILL_OVERDUE, grace, row["id"]):
                    continue
                out = outgoing(
                    ExpiryScheduled(row["user_id"], row["id"], row["package_id"], row["expire_at"])
                )
                assert out is not None  # ExpiryScheduled always maps to a message
                await outbox.emit(conn, row["user_id"], [out])
                count += 1
        return count
