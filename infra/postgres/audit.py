"""The item audit: who cancelled or adjusted which item, and why (one row per applied command,
written set-based with the batch that applied it). `operator` is who the command's body says
did it (the publisher's word); `publisher` is who published it, as the broker verified it."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Literal
from uuid import UUID

import asyncpg

from infra.postgres.compound import Part, part_of
from infra.postgres.pool import Conn, columns

Action = Literal["cancel", "adjust_quota"]


@dataclass(frozen=True, slots=True)
class Entry:
    item_id: int
    user_id: UUID
    action: Action
    message_id: UUID
    delta: int | None = None
    reason: str | None = None
    operator: str | None = None
    """Claimed: the command's body names it."""
    publisher: str | None = None
    """Verified: the AMQP user_id the broker validated (events.envelope.publisher_of)."""


def write(entries: Sequence[Entry]) -> Part[None] | None:
    """A whole batch's entries: a part of its write statement (none: nothing)."""
    if not entries:
        return None
    return part_of(
        """
        INSERT INTO telecom.item_audit
            (item_id, user_id, action, delta, reason, operator, message_id, publisher)
        SELECT * FROM unnest($1::bigint[], $2::uuid[], $3::text[], $4::bigint[], $5::text[],
                             $6::text[], $7::uuid[], $8::text[])
        """,
        (
            *columns(entries, "item_id", "user_id", "action", "delta", "reason", "operator"),
            *columns(entries, "message_id", "publisher"),
        ),
        ("item_audit",),
        name="audit_written",
    )


async def for_item(conn: Conn, item_id: int) -> list[asyncpg.Record]:
    """An item's audit trail, oldest first."""
    return list(
        await conn.fetch(
            "SELECT * FROM telecom.item_audit WHERE item_id = $1 ORDER BY at, id", item_id
        )
    )
