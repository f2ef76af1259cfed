"""Finishing messages that will not run again (applied, buried, expired): what their addresses
and group members become (infra/postgres/addresses.py, groups.py), and the expiry of outbox rows
whose TTL ran out before they were published.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from uuid import UUID

from events.envelope import H_ADDRESS, H_GROUP, MAX_ADDRESS, header_text, publisher_of
from events.identity import message_key
from infra.postgres import addresses, dead_letters, groups, holds, outbox
from infra.postgres.pool import Conn


@dataclass(frozen=True, slots=True)
class Finished:
    """A message that will not run again: applied (`ok`) or given up on (buried, expired)."""

    message_id: UUID
    address: str | None
    group_id: UUID | None
    ok: bool
    error: str | None = None


async def finish(conn: Conn, finished: Sequence[Finished]) -> None:
    """Record that these messages will not run again: their addresses become done or failed,
    their group members done or failed, and a group whose last member this was completes."""
    finished = list({f.message_id: f for f in finished}.values())  # once per message
    await addresses.mark_finished(
        conn,
        [(f.address, f.message_id, f.ok, f.error) for f in finished if f.address is not None],
    )
    await groups.mark_finished(
        conn, [(f.message_id, f.ok) for f in finished if f.group_id is not None]
    )


async def finish_failed(
    conn: Conn, message_id: str | None, address: str | None, group: UUID | None, error: str
) -> None:
    """A message given up on (buried, expired, dead-lettered by the broker): its address and
    group member fail. Nothing to do for a message without either, or without a usable id."""
    if address is None and group is None:
        return
    try:
        finished_id = UUID(str(message_id))
    except ValueError:
        return
    await finish(conn, [Finished(finished_id, address, group, ok=False, error=error)])


async def expire_rows(conn: Conn, rows: Sequence[outbox.ClaimedRow], publisher: str) -> None:
    """Rows whose TTL ran out before they were published: never published, recorded as expired
    in the dead-letter store (reason `expired`), their addresses and group members failed.
    `publisher`: pkgq's AMQP user, who would have published them; a row that is pkgq's copy of
    someone else's message (a retry, a replay) names its first publisher (H_PUBLISHER)."""
    if not rows:
        return
    for row in rows:
        await dead_letters.bury(
            conn,
            dead_letters.NewDeadLetter(
                source="relay",
                route=row.route,
                consumer=row.route.removeprefix("telecom."),
                message_id=str(row.message_id),
                user_id=row.user_id,
                message_type=row.message_type,
                content_type="application/json",
                body=row.body,
                headers=row.headers,
                reason="expired",
                error_type="Expired",
                error_message=f"not published before its TTL ran out at {row.expires_at}",
                error_location="relay",
                publisher=publisher_of(row.headers, publisher),
                message_key=_key_of(row, publisher),
            ),
        )
    await outbox.mark_expired(conn, [r.id for r in rows])
    # An expired retry will never come: it blocks its user's later messages no more (the hold
    # it is: on its route's consumer, by its key, so for its user and first publisher only).
    await holds.release_blocked_by(
        conn,
        [
            holds.Blocker(r.route.removeprefix("telecom."), r.user_id, _key_of(r, publisher))
            for r in rows
            if r.user_id is not None
        ],
    )
    await finish(
        conn,
        [
            Finished(
                r.message_id,
                # A retry carries its sender's headers: text only, whatever they sent.
                header_text(r.headers, H_ADDRESS, MAX_ADDRESS),
                _uuid_or_none(header_text(r.headers, H_GROUP, 64)),
                ok=False,
                error="expired",
            )
            for r in rows
        ],
    )


def _key_of(row: outbox.ClaimedRow, publisher: str) -> UUID:
    """The key (events/identity.py) of the message an outbox row sends: the one its consumer
    knows it by (a retry carries its first publisher in H_PUBLISHER)."""
    return message_key(row.message_id, publisher_of(row.headers, publisher), row.user_id)


def _uuid_or_none(value: object) -> UUID | None:
    try:
        return UUID(str(value)) if value is not None else None
    except ValueError:
        return None
