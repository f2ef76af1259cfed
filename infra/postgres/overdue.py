"""Active items past their time expiry with no outstanding timer (read by the expiry sweep,
infra/outbox/sweep.py). Reads only: the items are queue_repo's, the timers outbox's."""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime
from uuid import UUID

from events.routes import EXPIRY_DUE
from infra.postgres.pool import Conn

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
                           -- kept by its key, sent as the timer's id (migration 0022)
                           AND (i.sent_as = o.message_id
                                OR (i.sent_as IS NULL AND i.message_id = o.message_id)))))
      )
"""
_OVERDUE = f"""
    SELECT q.id, q.user_id, q.package_id, q.expire_at FROM telecom.package_queue q
    WHERE {_OVERDUE_CONDITION}
    ORDER BY q.expire_at
    LIMIT $2
"""
_STILL_OVERDUE = f"""
    SELECT true FROM telecom.package_queue q WHERE q.id = $2 AND {_OVERDUE_CONDITION}
"""


@dataclass(frozen=True, slots=True)
class OverdueItem:
    id: int
    user_id: UUID
    package_id: int
    expire_at: datetime


async def overdue_items(conn: Conn, grace: float, limit: int) -> list[OverdueItem]:
    """Active items `grace` seconds past `expire_at` with no outstanding timer, oldest first."""
    return [OverdueItem(**dict(r)) for r in await conn.fetch(_OVERDUE, grace, limit)]


async def still_overdue(conn: Conn, grace: float, item_id: int) -> bool:
    """Checked again under the user's lock: another relay's sweep may have just re-sent it."""
    return bool(await conn.fetchval(_STILL_OVERDUE, grace, item_id))
