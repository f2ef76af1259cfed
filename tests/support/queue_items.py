"""Users' queues made by hand: for the read side's tests, many items in a known queue order
that differs from their id order, with ties on created_at (as one purchase's items have); for
the write side's, users with one active item (`active_users`) and their items' counters."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from uuid import UUID, uuid4

import asyncpg

from devtools.postgres import bench_data
from tests.support.deliveries import add_package

BOUGHT_AT = datetime(2024, 1, 1, 12, 0, tzinfo=UTC)


def statuses(count: int) -> list[str]:
    """`count` statuses as a queue that has run a while: the first third consumed or
    cancelled, then one active item, the rest queued."""
    gone = count // 3
    done = ["consumed" if n % 4 else "cancelled" for n in range(gone)]
    return done + (["active"] if count > gone else []) + ["in_queue"] * max(count - gone - 1, 0)


async def queue_of(
    pool: asyncpg.Pool, user: UUID, count: int, *, bought_at: datetime = BOUGHT_AT
) -> list[int]:
    """Give `user` `count` items and return their ids in queue order (created_at, id): as
    `statuses` says for a user who has none yet, all queued for one who has. Items come in
    purchases of three sharing a created_at, one a second from `bought_at` on; the later
    purchases are inserted first, so id order is not queue order."""
    package = await add_package(pool, 1000, name="plan")
    async with pool.acquire() as conn:
        await conn.execute(
            "INSERT INTO telecom.queue_users (user_id) VALUES ($1) ON CONFLICT DO NOTHING", user
        )
        had = await conn.fetchval(
            "SELECT count(*) FROM telecom.package_queue WHERE user_id = $1", user
        )
        wanted = ["in_queue"] * count if had else statuses(count)
        keyed: list[tuple[datetime, int]] = []
        for start in reversed(range(0, count, 3)):
            created_at = bought_at + timedelta(seconds=start)
            for n in range(start, min(start + 3, count)):
                item_id = await conn.fetchval(
                    "INSERT INTO telecom.package_queue (user_id, package_id, status, "
                    "package_name, traffic_limit, created_at, activated_at) "
                    "VALUES ($1, $2, $3::telecom.package_status, 'plan', 1000, $4, "
                    "CASE WHEN $3 = 'in_queue' THEN NULL ELSE $4::timestamptz END) "
                    "RETURNING id",
                    user,
                    package,
                    wanted[n],
                    created_at,
                )
                keyed.append((created_at, item_id))
    return [item_id for _, item_id in sorted(keyed)]


async def active_users(pool: asyncpg.Pool, count: int, *, limit: int, name: str) -> list[UUID]:
    """`count` new users, each with one active item of a package `name` of `limit` bytes (and
    its access row), as after its activation."""
    users = [uuid4() for _ in range(count)]
    package = await add_package(pool, limit, name=name)
    async with pool.acquire() as conn:
        await bench_data.seed_active_users(conn, users, package, limit)
    return users


async def item_counters(pool: asyncpg.Pool, users: list[UUID]) -> dict[UUID, tuple[str, int, int]]:
    """Each user's item (the one of `active_users`): its status, upload and download."""
    async with pool.acquire() as conn:
        rows = await conn.fetch(
            "SELECT user_id, status::text AS status, upload, download FROM telecom.package_queue "
            "WHERE user_id = ANY($1::uuid[])",
            users,
        )
    return {r["user_id"]: (r["status"], r["upload"], r["download"]) for r in rows}
