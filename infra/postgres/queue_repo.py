"""Load and save a user's package queue (the `UserQueue` aggregate) inside a transaction."""

from __future__ import annotations

import dataclasses
from collections.abc import Iterable
from dataclasses import dataclass
from uuid import UUID

import asyncpg

from domain.model import ItemStatus, Package, QueueItem
from domain.queue import UserQueue
from infra.postgres.pool import Conn

_ITEM_COLUMNS = """
    q.id, q.user_id, q.package_id, q.by_order, q.status::text AS status, q.created_at,
    q.activated_at, q.upload, q.download, q.adjust_quota, q.expire_at,
    p.name AS package_name, p.traffic_limit, p.duration
"""


@dataclass(slots=True)
class LoadedQueue:
    """A locked, loaded queue and the state it was loaded in (to write back only what changed)."""

    queue: UserQueue
    items_before: dict[int, QueueItem]
    user_before: tuple[int, int, bool]
    seq: int
    """The user's event sequence as loaded; `take_seqs` moves it on, `save_queue` writes it."""
    seq_before: int = 0

    def take_seqs(self, count: int) -> list[int]:
        """The next `count` numbers of the user's event sequence (written by save_queue)."""
        first = self.seq + 1
        self.seq += count
        return list(range(first, self.seq + 1))


def _item(row: asyncpg.Record) -> QueueItem:
    return QueueItem(
        id=row["id"],
        user_id=row["user_id"],
        package=Package(
            row["package_id"], row["package_name"], row["traffic_limit"], row["duration"]
        ),
        by_order=row["by_order"],
        status=ItemStatus(row["status"]),
        created_at=row["created_at"],
        activated_at=row["activated_at"],
        upload=row["upload"],
        download=row["download"],
        adjust_quota=row["adjust_quota"],
        expire_at=row["expire_at"],
    )


_LOCK_USER = "SELECT * FROM telecom.queue_users WHERE user_id = $1 FOR UPDATE"


async def lock_user(conn: Conn, user_id: UUID) -> asyncpg.Record:
    """Create the user's row if needed and lock it until the transaction ends."""
    row = await conn.fetchrow(_LOCK_USER, user_id)  # one round trip for a known user
    if row is None:
        await conn.execute(
            "INSERT INTO telecom.queue_users (user_id) VALUES ($1) ON CONFLICT DO NOTHING",
            user_id,
        )
        row = await conn.fetchrow(_LOCK_USER, user_id)
    assert row is not None  # inserted above, and user rows are never deleted
    return row


async def load_queue(conn: Conn, user_id: UUID, extra_item_ids: Iterable[int] = ()) -> LoadedQueue:
    """Lock the user and load their live items plus `extra_item_ids` (targets of a command)."""
    user = await lock_user(conn, user_id)
    rows = await conn.fetch(
        f"""
        SELECT {_ITEM_COLUMNS} FROM telecom.package_queue q
        JOIN telecom.packages p ON p.id = q.package_id
        WHERE q.user_id = $1 AND q.status IN ('in_queue', 'active')
        UNION
        SELECT {_ITEM_COLUMNS} FROM telecom.package_queue q
        JOIN telecom.packages p ON p.id = q.package_id
        WHERE q.user_id = $1 AND q.id = ANY($2::bigint[])
        """,
        user_id,
        list(extra_item_ids),
    )
    items = [_item(r) for r in rows]
    queue = UserQueue(
        user_id=user_id,
        items=items,
        unbilled_upload=user["unbilled_upload"],
        unbilled_download=user["unbilled_download"],
        has_access=user["has_access"],
    )
    return LoadedQueue(
        queue=queue,
        items_before={i.id: dataclasses.replace(i) for i in items},
        user_before=(user["unbilled_upload"], user["unbilled_download"], user["has_access"]),
        seq=user["seq"],
        seq_before=user["seq"],
    )


async def allocate_item_ids(conn: Conn, count: int) -> list[int]:
    rows = await conn.fetch(
        "SELECT nextval('telecom.package_queue_id_seq') AS id FROM generate_series(1, $1)", count
    )
    return [r["id"] for r in rows]


async def save_queue(conn: Conn, loaded: LoadedQueue) -> None:
    """Write back new and changed items and the user's row."""
    queue = loaded.queue
    new = [i for i in queue.items if i.id not in loaded.items_before]
    changed = [
        i for i in queue.items if i.id in loaded.items_before and i != loaded.items_before[i.id]
    ]
    if new:
        await conn.executemany(
            """
            INSERT INTO telecom.package_queue
                (id, user_id, package_id, by_order, status, created_at, activated_at,
                 upload, download, adjust_quota, expire_at)
            VALUES ($1, $2, $3, $4, $5::telecom.package_status, $6, $7, $8, $9, $10, $11)
            """,
            [
                (
                    i.id,
                    i.user_id,
                    i.package_id,
                    i.by_order,
                    i.status.value,
                    i.created_at,
                    i.activated_at,
                    i.upload,
                    i.download,
                    i.adjust_quota,
                    i.expire_at,
                )
                for i in new
            ],
        )
    if changed:
        # Items leaving `active` are written before the one entering it, so the partial unique
        # index (one active item per user) never sees two at once.
        changed.sort(key=lambda i: i.status is ItemStatus.ACTIVE)
        await conn.executemany(
            """
            UPDATE telecom.package_queue
            SET status = $2::telecom.package_status, activated_at = $3, upload = $4,
                download = $5, adjust_quota = $6, expire_at = $7
            WHERE id = $1
            """,
            [
                (
                    i.id,
                    i.status.value,
                    i.activated_at,
                    i.upload,
                    i.download,
                    i.adjust_quota,
                    i.expire_at,
                )
                for i in changed
            ],
        )
    user_after = (queue.unbilled_upload, queue.unbilled_download, queue.has_access)
    if user_after != loaded.user_before or loaded.seq != loaded.seq_before:
        await conn.execute(
            """
            UPDATE telecom.queue_users
            SET unbilled_upload = $2, unbilled_download = $3, has_access = $4, seq = $5,
                updated_at = now()
            WHERE user_id = $1
            """,
            queue.user_id,
            *user_after,
            loaded.seq,
        )


async def load_user_items(conn: Conn, user_id: UUID) -> list[QueueItem]:
    """GetAllMyPackages, read-only: every item of the user in queue order."""
    rows = await conn.fetch(
        f"""
        SELECT {_ITEM_COLUMNS} FROM telecom.package_queue q
        JOIN telecom.packages p ON p.id = q.package_id
        WHERE q.user_id = $1 ORDER BY q.created_at, q.id
        """,
        user_id,
    )
    return [_item(r) for r in rows]
