"""Data for `pkgq web bench` (the read API's and the console's benchmark), in its own
database: users with an active package, more queued behind it, some finished, and their access
rows; and a history for some of them (outbox, inbox, usage, dead letters, operator actions).
And the one statement of the bench's yardstick route (/api/v1/baseline: select_one)."""

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


async def seed_history(conn: Conn, users: Sequence[UUID], outbox_rows: int) -> None:
    """A history for each of `users` (the timeline's benchmark), set-based: `outbox_rows` published
    events spread evenly over them (a day apart per user, oldest first), half of them applied
    (inbox rows with the user), 10 billed usage records, a replayed dead letter with the
    operator's replay, and a cancel in the item audit each. The tables are emptied first and
    analyzed after, as autovacuum would."""
    await conn.execute(
        "TRUNCATE telecom.outbox, telecom.inbox, telecom.usage_billed, telecom.dead_letters, "
        "telecom.operator_actions, telecom.item_audit RESTART IDENTITY"
    )
    per_user = max(1, outbox_rows // max(1, len(users)))
    await conn.execute(
        """
        INSERT INTO telecom.outbox (message_id, route, message_type, schema_version, user_id,
                                    body, created_at, available_at, published_at)
        SELECT gen_random_uuid(), 'telecom.package_activate', 'PackageActivateEvent', 1,
               u.user_id, convert_to('{"item_id": 1, "package_id": 1}', 'UTF8'), t, t, t
        FROM unnest($1::uuid[]) WITH ORDINALITY AS u(user_id, n),
             generate_series(1, $2) AS k,
             LATERAL (SELECT now() - (k * interval '1 hour') - (u.n * interval '1 ms')) AS x(t)
        """,
        list(users),
        per_user,
    )
    await conn.execute(
        """
        INSERT INTO telecom.inbox (consumer, message_id, user_id, processed_at)
        SELECT 'package_activate', message_id, user_id, created_at + interval '10 ms'
        FROM telecom.outbox WHERE id % 2 = 0
        """
    )
    await conn.execute(
        """
        WITH u AS (SELECT unnest($1::uuid[]) AS user_id),
        usage AS (
            INSERT INTO telecom.usage_billed (user_id, usage_id, message_id, upload, download,
                                              billed_at, keep_until)
            SELECT user_id, 'bench-' || k, gen_random_uuid(), 1000, 2000,
                   now() - k * interval '3 hours', now() + interval '35 days'
            FROM u, generate_series(1, 10) AS k
        ),
        dead AS (
            INSERT INTO telecom.dead_letters
                (dedup_key, source, route, consumer, message_id, message_uuid, user_id, body,
                 reason, error_type, error_message, status, first_failed_at, last_failed_at,
                 replayed_at, replayed_by)
            SELECT 'bench:' || user_id, 'consumer', 'telecom.package_purchase',
                   'package_purchase', m::text, m, user_id,
                   convert_to('{"package_id": 9, "amount": 1}', 'UTF8'), 'domain_rule',
                   'UnknownPackage', 'package 9 is not in the catalog',
                   'replayed', now() - interval '2 hours', now() - interval '2 hours',
                   now() - interval '1 hour', 'cli:bench'
            FROM u, LATERAL (SELECT gen_random_uuid()) AS g(m)
            RETURNING id, replayed_at
        ),
        replays AS (
            INSERT INTO telecom.operator_actions (at, actor, action, dead_letter_id)
            SELECT replayed_at, 'cli:bench', 'replay', id FROM dead
        )
        INSERT INTO telecom.item_audit (item_id, user_id, action, reason, operator, message_id)
        SELECT i.id, i.user_id, 'cancel', 'bench', 'cli:bench', gen_random_uuid()
        FROM telecom.package_queue i JOIN u USING (user_id) WHERE i.status = 'in_queue'
        """,
        list(users),
    )
    await conn.execute(
        "ANALYZE telecom.outbox, telecom.inbox, telecom.usage_billed, telecom.dead_letters, "
        "telecom.operator_actions, telecom.item_audit"
    )


async def select_one(conn: Conn) -> int:
    """The baseline endpoint's statement (devtools/web_bench_app.py): the cheapest one-row
    statement, through the app's own pool."""
    return int(await conn.fetchval("SELECT 1"))
