"""Where a message_id is: every table that records a message by its id, in one statement, each
read through an index (the inbox, parked messages and attempts by the message_id a message was
sent under, `sent_as`, or for a row from before keys by its own key, consumer by consumer,
migrations 0022 and 0024; holds through their keys; the others through their message_id
indexes, migration 0019). Every message sent under the id is found, whoever published it."""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime
from typing import Any
from uuid import UUID

from events import bounded_json
from events.routes import ROUTES
from infra.postgres.pool import Conn

FOUND_MAX = 200
"""Places listed for one message_id (a message retried many times has many outbox rows)."""


@dataclass(frozen=True, slots=True)
class Place:
    """One row that names the message: `place` is the table (inbox, outbox, parked, hold,
    attempts, dead_letter, audit, operator, usage), `state` what the row says of it."""

    place: str
    at: datetime | None
    user_id: UUID | None
    route: str | None
    state: str
    dead_letter_id: int | None
    item_id: int | None
    detail: dict[str, Any]


SEARCH_SQL = """
SELECT * FROM (
    SELECT 'inbox' AS place, x.processed_at AS at, x.user_id, 'telecom.' || x.consumer AS route,
           'applied by ' || x.consumer AS state, NULL::bigint AS dead_letter_id,
           NULL::bigint AS item_id, '{}'::jsonb AS detail
    FROM telecom.inbox x
    WHERE x.consumer = ANY($2::text[])
      AND (x.sent_as = $1 OR (x.message_id = $1 AND x.sent_as IS NULL))
    UNION ALL
    SELECT 'outbox', b.created_at, b.user_id, b.route,
           CASE WHEN b.published_at IS NOT NULL THEN 'published'
                WHEN b.available_at > now() THEN 'scheduled' ELSE 'due' END,
           CASE WHEN b.dedup_key LIKE 'replay:%' THEN split_part(b.dedup_key, ':', 2)::bigint END,
           NULL, jsonb_build_object('outbox_id', b.id, 'message_type', b.message_type,
                                    'available_at', b.available_at,
                                    'published_at', b.published_at,
                                    'kind', CASE WHEN b.dedup_key LIKE 'replay:%' THEN 'replay'
                                                 WHEN b.dedup_key LIKE 'retry:%' THEN 'retry'
                                                 ELSE 'message' END)
    FROM telecom.outbox b WHERE b.message_id = $1
    UNION ALL
    SELECT 'parked', p.parked_at, p.user_id, p.route, 'parked in ' || p.consumer, NULL, NULL,
           jsonb_build_object('message_type', p.message_type)
    FROM telecom.parked p
    WHERE p.consumer = ANY($2::text[])
      AND (p.sent_as = $1 OR (p.message_id = $1 AND p.sent_as IS NULL))
    UNION ALL
    SELECT 'hold', h.since, h.user_id, 'telecom.' || h.consumer,
           'holds the user''s later messages (' || h.state || ')', NULL, NULL,
           jsonb_build_object('attempts', h.attempts, 'last_error', left(h.last_error, 300))
    FROM telecom.holds h WHERE h.consumer = ANY($2::text[]) AND h.blocker = $1
    UNION ALL
    SELECT 'attempts', t.last_at, NULL, 'telecom.' || t.consumer,
           t.attempts || ' failed attempt(s)', NULL, NULL,
           jsonb_build_object('generation', t.generation)
    FROM telecom.attempts t
    WHERE t.consumer = ANY($2::text[])
      AND (t.sent_as = $1 OR (t.message_id = $1 AND t.sent_as IS NULL))
    UNION ALL
    SELECT 'dead_letter', d.first_failed_at, d.user_id, d.route, d.status::text, d.id, NULL,
           jsonb_build_object('reason', d.reason, 'error', left(d.error_message, 300))
    FROM telecom.dead_letters d WHERE d.message_uuid = $1
    UNION ALL
    SELECT 'audit', a.at, a.user_id, NULL, a.action, NULL, a.item_id,
           jsonb_build_object('reason', a.reason, 'operator', a.operator)
    FROM telecom.item_audit a WHERE a.message_id = $1
    UNION ALL
    SELECT 'operator', o.at, o.user_id, NULL, o.action || ' by ' || o.actor, o.dead_letter_id,
           o.item_id, '{}'::jsonb
    FROM telecom.operator_actions o WHERE o.message_id = $1
    UNION ALL
    SELECT 'operator', o.at, d.user_id, NULL, o.action || ' by ' || o.actor, o.dead_letter_id,
           o.item_id, '{}'::jsonb
    FROM telecom.dead_letters d JOIN telecom.operator_actions o ON o.dead_letter_id = d.id
    WHERE d.message_uuid = $1 AND o.message_id IS DISTINCT FROM $1
    UNION ALL
    SELECT 'usage', u.billed_at, u.user_id, NULL, 'billed', NULL, u.item_id,
           jsonb_build_object('usage_id', u.usage_id, 'upload', u.upload,
                              'download', u.download)
    FROM telecom.usage_billed u WHERE u.message_id = $1
) found
ORDER BY at NULLS LAST, place
LIMIT $3
"""
"""$1 the message_id, $2 every route's consumer name, $3 the most places listed."""


def _consumers() -> list[str]:
    return sorted(r.short_name for r in ROUTES.values())


async def find(conn: Conn, message_id: UUID) -> list[Place]:
    """Every place the message is recorded, oldest first."""
    rows = await conn.fetch(SEARCH_SQL, message_id, _consumers(), FOUND_MAX)
    return [
        Place(
            place=r["place"],
            at=r["at"],
            user_id=r["user_id"],
            route=r["route"],
            state=r["state"],
            dead_letter_id=r["dead_letter_id"],
            item_id=r["item_id"],
            detail=bounded_json.detail_of(r["detail"]),
        )
        for r in rows
    ]


async def explain(conn: Conn, message_id: UUID) -> str:
    """The search's plan (EXPLAIN, not run): what the index-use test reads."""
    lines = await conn.fetch("EXPLAIN " + SEARCH_SQL, message_id, _consumers(), FOUND_MAX)
    return "\n".join(r[0] for r in lines)
