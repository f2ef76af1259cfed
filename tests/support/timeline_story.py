"""One user's story in rows of every table a timeline reads (infra/postgres/timeline.py),
written straight to Postgres: for the timeline's and the message search's tests."""

from __future__ import annotations

from datetime import datetime, timedelta
from uuid import UUID, uuid4

from infra.postgres.pool import Conn


async def story(conn: Conn, user: UUID, package: int, t0: datetime) -> UUID:
    """One row in every table the timeline reads, each at its own second after t0 (in the order
    of this function), all naming one message_id where the table keeps one. Returns it."""
    m = uuid4()
    at = [t0 + timedelta(seconds=s) for s in range(12)]
    item = await conn.fetchval(
        "INSERT INTO telecom.package_queue (user_id, package_id, status, created_at, "
        "activated_at) VALUES ($1, $2, 'active', $3, $4) RETURNING id",
        user,
        package,
        at[1],
        at[2],
    )
    await conn.execute(
        "INSERT INTO telecom.inbox (consumer, message_id, processed_at, user_id) "
        "VALUES ('package_purchase', $1, $2, $3)",
        m,
        at[0],
        user,
    )
    await conn.execute(
        "INSERT INTO telecom.usage_billed (user_id, usage_id, message_id, item_id, upload, "
        "download, billed_at, keep_until) VALUES ($1, 'u-1', $2, $3, 10, 20, $4, $4::timestamptz + "
        "interval '35 days')",
        user,
        m,
        item,
        at[3],
    )
    dead = await conn.fetchval(
        "INSERT INTO telecom.dead_letters (dedup_key, source, route, consumer, message_id, "
        "message_uuid, user_id, body, reason, error_type, error_message, first_failed_at, "
        "last_failed_at, status, replay_count, replayed_at, replayed_by) VALUES ($1, 'consumer', "
        "'telecom.package_purchase', 'package_purchase', $2::uuid::text, $2::uuid, $3, "
        "convert_to('{\"package_id\": 7}', 'UTF8'), 'domain_rule', 'UnknownPackage', 'no such "
        "package', $4, $4, 'replayed', 1, $5, 'web:olga') RETURNING id",
        f"t:{uuid4()}",
        m,
        user,
        at[4],
        at[5],
    )
    # as the dead-letter pages record a replay: the dead letter, neither user nor message
    await conn.execute(
        "INSERT INTO telecom.operator_actions (at, actor, action, dead_letter_id) "
        "VALUES ($1, 'web:olga', 'replay', $2)",
        at[5],
        dead,
    )
    await conn.execute(
        "INSERT INTO telecom.outbox (message_id, route, message_type, schema_version, user_id, "
        "body, created_at, available_at, dedup_key) VALUES ($1, 'telecom.package_purchase', "
        "'PurchasePackage', 1, $2, convert_to('{\"package_id\": 7}', 'UTF8'), $3, $3, $4)",
        m,
        user,
        at[5],
        f"replay:{dead}:0",
    )
    await conn.execute(
        "INSERT INTO telecom.holds (consumer, user_id, blocker, state, attempts, since) "
        "VALUES ('usage_record', $1, $2, 'retrying', 2, $3)",
        user,
        m,
        at[6],
    )
    await conn.execute(
        "INSERT INTO telecom.attempts (consumer, message_id, attempts, last_claim) "
        "VALUES ('usage_record', $1, 2, 0)",
        m,
    )
    await conn.execute(
        "INSERT INTO telecom.parked (consumer, user_id, message_id, route, message_type, body, "
        "parked_at) VALUES ('usage_record', $1, $2, 'telecom.usage_record', 'RecordUsage', "
        "'\\x7b7d', $3)",
        user,
        m,
        at[7],
    )
    await conn.execute(
        "INSERT INTO telecom.item_audit (item_id, user_id, action, reason, operator, message_id, "
        "at) VALUES ($1, $2, 'cancel', 'refund', 'web:olga', $3, $4)",
        item,
        user,
        m,
        at[8],
    )
    return m
