"""Groups (rsqueue's): `telecom.job_groups` and `telecom.group_members`, a group's members and
counters. The transaction that finishes the last member publishes the group's end message; the
row lock on the group makes that happen exactly once however many members finish at the same
time.

Lock order, everywhere: group members (by message_id), then groups (by id).
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any
from uuid import UUID, uuid4

from events.envelope import H_GROUP_END, Envelope
from infra.postgres import holds, outbox
from infra.postgres.pool import Conn
from infra.postgres.pruning import Rule

RETENTION = Rule("job_groups", "telecom.job_groups", "id", "finished_at < {cutoff}")
"""Finished groups past retention; their members go with them (ON DELETE CASCADE)."""


@dataclass(frozen=True, slots=True)
class EndMessage:
    """A group's end (or abort) work: a message for one of the routes."""

    route: str
    message_type: str
    schema_version: int
    body: bytes
    user_id: UUID | None

    def as_json(self) -> str:
        return json.dumps(
            {
                "route": self.route,
                "message_type": self.message_type,
                "schema_version": self.schema_version,
                "body": self.body.decode(),
                "user_id": str(self.user_id) if self.user_id else None,
            }
        )

    @classmethod
    def from_json(cls, value: Any) -> EndMessage:
        data = json.loads(value) if isinstance(value, str) else value
        return cls(
            route=data["route"],
            message_type=data["message_type"],
            schema_version=int(data["schema_version"]),
            body=str(data["body"]).encode(),
            user_id=UUID(data["user_id"]) if data.get("user_id") else None,
        )


async def create_group(
    conn: Conn,
    group_id: UUID,
    name: str,
    members: Sequence[tuple[UUID, str]],
    on_complete: EndMessage | None,
    on_abort: EndMessage | None,
) -> None:
    """Record a group and its members, (message_id, route) each, as pending."""
    await conn.execute(
        "INSERT INTO telecom.job_groups (id, name, state, total, on_complete, on_abort) "
        "VALUES ($1, $2, 'open', $3, $4::text::jsonb, $5::text::jsonb)",
        group_id,
        name,
        len(members),
        on_complete.as_json() if on_complete else None,
        on_abort.as_json() if on_abort else None,
    )
    await conn.execute(
        "INSERT INTO telecom.group_members (message_id, group_id, route, state) "
        "SELECT m, $2, r, 'pending' FROM unnest($1::uuid[], $3::text[]) AS x(m, r)",
        [m for m, _ in members],
        group_id,
        [r for _, r in members],
    )
    if not members:
        await _complete_if_done(conn, [group_id])


async def member_state(conn: Conn, message_id: UUID) -> str | None:
    """Lock a group member's row and return its state (None: not a member)."""
    state: str | None = await conn.fetchval(
        "SELECT state FROM telecom.group_members WHERE message_id = $1 FOR UPDATE", message_id
    )
    return state


async def mark_finished(conn: Conn, finished: Sequence[tuple[UUID, bool]]) -> None:
    """(message_id, ok) each, of messages that will not run again: their members become done or
    failed, and a group whose last member this was completes. Messages that are no members are
    left out."""
    grouped = sorted(dict(finished).items())
    if not grouped:
        return
    rows = await conn.fetch(
        "SELECT message_id, group_id, state FROM telecom.group_members "
        "WHERE message_id = ANY($1::uuid[]) ORDER BY message_id FOR UPDATE",
        [m for m, _ in grouped],
    )
    before = {r["message_id"]: (r["group_id"], r["state"]) for r in rows}
    moves: dict[UUID, list[int]] = {}  # group -> [done delta, failed delta]
    changed: list[tuple[UUID, str]] = []
    for message_id, ok in grouped:
        if message_id not in before:
            continue
        group, state = before[message_id]
        new = "done" if ok else "failed"
        if state == new or state in ("done", "cancelled"):
            continue  # already counted; a done or cancelled member stays so
        delta = moves.setdefault(group, [0, 0])
        if state == "failed":  # a replayed member that succeeded this time
            delta[1] -= 1
        delta[0 if ok else 1] += 1
        changed.append((message_id, new))
    if not changed:
        return
    await conn.execute(
        "UPDATE telecom.group_members g SET state = x.s, finished_at = now() "
        "FROM unnest($1::uuid[], $2::text[]) AS x(m, s) WHERE g.message_id = x.m",
        [m for m, _ in changed],
        [s for _, s in changed],
    )
    groups = sorted(moves)
    await conn.execute(
        "SELECT 1 FROM telecom.job_groups WHERE id = ANY($1::uuid[]) ORDER BY id FOR UPDATE",
        groups,
    )
    await conn.execute(
        "UPDATE telecom.job_groups g SET done = g.done + x.d, failed = g.failed + x.f "
        "FROM unnest($1::uuid[], $2::int[], $3::int[]) AS x(id, d, f) WHERE g.id = x.id",
        groups,
        [moves[g][0] for g in groups],
        [moves[g][1] for g in groups],
    )
    await _complete_if_done(conn, groups)


async def _complete_if_done(conn: Conn, groups: Sequence[UUID]) -> None:
    """Complete the open groups (locked by the caller) whose members have all finished, and
    publish their end messages through the outbox."""
    rows = await conn.fetch(
        """
        UPDATE telecom.job_groups
        SET state = 'completed', finished_at = now(),
            end_message_id = CASE WHEN on_complete IS NULL THEN NULL ELSE gen_random_uuid() END
        WHERE id = ANY($1::uuid[]) AND state = 'open' AND done + failed + cancelled >= total
        RETURNING id, on_complete, end_message_id, total, done, failed
        """,
        list(groups),
    )
    ends = [
        _end_row(EndMessage.from_json(r["on_complete"]), r["end_message_id"], r["id"], "completed")
        for r in rows
        if r["on_complete"] is not None
    ]
    await outbox.enqueue(conn, ends)


def _end_row(end: EndMessage, message_id: UUID, group_id: UUID, why: str) -> outbox.OutboxMessage:
    envelope = Envelope(
        message_id=message_id,
        message_type=end.message_type,
        schema_version=end.schema_version,
        user_id=end.user_id,
    )
    return outbox.from_envelope(
        end.route, envelope, end.body, extra_headers={H_GROUP_END: f"{group_id}:{why}"}
    )


@dataclass(frozen=True, slots=True)
class CancelResult:
    group_id: UUID
    cancelled: bool
    state: str
    """The group's state after the call (`cancelled`, or why it could not be: `completed`)."""
    withdrawn: int
    """Members not yet published, deleted from the outbox."""
    disarmed: int
    """Members published but not yet processed: they will be no-ops when delivered."""
    abort_message_id: UUID | None


async def cancel_group(conn: Conn, group_id: UUID, who: str) -> CancelResult | None:
    """Inside a transaction: cancel an open group. None: no such group."""
    # The holds its members block first, then the members: the order a consuming batch takes
    # them in (users, holds, group members), so a cancel and a batch never deadlock.
    await conn.execute(
        "SELECT 1 FROM telecom.holds WHERE blocker IN "
        "(SELECT message_id FROM telecom.group_members WHERE group_id = $1) "
        "ORDER BY consumer, user_id FOR UPDATE",
        group_id,
    )
    members = await conn.fetch(
        "SELECT message_id, state FROM telecom.group_members WHERE group_id = $1 "
        "ORDER BY message_id FOR UPDATE",
        group_id,
    )
    group = await conn.fetchrow(
        "SELECT state, on_abort FROM telecom.job_groups WHERE id = $1 FOR UPDATE", group_id
    )
    if group is None:
        return None
    if group["state"] != "open":
        return CancelResult(group_id, False, group["state"], 0, 0, None)
    pending = [m["message_id"] for m in members if m["state"] == "pending"]
    withdrawn = await outbox.withdraw_members(conn, group_id, pending)
    await conn.execute(
        "UPDATE telecom.group_members SET state = 'cancelled', finished_at = now() "
        "WHERE message_id = ANY($1::uuid[])",
        pending,
    )
    # A member waiting for a retry (its retry row was just deleted) blocks its user no more:
    # the hold it is, by its retry's cancel key: on the retry's route, for the very message
    # (its key), not another user's or publisher's message that happens to have its id.
    await holds.release_blocked_by(
        conn,
        [
            holds.blocker_of_retry(key, user)
            for _, key, user in withdrawn
            if key and key.startswith("retry:") and user is not None
        ],
    )
    abort_id = uuid4() if group["on_abort"] is not None else None
    await conn.execute(
        "UPDATE telecom.job_groups SET state = 'cancelled', cancelled = $2, finished_at = now(), "
        "cancelled_by = $3, end_message_id = $4 WHERE id = $1",
        group_id,
        len(pending),
        who,
        abort_id,
    )
    if abort_id is not None:
        end = EndMessage.from_json(group["on_abort"])
        await outbox.enqueue(conn, [_end_row(end, abort_id, group_id, "aborted")])
    gone = len({message_id for message_id, _, _ in withdrawn})
    return CancelResult(group_id, True, "cancelled", gone, len(pending) - gone, abort_id)


async def group_summary(conn: Conn, group_id: UUID) -> dict[str, Any] | None:
    row = await conn.fetchrow(
        "SELECT id, name, state, total, done, failed, cancelled, end_message_id, created_at, "
        "finished_at, cancelled_by FROM telecom.job_groups WHERE id = $1",
        group_id,
    )
    return dict(row) if row is not None else None


async def list_groups(conn: Conn, limit: int = 50) -> list[dict[str, Any]]:
    rows = await conn.fetch(
        "SELECT id, name, state, total, done, failed, cancelled, created_at, finished_at "
        "FROM telecom.job_groups ORDER BY created_at DESC LIMIT $1",
        limit,
    )
    return [dict(r) for r in rows]
