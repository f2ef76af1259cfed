"""The operator audit: who did what, when, from the console or the CLI (cancels, quota
adjustments, edited replays, replays and discards), one row per action, written in the
transaction that carries it out (migration 0008)."""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import Any, Literal
from uuid import UUID

import structlog

from events import bounded_json
from infra.postgres.pool import Conn

log = structlog.get_logger(__name__)

Action = Literal[
    "cancel",
    "adjust_quota",
    "edit_replay",
    "replay",
    "discard",
    "release_hold",
    "pause_route",
    "resume_route",
]


@dataclass(frozen=True, slots=True)
class Entry:
    actor: str
    action: Action
    user_id: UUID | None = None
    item_id: int | None = None
    dead_letter_id: int | None = None
    message_id: UUID | None = None
    detail: dict[str, Any] = field(default_factory=dict)


async def record(conn: Conn, entry: Entry) -> int:
    """Inside the action's transaction: one audit row. Returns its id."""
    found = int(
        await conn.fetchval(
            """
            INSERT INTO telecom.operator_actions
                (actor, action, user_id, item_id, dead_letter_id, message_id, detail)
            VALUES ($1, $2, $3, $4, $5, $6, $7::text::jsonb)
            RETURNING id
            """,
            entry.actor,
            entry.action,
            entry.user_id,
            entry.item_id,
            entry.dead_letter_id,
            entry.message_id,
            json.dumps(entry.detail, default=str),
        )
    )
    # A log line too, for journald and log shippers. It tells of the attempt: the row, committed
    # or rolled back with the action, is the record.
    log.info(
        "operator_action",
        audit_id=found,
        actor=entry.actor,
        action=entry.action,
        user_id=str(entry.user_id) if entry.user_id else None,
        item_id=entry.item_id,
        dead_letter_id=entry.dead_letter_id,
    )
    return found


async def recent(
    conn: Conn,
    *,
    user_id: UUID | None = None,
    dead_letter_id: int | None = None,
    limit: int = 50,
) -> list[dict[str, Any]]:
    """The newest actions, optionally about one user or one dead letter."""
    rows = await conn.fetch(
        """
        SELECT id, at, actor, action, user_id, item_id, dead_letter_id, message_id,
               detail::text AS detail
        FROM telecom.operator_actions
        WHERE ($1::uuid IS NULL OR user_id = $1)
          AND ($2::bigint IS NULL OR dead_letter_id = $2)
        ORDER BY at DESC, id DESC
        LIMIT $3
        """,
        user_id,
        dead_letter_id,
        limit,
    )
    return [{**dict(r), "detail": bounded_json.detail_of(r["detail"])} for r in rows]
