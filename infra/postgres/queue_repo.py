"""Lock, load and save users' package queues (the `UserQueue` aggregate) inside a transaction:
one statement each for a whole batch of users, whatever its size.

Items carry the terms they were bought with (package_name, traffic_limit, duration: copied at
purchase), so loading them never joins the catalog: a catalog edit cannot reach a bought item.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from datetime import datetime
from typing import Any
from uuid import UUID

import asyncpg

from domain.model import BilledUsage, ItemStatus, QueueItem, Terms
from domain.queue import UserQueue
from domain.records import record
from infra.postgres.compound import Part
from infra.postgres.pool import Conn, columns, in_uuid_order

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


async def lock_user(conn: Conn, user_id: UUID) -> UserRow:
    """Create the user's row if needed and lock it until the transaction ends."""
    users, _ = await lock_users(conn, [user_id])
    return users[user_id]


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


async def allocate_item_ids(conn: Conn, count: int) -> tuple[list[int], datetime]:
    """`count` new item ids, and the moment they were taken (the items' created_at: taken
    under the users' locks, FIFO order (created_at, id) is the order purchases committed in)."""
    rows = await conn.fetch(
        "SELECT nextval('telecom.package_queue_id_seq') AS id, clock_timestamp() AS at "
        "FROM generate_series(1, $1)",
        count,
    )
    return [r["id"] for r in rows], rows[0]["at"]


def _counters_update(first: int) -> str:
    """The update of items' traffic counters from three arrays (id, upload, download), taken
    as parameters $first to $first+2: a statement of its own, or a CTE of the upsert."""
    ids, uploads, downloads = (f"${first + n}::bigint[]" for n in range(3))
    return f"""
        UPDATE telecom.package_queue AS q SET upload = c.upload, download = c.download
        FROM unnest({ids}, {uploads}, {downloads}) AS c(id, upload, download)
        WHERE q.id = c.id
    """


_COUNTERS = _counters_update(1)
_COUNTERS_CTE = _counters_update(18)


def _only_counters_differ(item: QueueItem, was: QueueItem) -> bool:
    """Whether `item` differs from how it was loaded in its traffic counters alone (a usage
    billed to it), the only change the counters' update writes. Its terms, id, user, order and
    creation never change once it is bought."""
    return (
        item.status is was.status
        and item.activated_at == was.activated_at
        and item.adjust_quota == was.adjust_quota
        and item.expire_at == was.expire_at
    )


def _counter_columns(items: list[QueueItem]) -> list[list[int]]:
    return [[i.id for i in items], [i.upload for i in items], [i.download for i in items]]


def save(queues: Iterable[LoadedQueue]) -> list[Part[None]]:
    """New and changed items with the orders bought, and changed user rows: up to two parts
    of the batch's write statement (infra/postgres/compound.py)."""
    items: list[QueueItem] = []
    counted: list[QueueItem] = []
    users: list[LoadedQueue] = []
    orders: list[tuple[UUID, UUID, tuple[int, ...]]] = []
    for loaded in queues:
        queue = loaded.queue
        orders.extend(
            (queue.user_id, order, ids)
            for order, ids in queue.orders.items()
            if order not in loaded.orders_before
        )
        before = loaded.items_before
        for item in queue.items:
            was = before.get(item.id)
            if was is None:
                items.append(item)
            elif item != was:
                (counted if _only_counters_differ(item, was) else items).append(item)
        user_after = (queue.unbilled_upload, queue.unbilled_download, queue.has_access)
        if user_after != loaded.user_before or loaded.seq != loaded.seq_before:
            users.append(loaded)
    parts: list[Part[None]] = []
    if counted and not items:
        # Usage billed to items that change nothing else (most of a usage batch): three short
        # arrays instead of the upsert's fourteen, and a plain update instead of a speculative
        # insert. With other items to write as well, it rides on their part (below).
        parts.append(
            Part((("queue_counted", _COUNTERS),), tuple(_counter_columns(counted)), _ITEM_TABLES)
        )
    elif items:
        # Items leaving `active` are written before the ones entering it (the rows go in in
        # this order), so the partial unique index (one active item per user) never sees two.
        items.sort(key=lambda i: i.status is ItemStatus.ACTIVE)
        # An order bought comes with its new items, so it rides on their part. No ON CONFLICT
        # there: under the users' locks an order is never bought twice, so a conflict would
        # be a bug, and the key refuses it rather than hide it.
        args = (
            *columns(items, "id", "user_id", "package_id", "by_order", "status.value"),
            *columns(items, "created_at", "activated_at", "upload", "download", "adjust_quota"),
            *columns(items, "expire_at", "terms.package_name", "terms.traffic_limit"),
            *columns(items, "terms.duration"),
            [u for u, _, ids in orders for _ in ids],
            [o for _, o, ids in orders for _ in ids],
            [i for _, _, ids in orders for i in ids],
            *_counter_columns(counted),
        )
        parts.append(Part(_UPSERT, args, _ITEM_TABLES))
    if users:
        args = (
            *columns(users, "queue.user_id", "queue.unbilled_upload", "queue.unbilled_download"),
            *columns(users, "queue.has_access", "seq"),
        )
        parts.append(Part((("queue_users_saved", _USERS),), args, frozenset({"queue_users"})))
    return parts


_ITEM_TABLES = frozenset({"package_queue", "orders"})
_UPSERT = (
    (
        "queue_bought",
        """
        INSERT INTO telecom.orders (user_id, by_order, item_ids)
        SELECT o.user_id, o.by_order, array_agg(o.item_id ORDER BY o.item_id)
        FROM unnest($15::uuid[], $16::uuid[], $17::bigint[]) AS o(user_id, by_order, item_id)
        GROUP BY o.user_id, o.by_order
        """,
    ),
    # Items whose counters alone changed: never among the rows the upsert writes.
    ("queue_counted", _COUNTERS_CTE),
    (
        "queue_saved",
        """
        INSERT INTO telecom.package_queue AS q
            (id, user_id, package_id, by_order, status, created_at, activated_at,
             upload, download, adjust_quota, expire_at, package_name, traffic_limit, duration)
        SELECT x.id, x.user_id, x.package_id, x.by_order, x.status::telecom.package_status,
               x.created_at, x.activated_at, x.upload, x.download, x.adjust_quota, x.expire_at,
               x.package_name, x.traffic_limit, x.duration
        FROM unnest($1::bigint[], $2::uuid[], $3::bigint[], $4::uuid[], $5::text[],
                    $6::timestamptz[], $7::timestamptz[], $8::bigint[], $9::bigint[],
                    $10::bigint[], $11::timestamptz[], $12::text[], $13::bigint[],
                    $14::interval[])
             WITH ORDINALITY AS x(id, user_id, package_id, by_order, status, created_at,
                                  activated_at, upload, download, adjust_quota, expire_at,
                                  package_name, traffic_limit, duration, ord)
        ORDER BY x.ord
        -- the terms are written once, at purchase, and never updated
        ON CONFLICT (id) DO UPDATE SET
            status = EXCLUDED.status, activated_at = EXCLUDED.activated_at,
            upload = EXCLUDED.upload, download = EXCLUDED.download,
            adjust_quota = EXCLUDED.adjust_quota, expire_at = EXCLUDED.expire_at
        """,
    ),
)
_USERS = """
    UPDATE telecom.queue_users u
    SET unbilled_upload = x.up, unbilled_download = x.down, has_access = x.access,
        seq = x.seq, updated_at = now()
    FROM unnest($1::uuid[], $2::bigint[], $3::bigint[], $4::bool[], $5::bigint[])
         AS x(user_id, up, down, access, seq)
    WHERE u.user_id = x.user_id
"""


async def load_user_items(conn: Conn, user_id: UUID) -> list[QueueItem]:
    """GetAllMyPackages, read-only: every item of the user in queue order."""
    rows = await conn.fetch(
        f"""
        SELECT {ITEM_COLUMNS} FROM telecom.package_queue q
        WHERE q.user_id = $1 ORDER BY q.created_at, q.id
        """,
        user_id,
    )
    return [item_of(r) for r in rows]


async def item_owner(conn: Conn, item_id: int) -> UUID | None:
    owner: UUID | None = await conn.fetchval(
        "SELECT user_id FROM telecom.package_queue WHERE id = $1", item_id
    )
    return owner


async def next_seqs(conn: Conn, user_id: UUID, count: int) -> list[int]:
    """Take `count` numbers from the user's event sequence (the user row must be locked)."""
    last = await conn.fetchval(
        "UPDATE telecom.queue_users SET seq = seq + $2 WHERE user_id = $1 RETURNING seq",
        user_id,
        count,
    )
    return list(range(last - count + 1, last + 1))
