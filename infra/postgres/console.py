"""Reads only the operator console needs (`pkgq web`): addresses, parked messages, and the
counts on its overview. Everything else it shows comes from the modules the CLI reads through
(dead_letters, holds, workers, job_state, stats)."""

from __future__ import annotations

import json
from typing import Any
from uuid import UUID

from events import bounded_json
from infra.postgres import stats
from infra.postgres.pool import Conn


async def addresses(conn: Conn, state: str | None = None, limit: int = 100) -> list[dict[str, Any]]:
    """Addressed work, newest first; `state`: queued, done or failed."""
    rows = await conn.fetch(
        """
        SELECT address, route, message_id, state, error, created_at, finished_at
        FROM telecom.addresses
        WHERE ($1::text IS NULL OR state = $1)
        ORDER BY created_at DESC
        LIMIT $2
        """,
        state,
        limit,
    )
    return [dict(r) for r in rows]


async def parked(conn: Conn, user_id: UUID | None = None, limit: int = 200) -> list[dict[str, Any]]:
    """Messages parked behind holds, per consumer and user in arrival order."""
    rows = await conn.fetch(
        """
        SELECT p.id, p.consumer, p.user_id, coalesce(p.sent_as, p.message_id) AS message_id,
               p.route, p.message_type, p.parked_at,
               p.body, h.blocker, h.state AS hold_state
        FROM telecom.parked p
        LEFT JOIN telecom.holds h ON h.consumer = p.consumer AND h.user_id = p.user_id
        WHERE ($1::uuid IS NULL OR p.user_id = $1)
        ORDER BY p.consumer, p.user_id, p.id
        LIMIT $2
        """,
        user_id,
        limit,
    )
    return [dict(r) for r in rows]


async def held_users(conn: Conn) -> dict[str, int]:
    """Per consumer: how many users are held back (a hold with a blocker), read as the status
    port reads them (stats.held: exact up to stats.EXACT_UP_TO per state, estimated past it)."""
    found: dict[str, int] = {}
    for (consumer, _), n in (await stats.held(conn))[0].items():
        found[consumer] = found.get(consumer, 0) + n
    return found


def body_text(body: bytes | memoryview) -> str:
    """A stored body as text to show or edit: pretty JSON when it is JSON (and nests no deeper
    than events.bounded_json.MAX_JSON_DEPTH), else as decoded."""
    return bounded_json.pretty(bytes(body))


def body_summary(body: bytes | memoryview) -> str:
    """A stored body on one line, without its user_id (the row shows the user already); as
    decoded when it is not JSON or nests too deep to parse."""
    raw = bytes(body)
    try:
        value = bounded_json.loads(raw)
    except ValueError:
        return bounded_json.as_text(raw)
    if isinstance(value, dict):
        value.pop("user_id", None)
    return json.dumps(value, ensure_ascii=False)
