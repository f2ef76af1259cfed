"""Least privilege in Postgres: the owner migrates, the runtime role only reads and writes rows,
the reaper works under the runtime role, and a missing grant is waited out, never buried."""

from __future__ import annotations

import subprocess
from collections.abc import AsyncIterator
from uuid import uuid4

import asyncpg
import pytest
import structlog
from aio_pika.abc import AbstractRobustConnection

from consumers.runtime import services
from events.models import PurchasePackage
from events.routes import PACKAGE_PURCHASE
from infra.postgres import workers
from infra.postgres.migrate import RuntimeRoleMissingError, migrate
from infra.postgres.pool import create_pool
from infra.rabbit.tap import Tap
from infra.settings import Settings
from tests.support import pg_roles
from tests.support.deliveries import add_package, send
from tests.support.in_process import StartApp
from tests.support.observing import eventually
from tests.support.workers import stale_worker


def runtime_dsn(settings: Settings) -> str:
    return pg_roles.as_role(settings.postgres_dsn, pg_roles.RUNTIME)


@pytest.fixture
async def runtime_pool(settings: Settings) -> AsyncIterator[asyncpg.Pool]:
    pool = await create_pool(runtime_dsn(settings), min_size=1, max_size=5)
    yield pool
    await pool.close()


async def test_the_runtime_role_writes_rows_but_cannot_change_the_schema_or_its_history(
    settings: Settings,
) -> None:
    conn = await asyncpg.connect(runtime_dsn(settings))
    try:
        role = await conn.fetchrow(
            "SELECT rolsuper, rolcreatedb, rolcreaterole FROM pg_roles WHERE rolname = $1",
            pg_roles.RUNTIME,
        )
        assert role is not None
        assert not any(role.values())
        async with conn.transaction():
            await conn.execute("INSERT INTO telecom.queue_users (user_id) VALUES ($1)", uuid4())
            await conn.execute("DELETE FROM telecom.queue_users")
        assert await conn.fetchval("SELECT max(version) FROM telecom.schema_migrations") >= 7
        for ddl in (
            "CREATE TABLE telecom.intruder (id int)",
            "ALTER TABLE telecom.outbox ADD COLUMN intruder int",
            "TRUNCATE telecom.outbox",
            "DELETE FROM telecom.schema_migrations",
            "SELECT telecom.grant_runtime(current_user)",
        ):
            with pytest.raises(asyncpg.InsufficientPrivilegeError):
                await conn.execute(ddl)
    finally:
        await conn.close()


async def test_a_table_a_later_migration_adds_is_granted_to_the_runtime_role(
    settings: Settings,
) -> None:
    owner = await asyncpg.connect(settings.owner_dsn())
    try:
        await owner.execute("CREATE TABLE telecom.later (id bigserial PRIMARY KEY, note text)")
    finally:
        await owner.close()
    runtime = await asyncpg.connect(runtime_dsn(settings))
    try:
        await runtime.execute("INSERT INTO telecom.later (note) VALUES ('x')")
        assert await runtime.fetchval("SELECT count(*) FROM telecom.later") == 1
    finally:
        await runtime.close()


async def test_migrate_refuses_a_runtime_role_that_does_not_exist(settings: Settings) -> None:
    owner = await asyncpg.connect(settings.owner_dsn())
    try:
        with pytest.raises(RuntimeRoleMissingError, match="pkgq_no_such_role"):
            await migrate(owner, runtime_role="pkgq_no_such_role")
    finally:
        await owner.close()


async def test_the_reaper_under_the_runtime_role_ends_a_stale_workers_backends(
    settings: Settings, runtime_pool: asyncpg.Pool
) -> None:
    worker_id = await stale_worker(runtime_pool)
    hung = await asyncpg.connect(
        runtime_dsn(settings),
        server_settings={"application_name": workers.application_name(worker_id)},
    )
    await hung.execute("BEGIN")
    await hung.execute("SELECT pg_advisory_xact_lock(42)")  # what a relay's lease holds
    try:
        async with runtime_pool.acquire() as conn:
            assert await workers.reap_stale(conn, 30, "reaper@test") == [worker_id]
        with pytest.raises((asyncpg.PostgresError, asyncpg.InterfaceError)):
            await hung.fetchval("SELECT 1")
        assert hung.is_closed()
        async with runtime_pool.acquire() as conn:
            assert await conn.fetchval("SELECT pg_try_advisory_lock(42)")
            await conn.execute("SELECT pg_advisory_unlock(42)")
    finally:
        hung.terminate()


async def test_a_backend_the_runtime_role_may_not_end_is_left_and_the_reap_still_completes(
    settings: Settings, pool: asyncpg.Pool, runtime_pool: asyncpg.Pool
) -> None:
    worker_id = await stale_worker(runtime_pool)
    superuser = await asyncpg.connect(
        settings.postgres_dsn,
        server_settings={"application_name": workers.application_name(worker_id)},
    )
    try:
        with structlog.testing.capture_logs() as logs:
            async with runtime_pool.acquire() as conn:
                assert await workers.reap_stale(conn, 30, "reaper@test") == [worker_id]
        assert await superuser.fetchval("SELECT 1") == 1
        assert [e["count"] for e in logs if e["event"] == "worker_backends_not_terminated"] == [1]
        async with pool.acquire() as conn:
            stopped = await conn.fetchval(
                "SELECT stopped_at FROM telecom.workers WHERE id = $1", worker_id
            )
        assert stopped is not None
    finally:
        await superuser.close()


async def test_processes_connect_with_the_idle_in_transaction_timeout_tcp_keepalives_and_timeout(
    settings: Settings,
) -> None:
    tuned = settings.model_copy(
        update={"postgres_dsn": runtime_dsn(settings), "idle_in_transaction_timeout": 45.0}
    )
    async with services(tuned, "test", wait_seconds=5) as svc, svc.pool.acquire() as conn:
        found = await conn.fetchrow(
            "SELECT current_user AS who,"
            " current_setting('idle_in_transaction_session_timeout') AS idle,"
            " current_setting('tcp_keepalives_idle') AS ka_idle,"
            " current_setting('tcp_keepalives_interval') AS ka_interval,"
            " current_setting('tcp_keepalives_count') AS ka_count,"
            " current_setting('tcp_user_timeout') AS user_timeout"
        )
    assert found is not None
    assert dict(found) == {
        "who": pg_roles.RUNTIME,
        "idle": "45s",
        "ka_idle": "3",
        "ka_interval": "1",
        "ka_count": "2",
        "user_timeout": "5000",  # ms: PKGQ_DEAD_PEER_TIMEOUT, the server ends a cut-off backend
    }


def _unacked(queue: str) -> int:
    listing = subprocess.run(
        [
            "rabbitmqctl",
            "-q",
            "list_queues",
            "--no-table-headers",
            "name",
            "messages_unacknowledged",
        ],
        capture_output=True,
        text=True,
        check=True,
        timeout=60,
    ).stdout
    counts = {line.split()[0]: int(line.split()[1]) for line in listing.splitlines() if line}
    return counts[queue]


async def test_a_revoked_grant_makes_the_route_wait_and_log_an_error_and_buries_nothing(
    in_process: StartApp,
    settings: Settings,
    pool: asyncpg.Pool,
    runtime_pool: asyncpg.Pool,
    amqp: AbstractRobustConnection,
    tap: Tap,
) -> None:
    package_id = await add_package(pool, 1024)
    revoke = f"REVOKE INSERT, UPDATE ON telecom.package_queue FROM {pg_roles.RUNTIME}"
    await pool.execute(revoke)
    app = in_process(settings, runtime_pool, amqp)
    user = uuid4()
    with structlog.testing.capture_logs() as logs:
        await app.start_consumers([PACKAGE_PURCHASE])
        await send(
            settings,
            amqp,
            PACKAGE_PURCHASE,
            PurchasePackage(user_id=user, package_id=package_id, amount=2),
        )

        async def waited_twice_loudly() -> bool:
            return (
                len(
                    [
                        e
                        for e in logs
                        if e["event"] == "infrastructure_unavailable"
                        and e["log_level"] == "error"
                        and "InsufficientPrivilegeError" in e["error"]
                    ]
                )
                >= 2
            )

        await eventually(waited_twice_loudly, within=30)
    assert await pool.fetchval("SELECT count(*) FROM telecom.dead_letters") == 0
    assert await pool.fetchval("SELECT count(*) FROM telecom.inbox") == 0
    assert [t for t in tap.seen if t.exchange == settings.dlx] == []
    queue = settings.queue_name(PACKAGE_PURCHASE.name)
    assert _unacked(queue) == 1  # in hand, neither acked nor given up

    await pool.execute(f"GRANT INSERT, UPDATE ON telecom.package_queue TO {pg_roles.RUNTIME}")

    async def applied() -> bool:
        count = await pool.fetchval(
            "SELECT count(*) FROM telecom.package_queue WHERE user_id = $1", user
        )
        return bool(count == 2)

    await eventually(applied, within=60)
    await app.close()
    assert await pool.fetchval("SELECT count(*) FROM telecom.dead_letters") == 0
