"""Users' package queues one at a time, and new item ids. A batch of deliveries locks and loads
its users' queues in infra/postgres/batch_read.py and saves them in batch_write.py; what is here
serves one user (the read API, the jobs, the CLI) and a purchase's new items."""

from __future__ import annotations

from datetime import datetime
from uuid import UUID

from domain.model import QueueItem
from infra.postgres.batch_read import ITEM_COLUMNS, UserRow, item_of, lock_users
from infra.postgres.pool import Conn


async def lock_user(conn: Conn, user_id: UUID) -> UserRow:
    """Create the user's row if needed and lock it until the transaction ends."""
    users, _ = await lock_users(conn, [user_id])
    return users[user_id]


async def allocate_item_ids(conn: Conn, count: int) -> tuple[list[int], datetime]:
    """`count` new item ids, and the moment they were taken (the items' created_at: taken
    under the users' locks, FIFO order (created_at, id) is the order purchases committed in)."""
    rows = await conn.fetch(
        "SELECT nextval('telecom.package_queue_id_seq') AS id, clock_timestamp() AS at "
        "FROM generate_series(1, $1)",
        count,
    )
    return [r["id"] for r in rows], rows[0]["at"]


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
