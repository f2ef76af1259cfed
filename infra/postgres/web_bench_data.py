"""Data for `pkgq web bench` (the read API's benchmark), in its own database: users with an
active package, more queued behind it, some finished, and their access rows."""

from __future__ import annotations

from collections.abc import Sequence
from uuid import UUID

from infra.postgres.pool import Conn


async def reset_and_seed(conn: Conn, users: Sequence[UUID], package_id: int, limit: int) -> None:
    """Empty the read model's tables, then give every user 2 consumed items, 1 active (with its
    grant) and 2 queued: the shape of a queue node management reads."""
    await conn.execute(
        "TRUNCATE telecom.package_queue, telecom.queue_users, telecom.access RESTART IDENTITY"
    )
    await conn.execute(
        """
        WITH u AS (SELECT unnest($1::uuid[]) AS user_id),
        queue_users AS (
            INSERT INTO telecom.queue_users (user_id, seq, has_access)
            SELECT user_id, 3, true FROM u
        ),
        done AS (
            INSERT INTO telecom.package_queue
                (user_id, package_id, status, created_at, activated_at, upload, package_name,
                 traffic_limit)
            SELECT user_id, $2, 'consumed', now() - interval '2 days' + k * interval '1 hour',
                   now() - interval '2 days', $3, 'bench', $3
            FROM u, generate_series(1, 2) AS k
        ),
        waiting AS (
            INSERT INTO telecom.package_queue
                (user_id, package_id, status, created_at, package_name, traffic_limit)
            SELECT user_id, $2, 'in_queue', now() - interval '1 hour' + k * interval '1 minute',
                   'bench', $3
            FROM u, generate_series(1, 2) AS k
        ),
        items AS (
            INSERT INTO telecom.package_queue
                (user_id, package_id, status, created_at, activated_at, expire_at, upload,
                 package_name, traffic_limit, duration)
            SELECT user_id, $2, 'active', now() - interval '1 day', now() - interval '1 hour',
                   now() + interval '29 days', $3 / 4, 'bench', $3, interval '30 days'
            FROM u
            RETURNING id, user_id
        )
        INSERT INTO telecom.access (user_id, granted, item_id, package_id, remaining, seq,
                                    expire_at)
        SELECT user_id, true, id, $2, $3 - $3 / 4, 3, now() + interval '29 days' FROM items
        """,
        list(users),
        package_id,
        limit,
    )
    await conn.execute("ANALYZE telecom.package_queue, telecom.queue_users, telecom.access")
