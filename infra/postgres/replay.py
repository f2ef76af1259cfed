"""Replaying dead letters (`pkgq dlq dig`, `plow` and `replay`): each goes back through
the outbox as the same message, with a fresh attempt count, in the transaction that marks it
replayed. Dead letters that must never be sent again (a forgery, a message someone other than
pkgq published on a route only pkgq publishes, a body kept only in part, a message_id that is
not a UUID) are refused with the reason.

The relay publishes a replay as pkgq, so a replay carries who published the message first (the
dead letter's `publisher`, in the pkgq-only header H_PUBLISHER): its consumer audits that
publisher, and on a route only pkgq publishes buries a replay of anyone else's message
(consumers/delivery/decode.py), should one ever reach it."""

from __future__ import annotations

from collections import Counter
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any
from uuid import UUID

from events.envelope import (
    H_ATTEMPT,
    H_EXPIRES_AT,
    H_PUBLISHER,
    H_REPLAY_GENERATION,
    H_REPLAY_OF,
    H_SCHEMA_VERSION,
    H_SEQ,
    H_USER_ID,
    UNVERIFIED,
    job_marks,
    preview,
    republished_headers,
)
from events.routes import ROUTES, UNTRUSTED_PUBLISHER
from infra.postgres import addresses, attempts, dead_letters, holds, outbox, strikes, transitions
from infra.postgres.dead_letters import STATUSES, as_dict, lock_holds
from infra.postgres.pool import Conn


@dataclass(frozen=True, slots=True)
class Edit:
    """An operator's corrected body for a dead letter, already validated against its route's
    model (consumers/operations.py): replayed instead of the stored one, which stays as it was
    buried, for audit. The message keeps its message_id, so a hold it blocks still waits for it."""

    body: bytes
    user_id: UUID | None


@dataclass(frozen=True, slots=True)
class ReplayResult:
    id: int
    message_id: str | None
    replayed: bool
    detail: str


SUPERSEDED = (
    "superseded: its message was applied since it was buried (a later copy of it); a replay "
    "would apply it twice, so it is never replayed"
)


def replay_message(
    row: Any, edit: Edit | None = None, *, pkgq_user: str
) -> outbox.OutboxMessage | str:
    """The outbox row that sends a dead letter again (with `edit`'s body instead of its own),
    or why it cannot be replayed. `pkgq_user`: pkgq's AMQP user (Settings.amqp_user), the only
    publisher whose messages on a route that is not inbound may be replayed."""
    route = ROUTES.get(row["route"])
    if route is None:
        return f"route {row['route']!r} is not a pkgq route"
    if row.get("reason") == UNTRUSTED_PUBLISHER:
        # The relay publishes as pkgq: a replay would launder a forgery into pkgq's own event.
        return "not published by pkgq on a pkgq-only route: never replayed"
    publisher = row.get("publisher")
    if not route.inbound and publisher != pkgq_user:
        # However it came to be filed (expired on the broker, dead-lettered for a length limit
        # before its consumer saw it), a replay would make it pkgq's own event.
        who = (
            repr(publisher)
            if publisher is not None
            else "an unknown publisher (filed before pkgq kept publishers)"
        )
        return (
            f"published by {who}, not pkgq: {route.name} is published by pkgq only; "
            "it is never replayed"
        )
    try:
        message_id = UUID(row["message_id"] or "")
    except ValueError:
        return f"message_id {row['message_id']!r} is not a UUID; republish it with `pkgq publish`"
    size = row.get("body_size")
    if edit is None and size is not None and size > len(row["body"]):
        return f"only the first {len(row['body'])} of its {size} bytes were kept"
    headers = as_dict(row["headers"])
    user_id = row["user_id"]
    if edit is not None and edit.user_id is not None:
        user_id = edit.user_id
        headers[H_USER_ID] = str(edit.user_id)
    if edit is not None:
        # An edited body was checked against the route's current model and written as it:
        # whatever version the buried one was, the replay is of the current version.
        headers[H_SCHEMA_VERSION] = route.schema_version
    version = headers.get(H_SCHEMA_VERSION) or route.schema_version
    schema_version = _natural(version, 2**15)
    if not schema_version:
        return f"header {H_SCHEMA_VERSION}={preview(version)} is not a version"
    replay_no = row["replay_count"]
    seq = headers.get(H_SEQ)
    return outbox.OutboxMessage(
        route=route.name,
        message_type=row["message_type"] or route.message_type,
        schema_version=schema_version,
        body=edit.body if edit is not None else bytes(row["body"]),
        user_id=user_id,
        seq=_natural(seq, 2**53),
        message_id=message_id,
        # Revived without its old TTL (a dig sets a new one, or none).
        headers={
            k: v
            for k, v in republished_headers(
                headers,
                {
                    H_ATTEMPT: 1,
                    H_REPLAY_OF: row["id"],
                    H_REPLAY_GENERATION: replay_no + 1,
                    H_PUBLISHER: publisher or UNVERIFIED,
                },
            ).items()
            if k != H_EXPIRES_AT
        },
        dedup_key=f"replay:{row['id']}:{replay_no}",
    )


def _natural(value: Any, below: int) -> int | None:
    """A stored header as a number in [0, below), whether stored as a number or as digits."""
    if isinstance(value, str) and value.isdigit() and len(value) <= len(str(below)):
        value = int(value)
    if isinstance(value, bool) or not isinstance(value, int):
        return None
    return value if 0 <= value < below else None


async def replay(
    conn: Conn,
    ids: Sequence[int],
    who: str,
    *,
    pkgq_user: str,
    force: bool = False,
    transition: str = "dig",
    edits: Mapping[int, Edit] | None = None,
) -> list[ReplayResult]:
    """Inside a transaction: send the given dead letters again through the outbox, once each.

    Only `buried` rows are replayed (any status but `superseded` with `force`); each is marked
    `replayed` in the same transaction as its outbox row, so an interrupted bulk replay re-run
    skips what was done. The replay keeps the message_id: if it was applied since, the dead
    letter is `superseded` and refused (even forced), however long ago; the inbox drops it too
    while it keeps the message.
    `edits`: corrected bodies by dead-letter id, sent instead of the stored ones.
    `pkgq_user`: pkgq's AMQP user (Settings.amqp_user): on a route only pkgq publishes, a dead
    letter anyone else published (or nobody vouched for) is refused (`replay_message`).
    """
    statuses = [s for s in STATUSES if s != "superseded"] if force else ["buried"]
    await lock_holds(conn, ids)
    rows = await dead_letters.lock_replayable(conn, ids, [*statuses, "superseded"])
    results: list[ReplayResult] = []
    messages: list[outbox.OutboxMessage] = []
    replayed: list[int] = []
    for row in rows:
        if row["status"] == "superseded":  # never, even forced: it would apply twice
            results.append(ReplayResult(row["id"], row["message_id"], False, SUPERSEDED))
            continue
        message = replay_message(row, (edits or {}).get(row["id"]), pkgq_user=pkgq_user)
        if isinstance(message, str):
            results.append(ReplayResult(row["id"], row["message_id"], False, message))
            continue
        messages.append(message)
        replayed.append(row["id"])
        results.append(ReplayResult(row["id"], row["message_id"], True, f"to {message.route}"))
    await outbox.enqueue(conn, messages)
    # A dig (one) or a plow (the N oldest): counted per route, and an addressed message
    # is queued again for its waiters.
    moves = Counter((m.route, transition) for m in messages)
    await transitions.count(conn, moves)
    addressed = [(job_marks(m.headers)[0], m.message_id) for m in messages]
    await addresses.requeue_addresses(conn, [(a, m) for a, m in addressed if a is not None])
    # A revived message starts over: its attempts and its TTR strikes are counted anew (its
    # own: by its key, not another publisher's or user's copy under the same message_id).
    keys = [r["message_key"] for r in rows if r["id"] in replayed and r["message_key"]]
    await attempts.forget(conn, keys)
    await strikes.forget(conn, keys)
    # The replay is the message's next delivery: a retry a later copy of it left is withdrawn.
    await outbox.withdraw_retries_of(conn, replayed)
    await dead_letters.mark_replayed(conn, replayed, who)
    # A hold waiting on a replayed message waits for its new delivery now.
    await holds.retry_replayed(conn, replayed)
    return results
