"""The benchmark's SQL (devtools/bench): resetting its own database between phases, filling
`package_queue` with other users' rows, and the counts it waits on and measures by. Never run
against a production database: `pkgq bench` works in a database of its own (`pkgq_bench`)."""

from __future__ import annotations

from collections.abc import Sequence
from datetime import datetime
from uuid import UUID

from infra.postgres.pool import Conn


async def truncate(conn: Conn, tables: Sequence[str], *, restart_identity: bool = False) -> None:
    """Empty these `telecom` tables (module constants, never input)."""
    names = ", ".join(f"telecom.{t}" for t in tables)
    await conn.execute(f"TRUNCATE {names}" + (" RESTART IDENTITY" if restart_identity else ""))


async def delete_scenario_items(conn: Conn) -> None:
    """The items of the scenario's users (those with a queue_users row), not the prefilled
    rows of other users."""
    await conn.execute(
        "DELETE FROM telecom.package_queue "
        "WHERE user_id IN (SELECT user_id FROM telecom.queue_users)"
    )


async def add_finished_items(conn: Conn, package_id: int, traffic: int, rows: int) -> None:
    """`rows` consumed items of random other users: the table a busy deployment has."""
    await conn.execute(
        """
        INSERT INTO telecom.package_queue
            (user_id, package_id, status, created_at, activated_at, upload, download)
        SELECT gen_random_uuid(), $1, 'consumed', now() - interval '1 day',
               now() - interval '1 day', $2, 0
        FROM generate_series(1, $3)
        """,
        package_id,
        traffic,
        rows,
    )


async def vacuum_analyze(conn: Conn, tables: Sequence[str]) -> None:
    """Vacuum and analyze now, so autovacuum does not compete with the next run."""
    for table in tables:
        await conn.execute(f"VACUUM (ANALYZE) telecom.{table}")


async def count_items(conn: Conn) -> int:
    return int(await conn.fetchval("SELECT count(*) FROM telecom.package_queue"))


async def count_active(conn: Conn, users: Sequence[UUID]) -> int:
    """How many of `users` have an active item."""
    return int(
        await conn.fetchval(
            "SELECT count(*) FROM telecom.package_queue "
            "WHERE status = 'active' AND user_id = ANY($1::uuid[])",
            users,
        )
    )


async def count_processed(conn: Conn, consumer: str | None = None) -> int:
    """Messages in the inbox (processed), of one consumer or of all."""
    if consumer is None:
        return int(await conn.fetchval("SELECT count(*) FROM telecom.inbox"))
    return int(
        await conn.fetchval("SELECT count(*) FROM telecom.inbox WHERE consumer = $1", consumer)
    )


async def latencies_ms(conn: Conn, since: datetime) -> list[float]:
    """Outbox insert -> consuming transaction, per message put since `since`."""
    rows = await conn.fetch(
        """
        SELECT extract(epoch FROM i.processed_at - o.created_at) * 1000 AS ms
        FROM telecom.inbox i JOIN telecom.outbox o ON o.message_id = i.sent_as
        WHERE o.created_at >= $1
        """,
        since,
    )
    return [float(r["ms"]) for r in rows]


async def seed_active_users(conn: Conn, users: Sequence[UUID], package_id: int, limit: int) -> None:
    """Give each user an active item of the package (with its access row), as after its
    activation."""
    await conn.execute(
        """
        WITH u AS (SELECT unnest($1::uuid[]) AS user_id),
        queue_users AS (
            INSERT INTO telecom.queue_users (user_id, seq, has_access)
            SELECT user_id, 1, true FROM u
        ),
        items AS (
            INSERT INTO telecom.package_queue (user_id, package_id, status, activated_at)
            SELECT user_id, $2, 'active', now() FROM u
            RETURNING id, user_id
        )
        INSERT INTO telecom.access (user_id, granted, item_id, package_id, remaining, seq)
        SELECT user_id, true, id, $2, $3, 1 FROM items
        """,
        users,
        package_id,
        limit,
    )


async def active_usage(conn: Conn, users: Sequence[UUID]) -> tuple[int, int, int]:
    """(active items, their upload, their download) of these users."""
    row = await conn.fetchrow(
        "SELECT count(*) AS n, coalesce(sum(upload), 0) AS up, "
        "coalesce(sum(download), 0) AS down FROM telecom.package_queue "
        "WHERE status = 'active' AND user_id = ANY($1::uuid[])",
        users,
    )
    assert row is not None  # an aggregate always returns its row
    return int(row["n"]), int(row["up"]), int(row["down"])


async def apply_usage_simply(
    conn: Conn, consumer: str, message_id: UUID, user_id: UUID, upload: int, download: int
) -> None:
    """The benchmark's baseline consumer, written the obvious way, in the caller's transaction:
    claim the message in the inbox, lock the user's row, add the usage to the active item."""
    claimed = await conn.fetchval(
        "INSERT INTO telecom.inbox (consumer, message_id) VALUES ($1, $2) "
        "ON CONFLICT DO NOTHING RETURNING true",
        consumer,
        message_id,
    )
    if not claimed:
        return
    await conn.execute(
        "SELECT user_id FROM telecom.queue_users WHERE user_id = $1 FOR UPDATE", user_id
    )
    await conn.execute(
        "UPDATE telecom.package_queue SET upload = upload + $2, download = download + $3 "
        "WHERE user_id = $1 AND status = 'active'",
        user_id,
        upload,
        download,
    )
