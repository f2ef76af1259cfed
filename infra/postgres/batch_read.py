"""A batch's reads, under its users' locks: every statement that locks and loads what a batch of
deliveries is decided on (consumers/delivery/decide.py), one statement each whatever the
batch's size.

1. `lock_users`: the users' rows, created if missing, locked in user_id order;
2. `read_locked`: in one statement, their holds on the consumer (locked), which of the batch's
   messages the consumer applied before or saw fail, and the users' items;
3. `load_orders`, `load_billed`: the orders purchases name and the billing record ids usage
   records name, when the route's messages need them;
4. `lock_members`: the group members among the messages, locked until commit (a cancel waits
   for the batch, or the batch sees the cancel).

`read_locked` runs after the users' rows are locked, so it keeps the lock order of every writer
of holds (user, then hold), and no other transaction can change the users' items or apply one
of their messages meanwhile: what the statement's snapshot reads of them is what is there. A
hold row changed after that snapshot was taken is locked in its newest version (FOR UPDATE in
READ COMMITTED). Its three reads come back as the rows of one result (UNION ALL): each kind of
row fills its own columns and leaves the others NULL. Every row of the holds' CTE is read, so
every one is locked. A message that has nothing to say (not applied, no failure) sends no row:
in a backlog, none of a batch's messages do.

Items carry the terms they were bought with (package_name, traffic_limit, duration: copied at
purchase), so loading them never joins the catalog: a catalog edit cannot reach a bought item.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import Any
from uuid import UUID

import asyncpg

from domain.delivery import Hold
from domain.model import BilledUsage, ItemStatus, QueueItem, Terms
from domain.queue import UserQueue
from domain.records import record
from infra.postgres.pool import Conn, in_uuid_order

ITEM_COLUMNS = """
    q.id, q.user_id, q.package_id, q.by_order, q.status::text AS status, q.created_at,
    q.activated_at, q.upload, q.download, q.adjust_quota, q.expire_at,
    q.package_name, q.traffic_limit, q.duration
"""


@dataclass(slots=True)
class LoadedQueue:
    """A locked, loaded queue and the state it was loaded in (to write back only what changed)."""

    queue: UserQueue
    items_before: dict[int, QueueItem]
    user_before: tuple[int, int, bool]
    seq: int
    """The user's event sequence as loaded; `take_seqs` moves it on, `save` writes it."""
    seq_before: int = 0
    orders_before: frozenset[UUID] = frozenset()
    """The orders (by_order) loaded as bought: `save` writes the ones bought since."""
    usages_before: frozenset[str] = frozenset()
    """The billing record ids loaded as billed: the batch writes the ones billed since."""

    def as_loaded(self) -> LoadedQueue:
        """A fresh queue as this one was loaded (a failed first message's rollback): the items
        as loaded, copied, the user row and sequence as read, and the orders and billed usages
        loaded with it (entries are only ever added to those)."""
        queue = self.queue
        upload, download, has_access = self.user_before
        fresh = UserQueue(
            user_id=queue.user_id,
            items=[item.copy() for item in self.items_before.values()],
            unbilled_upload=upload,
            unbilled_download=download,
            has_access=has_access,
            orders={k: v for k, v in queue.orders.items() if k in self.orders_before},
            usages={k: v for k, v in queue.usages.items() if k in self.usages_before},
        )
        return LoadedQueue(
            fresh,
            self.items_before,
            self.user_before,
            self.seq_before,
            self.seq_before,
            self.orders_before,
            self.usages_before,
        )

    def take_seqs(self, count: int) -> list[int]:
        """The next `count` numbers of the user's event sequence (written by save)."""
        first = self.seq + 1
        self.seq += count
        return list(range(first, self.seq + 1))


_STATUS = {status.value: status for status in ItemStatus}


def item_of(row: asyncpg.Record) -> QueueItem:
    """An item from its ITEM_COLUMNS, by name (every loaded item of every batch comes this
    way: spelled out rather than from_row's lookup of the fields)."""
    return QueueItem(
        id=row["id"],
        user_id=row["user_id"],
        terms=Terms(row["package_id"], row["package_name"], row["traffic_limit"], row["duration"]),
        by_order=row["by_order"],
        status=_STATUS[row["status"]],
        created_at=row["created_at"],
        activated_at=row["activated_at"],
        upload=row["upload"],
        download=row["download"],
        adjust_quota=row["adjust_quota"],
        expire_at=row["expire_at"],
    )


@record
class UserRow:
    """A locked `queue_users` row as it was read."""

    user_id: UUID
    unbilled_upload: int
    unbilled_download: int
    has_access: bool
    seq: int


# ON CONFLICT DO UPDATE (a no-op update) locks existing rows like FOR UPDATE, waits for rows
# another transaction is inserting, and returns inserted and existing rows alike; the rows are
# taken in user_id order, so two batches never lock the same users in opposite orders.
# RETURNING is computed for each row once it is locked: the latest clock_timestamp() of them
# is read with every user locked (now() is the transaction's start, before any wait for them).
_LOCK_USERS = """
    INSERT INTO telecom.queue_users AS u (user_id)
    SELECT x FROM unnest($1::uuid[]) AS x ORDER BY x
    ON CONFLICT (user_id) DO UPDATE SET user_id = u.user_id
    RETURNING u.user_id, u.unbilled_upload, u.unbilled_download, u.has_access, u.seq,
              clock_timestamp() AS locked_at
"""


async def lock_users(conn: Conn, user_ids: Iterable[UUID]) -> tuple[dict[UUID, UserRow], datetime]:
    """Create missing user rows and lock all of them until the transaction ends, in one
    statement. Returns the rows and the batch's clock: the moment every one of them was locked,
    by which the batch dates its transitions (an activation, and a time package's expire_at
    from it, is the moment it happened, not when the transaction began to wait for the user)."""
    wanted = in_uuid_order(user_ids)
    if not wanted:
        now: datetime = await conn.fetchval("SELECT clock_timestamp()")
        return {}, now
    rows = await conn.fetch(_LOCK_USERS, wanted)
    users = {}
    locked_at = rows[0]["locked_at"]
    for r in rows:
        users[r["user_id"]] = UserRow(
            r["user_id"], r["unbilled_upload"], r["unbilled_download"], r["has_access"], r["seq"]
        )
        locked_at = max(locked_at, r["locked_at"])
    return users, locked_at


async def load_orders(
    conn: Conn, orders: Iterable[tuple[UUID, UUID]]
) -> dict[UUID, dict[UUID, tuple[int, ...]]]:
    """Which of these (user, by_order) pairs were bought, with their items, in one statement.
    Run under the users' locks: no other transaction can buy one of them meanwhile."""
    pairs = sorted(set(orders))
    if not pairs:
        return {}
    rows = await conn.fetch(
        """
        SELECT o.user_id, o.by_order, o.item_ids FROM telecom.orders o
        JOIN unnest($1::uuid[], $2::uuid[]) AS x(user_id, by_order)
          ON o.user_id = x.user_id AND o.by_order = x.by_order
        """,
        [u for u, _ in pairs],
        [o for _, o in pairs],
    )
    found: dict[UUID, dict[UUID, tuple[int, ...]]] = {}
    for row in rows:
        found.setdefault(row["user_id"], {})[row["by_order"]] = tuple(row["item_ids"])
    return found


_NONE: frozenset[Any] = frozenset()
"""The orders or billed usages loaded for a user who has none (shared: never changed)."""


def loaded_queue(
    user: UserRow,
    items: list[QueueItem],
    orders: dict[UUID, tuple[int, ...]] | None = None,
    usages: dict[str, BilledUsage] | None = None,
) -> LoadedQueue:
    """A locked user's queue, with the state it was loaded in (made for every user of every
    batch: loops and shared empty sets rather than comprehensions and copies of nothing)."""
    before: dict[int, QueueItem] = {}
    for item in items:
        before[item.id] = item.copy()
    queue = UserQueue(
        user.user_id,
        items,
        user.unbilled_upload,
        user.unbilled_download,
        user.has_access,
        dict(orders) if orders else {},
        dict(usages) if usages else {},
    )
    return LoadedQueue(
        queue,
        before,
        (user.unbilled_upload, user.unbilled_download, user.has_access),
        user.seq,
        user.seq,
        frozenset(orders) if orders else _NONE,
        frozenset(usages) if usages else _NONE,
    )


async def load_billed(
    conn: Conn, wanted: Iterable[tuple[UUID, str]]
) -> dict[UUID, dict[str, BilledUsage]]:
    """Which of these (user, usage_id) pairs were billed, and how, in one statement (none when
    the batch names no record id)."""
    pairs = sorted(set(wanted))
    if not pairs:
        return {}
    rows = await conn.fetch(
        """
        SELECT b.user_id, b.usage_id, b.item_id, b.upload, b.download, b.recorded_at
        FROM telecom.usage_billed b
        JOIN unnest($1::uuid[], $2::text[]) AS x(user_id, usage_id)
          ON b.user_id = x.user_id AND b.usage_id = x.usage_id
        """,
        [u for u, _ in pairs],
        [i for _, i in pairs],
    )
    found: dict[UUID, dict[str, BilledUsage]] = {}
    for r in rows:
        found.setdefault(r["user_id"], {})[r["usage_id"]] = BilledUsage(
            r["item_id"], r["upload"], r["download"], r["recorded_at"]
        )
    return found


async def lock_members(conn: Conn, message_ids: Sequence[UUID]) -> dict[UUID, str]:
    """Lock the group-member rows of these messages (in message_id order, the lock order a
    cancel takes them in) and return their states; messages that are no members are left out."""
    if not message_ids:
        return {}
    rows = await conn.fetch(
        "SELECT message_id, state FROM telecom.group_members WHERE message_id = ANY($1::uuid[]) "
        "ORDER BY message_id FOR UPDATE",
        sorted(set(message_ids)),
    )
    return {r["message_id"]: r["state"] for r in rows}


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
