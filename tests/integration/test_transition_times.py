"""Transition times that tell the truth, on the real database: a batch that waited for its user's
lock dates its activation after the wait, not at its transaction's start; `pkgq doctor` names
activation times made wrong by hand (before creation, out of order); migration 0021 repairs
what such rows it can, says what it changed, and gives an active time package its time back
(its expire_at, granted access and pending timer move with its activation)."""

from __future__ import annotations

import asyncio
import json
from datetime import UTC, datetime, timedelta
from uuid import UUID, uuid4

import asyncpg
import structlog

from consumers.cli import exit_codes
from consumers.delivery import DeliveryPipeline
from consumers.registry import HANDLERS
from consumers.retry_policy import RetryPolicy
from domain.delivery import Fate
from events.models import PackageQueuePushEvent, PurchasePackage, WireModel
from events.routes import PACKAGE_PURCHASE, PACKAGE_QUEUING, Route
from infra.postgres import invariants
from infra.postgres.migrate import migrate
from infra.postgres.pool import Conn
from infra.settings import Settings
from tests.support.deliveries import add_package, raw_for
from tests.support.observing import eventually
from tests.support.processes import cli

T = datetime(2026, 3, 1, 12, 0, tzinfo=UTC)
HOUR = timedelta(hours=1)


async def _apply(pool: asyncpg.Pool, route: Route, body: WireModel) -> None:
    pipeline = DeliveryPipeline(
        pool, route, HANDLERS[route.name], RetryPolicy(), max_body_bytes=2**20
    )
    (result,) = await pipeline.process_batch([raw_for(route, body)])
    assert result.fate is Fate.ACKED


async def test_an_activation_that_waited_for_its_users_lock_is_dated_after_the_wait(
    pool: asyncpg.Pool,
) -> None:
    package = await add_package(pool, 1_000, timedelta(days=30))
    user = uuid4()
    await _apply(pool, PACKAGE_PURCHASE, PurchasePackage(user_id=user, package_id=package))
    async with pool.acquire() as conn:
        item = await conn.fetchval("SELECT id FROM telecom.package_queue WHERE user_id = $1", user)
    push = PackageQueuePushEvent(user_id=user, item_ids=[item], package_id=package, pushed_at=0)

    async with pool.acquire() as holder:
        tx = holder.transaction()
        await tx.start()
        await holder.execute(
            "SELECT 1 FROM telecom.queue_users WHERE user_id = $1 FOR UPDATE", user
        )
        applying = asyncio.create_task(_apply(pool, PACKAGE_QUEUING, push))
        holder_pid = holder.get_server_pid()

        async def waiting_for_the_lock() -> bool:
            async with pool.acquire() as conn:
                return bool(
                    await conn.fetchval(
                        "SELECT EXISTS (SELECT FROM pg_stat_activity "
                        "WHERE $1 = ANY(pg_blocking_pids(pid)))",
                        holder_pid,
                    )
                )

        await eventually(waiting_for_the_lock)
        released_at = await holder.fetchval("SELECT clock_timestamp()")
        await tx.commit()
    await applying

    async with pool.acquire() as conn:
        row = await conn.fetchrow(
            "SELECT status::text, activated_at, expire_at FROM telecom.package_queue WHERE id = $1",
            item,
        )
    assert row is not None
    assert row["status"] == "active"
    assert row["activated_at"] >= released_at  # not the batch's BEGIN, before the wait
    assert row["expire_at"] == row["activated_at"] + timedelta(days=30)


async def _item(
    conn: Conn,
    user: UUID,
    package: int,
    status: str,
    created: timedelta,
    activated: timedelta | None,
    duration: timedelta | None = None,
) -> int:
    """An item written by hand, its times given from T."""
    activated_at = None if activated is None else T + activated
    expire_at = None if activated_at is None or duration is None else activated_at + duration
    item: int = await conn.fetchval(
        """
        INSERT INTO telecom.package_queue
            (user_id, package_id, status, created_at, activated_at, expire_at, package_name,
             traffic_limit, duration)
        VALUES ($1, $2, $3::telecom.package_status, $4, $5, $6, 'test', 1000, $7)
        RETURNING id
        """,
        user,
        package,
        status,
        T + created,
        activated_at,
        expire_at,
        duration,
    )
    return item


async def test_doctor_names_an_activation_before_creation_and_one_out_of_order_made_by_hand(
    settings: Settings, pool: asyncpg.Pool
) -> None:
    package = await add_package(pool, 1_000)
    broken, fine = uuid4(), uuid4()
    s = timedelta(seconds=1)
    async with pool.acquire() as conn:
        first = await _item(conn, broken, package, "consumed", 0 * s, 10 * s)
        early = await _item(conn, broken, package, "consumed", 1 * s, 5 * s)  # before `first`
        unborn = await _item(conn, broken, package, "active", 20 * s, 19 * s)  # before creation
        await _item(conn, fine, package, "consumed", 0 * s, 1 * s)
        await _item(conn, fine, package, "active", 0 * s, 1 * s)  # at the same moment: fine
        await _item(conn, fine, package, "in_queue", 2 * s, None)

    done = await cli(settings, "doctor")
    assert done.returncode == exit_codes.VIOLATIONS, done.stdout + done.stderr
    assert "activation_times: 2 violation(s)" in done.stdout
    lines = [x for x in done.stdout.splitlines() if f"user_id={broken}" in x]
    assert len(lines) == 2
    assert f"item_id={early}" in lines[0]
    assert "rule=activated before the item activated before it" in lines[0]
    assert f"previous_item_id={first}" in lines[0]
    assert f"item_id={unborn}" in lines[1]
    assert "rule=activated before it was created" in lines[1]
    assert str(fine) not in done.stdout

    as_json = await cli(settings, "doctor", "--json")
    check = next(c for c in json.loads(as_json.stdout) if c["check"] == "activation_times")
    assert check["violations"] == 2
    assert [r["item_id"] for r in check["sample"]] == [early, unborn]


async def test_migration_0021_moves_activations_up_gives_an_active_item_its_time_and_says_so(
    settings: Settings,
) -> None:
    s = timedelta(seconds=1)
    conn = await asyncpg.connect(settings.postgres_dsn)
    try:
        await conn.execute("DROP SCHEMA telecom CASCADE")
        await migrate(conn, target=20)
        package = await conn.fetchval(
            "INSERT INTO telecom.packages (name, traffic_limit, duration) "
            "VALUES ('hourly', 1000, interval '1 hour') RETURNING id"
        )
        broken, fine = uuid4(), uuid4()
        await conn.execute(
            "INSERT INTO telecom.queue_users (user_id) VALUES ($1), ($2)", broken, fine
        )
        first = await _item(conn, broken, package, "consumed", 0 * s, 10 * s, HOUR)
        unborn = await _item(conn, broken, package, "consumed", 30 * s, 29 * s)
        waited = await _item(conn, broken, package, "active", 40 * s, 35 * s, HOUR)
        in_order = [
            await _item(conn, fine, package, "consumed", 0 * s, 1 * s, HOUR),
            await _item(conn, fine, package, "active", 2 * s, 3 * s, HOUR),
        ]
        old_expiry = T + 35 * s + HOUR
        await conn.execute(
            "INSERT INTO telecom.access (user_id, granted, item_id, package_id, remaining, "
            "expire_at, seq) VALUES ($1, true, $2, $3, 1000, $4, 3)",
            broken,
            waited,
            package,
            old_expiry,
        )
        timer_body = {
            "user_id": str(broken),
            "item_id": waited,
            "package_id": package,
            "due_at": int(old_expiry.timestamp()),
        }
        await conn.execute(
            "INSERT INTO telecom.outbox (message_id, route, message_type, schema_version, "
            "user_id, seq, body, available_at, cancel_key) "
            "VALUES ($1, 'telecom.expiry_due', 'PackageExpiryDue', 1, $2, 4, $3, $4, $5)",
            uuid4(),
            broken,
            json.dumps(timer_body).encode(),
            old_expiry,
            f"expire:{waited}",
        )
        before_fine = await conn.fetch(
            "SELECT activated_at, expire_at FROM telecom.package_queue WHERE id = ANY($1) "
            "ORDER BY id",
            in_order,
        )

        with structlog.testing.capture_logs() as logs:
            assert await migrate(conn, target=21) == [21]

        times = {
            r["id"]: (r["activated_at"], r["expire_at"])
            for r in await conn.fetch(
                "SELECT id, activated_at, expire_at FROM telecom.package_queue WHERE user_id = $1",
                broken,
            )
        }
        assert times[first] == (T + 10 * s, T + 10 * s + HOUR)  # in order already: unchanged
        assert times[unborn] == (T + 30 * s, None)  # moved up to its creation
        assert times[waited] == (T + 40 * s, T + 40 * s + HOUR)  # its hour counts from there
        after_fine = await conn.fetch(
            "SELECT activated_at, expire_at FROM telecom.package_queue WHERE id = ANY($1) "
            "ORDER BY id",
            in_order,
        )
        assert after_fine == before_fine
        assert (
            await conn.fetchval("SELECT expire_at FROM telecom.access WHERE user_id = $1", broken)
            == T + 40 * s + HOUR
        )
        timer = await conn.fetchrow(
            "SELECT available_at, body FROM telecom.outbox WHERE cancel_key = $1",
            f"expire:{waited}",
        )
        assert timer is not None
        assert timer["available_at"] == T + 40 * s + HOUR
        assert json.loads(timer["body"]) == timer_body | {
            "due_at": int((T + 40 * s + HOUR).timestamp())
        }
        repairs = await conn.fetch(
            "SELECT item_id, status::text, activated_at_was, activated_at, expire_at_was, "
            "expire_at FROM telecom.transition_time_repairs ORDER BY item_id"
        )
        assert [tuple(r) for r in repairs] == [
            (unborn, "consumed", T + 29 * s, T + 30 * s, None, None),
            (waited, "active", T + 35 * s, T + 40 * s, old_expiry, T + 40 * s + HOUR),
        ]
        said = [e for e in logs if e["event"] == "migration_said" and e["version"] == 21]
        assert len(said) == 1
        assert "moved up the activation time of 2 item(s)" in said[0]["message"]
        assert "1 still active" in said[0]["message"]
        assert "1 granted access row(s) and 1 pending expiry timer(s)" in said[0]["message"]

        await migrate(conn)  # the migrations after it, for the checks of this release
        (check,) = await invariants.run_all(conn, names=[invariants.ACTIVATION_TIMES.name])
        assert check.violations == 0
    finally:
        await conn.close()
