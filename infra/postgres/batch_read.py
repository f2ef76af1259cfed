"""A batch's one read under its users' locks: their holds on the consumer (locked), which of
its messages the consumer applied before or saw fail, and the users' items, in one statement.

It runs after the users' rows are locked (queue_repo.lock_users), so it keeps the lock order
of every writer of holds (user, then hold), and no other transaction can change the users'
items or apply one of their messages meanwhile: what the statement's snapshot reads of them is
what is there. A hold row changed after that snapshot was taken is locked in its newest
version (FOR UPDATE in READ COMMITTED), as it was when the lock was a statement of its own.

The three reads come back as the rows of one result (UNION ALL): each kind of row fills its own
columns and leaves the others NULL. Every row of the holds' CTE is read, so every one is locked.
A message that has nothing to say (not applied, no failure) sends no row: in a backlog, none
of a batch's messages do.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from uuid import UUID

from domain.delivery import Hold
from domain.model import QueueItem
from infra.postgres.pool import Conn, in_uuid_order
from infra.postgres.queue_repo import ITEM_COLUMNS, item_of

_ITEM_NULLS = ", ".join(["NULL"] * len(ITEM_COLUMNS.split(",")))
"""An item's columns left empty (typed by the first branch of the UNION)."""

_READ = f"""
WITH held AS (
    SELECT user_id, telecom.blocker_key(consumer, user_id, blocker, blocker_key, blocker_key_of)
               AS blocker_key, state
    FROM telecom.holds
    WHERE consumer = $1 AND user_id = ANY($2::uuid[]) ORDER BY user_id FOR UPDATE
),
states AS MATERIALIZED (
    SELECT m.k AS message_key,
           EXISTS (SELECT 1 FROM telecom.inbox i WHERE i.consumer = $1 AND i.message_id = m.k)
           -- a row from before keys (migration 0022) is kept by its message_id
           OR EXISTS (SELECT 1 FROM telecom.inbox i
                      WHERE i.consumer = $1 AND i.message_id = m.id AND i.sent_as IS NULL)
           -- done with for good, however long ago the inbox forgot it: an operator discarded
           -- its letter, or it was applied since its letter was filed (superseded)
           OR EXISTS (SELECT 1 FROM telecom.dead_letters d
                      WHERE d.consumer = $1 AND d.message_key = m.k
                        AND d.status IN ('discarded', 'superseded'))
              AS seen,
           (SELECT a.attempts FROM telecom.attempts a
            WHERE a.consumer = $1 AND a.message_id = m.k AND a.generation = 0) AS attempts
    FROM unnest($3::uuid[], $6::uuid[]) AS m(k, id)
)
SELECT {ITEM_COLUMNS},
       NULL::uuid AS said_message_key, NULL::boolean AS said_seen, NULL::integer AS said_attempts,
       NULL::uuid AS held_user_id, NULL::uuid AS held_blocker, NULL::text AS held_state
FROM telecom.package_queue q
WHERE q.user_id = ANY($4::uuid[])
  AND (q.status IN ('in_queue', 'active') OR q.id = ANY($5::bigint[]))
UNION ALL
SELECT {_ITEM_NULLS}, message_key, seen, attempts, NULL, NULL, NULL
FROM states WHERE seen OR attempts IS NOT NULL
UNION ALL
SELECT {_ITEM_NULLS}, NULL, NULL, NULL, user_id, blocker_key, state FROM held
"""


@dataclass(slots=True)
class LockedRead:
    held: dict[UUID, Hold]
    """The users' holds on the consumer, locked until the transaction ends."""
    seen: set[UUID]
    """Keys of messages the consumer is done with: applied before (the inbox), or whose dead
    letter an operator discarded or their application superseded (the durable record, which
    outlives the inbox's retention)."""
    counted: dict[UUID, int]
    """Failed attempts of messages that failed before, by key (absent: none)."""
    items: dict[UUID, list[QueueItem]]
    """The item owners' live items plus the extra items asked for, by user."""


async def read_locked(
    conn: Conn,
    consumer: str,
    *,
    hold_users: Sequence[UUID],
    keys: Sequence[tuple[UUID, UUID]],
    item_users: Sequence[UUID],
    extra_item_ids: Sequence[int] = (),
) -> LockedRead:
    """Inside the batch's transaction, after its users' rows are locked: the holds of
    `hold_users` (locked, in user_id order), the states of the messages `keys` names (each
    message's key and message_id: events/identity.py), and the live items
    of `item_users` with `extra_item_ids` of theirs (targets of commands and events)."""
    read = LockedRead({}, set(), {}, {})
    if not (hold_users or keys or item_users):
        return read
    unique = list(dict.fromkeys(keys))
    rows = await conn.fetch(
        _READ,
        consumer,
        in_uuid_order(hold_users),
        [k for k, _ in unique],
        in_uuid_order(item_users),
        sorted(set(extra_item_ids)),
        [m for _, m in unique],
    )
    for row in rows:
        if row["id"] is not None:
            read.items.setdefault(row["user_id"], []).append(item_of(row))
        elif row["said_message_key"] is not None:
            if row["said_seen"]:
                read.seen.add(row["said_message_key"])
            if row["said_attempts"] is not None:
                read.counted[row["said_message_key"]] = row["said_attempts"]
        else:
            read.held[row["held_user_id"]] = Hold(row["held_blocker"], row["held_state"])
    return read
