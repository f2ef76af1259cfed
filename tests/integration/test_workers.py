"""Workers with heartbeats (permits), their reaping, and singleton-job leases."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from uuid import UUID, uuid4

import asyncpg
import pytest
from aio_pika.abc import AbstractRobustConnection

from consumers.runtime import services
from consumers.worker import Services, WorkerHeartbeat
from infra.outbox.housekeeping import EXPIRY_SWEEP, RETENTION, housekeeping_forever
from infra.postgres import leases, workers
from infra.postgres.outbox import RELAY_LOCK_CLASS
from infra.settings import Settings
from tests.support.deliveries import add_package
from tests.support.observing import eventually


async def _register(pool: asyncpg.Pool, name: str = "w", routes: list[str] | None = None) -> UUID:
    worker_id = uuid4()
    async with pool.acquire() as conn:
        await workers.register(
            conn, worker_id, name, "test", "host", 4242, routes or ["telecom.usage_record"]
        )
    return worker_id


async def _backdate(pool: asyncpg.Pool, worker_id: UUID, seconds: float = 3600) -> None:
    async with pool.acquire() as conn:
        await conn.execute(
            "UPDATE telecom.workers SET heartbeat_at = now() - make_interval(secs => $2) "
            "WHERE id = $1",
            worker_id,
            float(seconds),
        )


async def _row(pool: asyncpg.Pool, worker_id: UUID) -> asyncpg.Record:
    async with pool.acquire() as conn:
        row = await conn.fetchrow("SELECT * FROM telecom.workers WHERE id = $1", worker_id)
    assert row is not None
    return row


async def _worker_connection(settings: Settings, worker_id: UUID) -> asyncpg.Connection:
    """A connection as the worker's pool would open it."""
    return await asyncpg.connect(
        settings.postgres_dsn,
        server_settings={"application_name": workers.application_name(worker_id)},
    )


@pytest.fixture
async def hung(
    settings: Settings, pool: asyncpg.Pool
) -> AsyncIterator[tuple[UUID, asyncpg.Connection]]:
    """A worker whose heartbeat stopped long ago, while one of its connections holds a relay
    partition lease (advisory lock) and a claimed user row in an open transaction."""
    worker_id = await _register(pool, "hung")
    await _backdate(pool, worker_id)
    async with pool.acquire() as setup:
        await setup.execute("INSERT INTO telecom.queue_users (user_id) VALUES ($1)", USER)
    conn = await _worker_connection(settings, worker_id)
    await conn.execute("BEGIN")
    await conn.execute("SELECT pg_advisory_xact_lock($1, $2)", RELAY_LOCK_CLASS, PARTITION)
    await conn.execute("SELECT 1 FROM telecom.queue_users WHERE user_id = $1 FOR UPDATE", USER)
    yield worker_id, conn
    if not conn.is_closed():
        conn.terminate()


USER = UUID("00000000-0000-4000-8000-000000000001")
PARTITION = 7


async def _partition_free(pool: asyncpg.Pool) -> bool:
    async with pool.acquire() as conn, conn.transaction():
        return bool(
            await conn.fetchval(
                "SELECT pg_try_advisory_xact_lock($1, $2)", RELAY_LOCK_CLASS, PARTITION
            )
        )


async def _user_row_free(pool: asyncpg.Pool) -> bool:
    async with pool.acquire() as conn, conn.transaction():
        try:
            await conn.execute(
                "SELECT 1 FROM telecom.queue_users WHERE user_id = $1 FOR UPDATE NOWAIT", USER
            )
        except asyncpg.LockNotAvailableError:
            return False
        return True


async def test_a_registered_worker_is_listed_with_its_routes_and_its_heartbeat_renews_it(
    pool: asyncpg.Pool,
) -> None:
    worker_id = await _register(pool, "pkgq-run@h:1", ["telecom.usage_record"])
    await _backdate(pool, worker_id, 100)
    async with pool.acquire() as conn:
        [listed] = await workers.list_workers(conn)
        assert listed.id == worker_id
        assert listed.name == "pkgq-run@h:1"
        assert listed.routes == ["telecom.usage_record"]
        assert listed.age_s >= 100
        assert listed.state(stale_after_s=30) == "stale"

        assert await workers.heartbeat(conn, worker_id) is True
        await workers.set_routes(conn, worker_id, ["telecom.package_cancel"])
        [listed] = await workers.list_workers(conn)
    assert listed.age_s < 100
    assert listed.state(stale_after_s=30) == "alive"
    assert listed.routes == ["telecom.package_cancel"]
    assert listed.as_dict(30)["state"] == "alive"


async def test_a_stopped_worker_gives_up_its_leases_and_is_listed_only_with_all(
    pool: asyncpg.Pool,
) -> None:
    worker_id = await _register(pool)
    async with pool.acquire() as conn:
        assert await leases.acquire(conn, RETENTION, worker_id, 60)
        await workers.stop(conn, worker_id, "exited")
        assert await workers.list_workers(conn) == []
        [listed] = await workers.list_workers(conn, include_stopped=True)
        assert await leases.holder(conn, RETENTION) is None
    assert listed.state(30) == "stopped"
    assert listed.stop_reason == "exited"


async def test_reaping_a_stale_worker_stops_it_frees_its_leases_locks_and_claimed_rows(
    settings: Settings, pool: asyncpg.Pool, hung: tuple[UUID, asyncpg.Connection]
) -> None:
    worker_id, hung_conn = hung
    alive = await _register(pool, "alive")
    async with pool.acquire() as conn:
        assert await leases.acquire(conn, EXPIRY_SWEEP, worker_id, 3600)
    assert not await _partition_free(pool)
    assert not await _user_row_free(pool)

    async with pool.acquire() as conn:
        reaped = await workers.reap_stale(conn, 30, "reaper@test")

    assert reaped == [worker_id]
    row = await _row(pool, worker_id)
    assert row["stopped_at"] is not None
    assert row["stop_reason"].startswith("stale: no heartbeat for ")
    assert row["stop_reason"].endswith("reaped by reaper@test")
    assert (await _row(pool, alive))["stopped_at"] is None
    async with pool.acquire() as conn:
        assert await leases.holder(conn, EXPIRY_SWEEP) is None
    assert await _partition_free(pool)
    assert await _user_row_free(pool)
    with pytest.raises((asyncpg.PostgresError, asyncpg.InterfaceError)):
        await hung_conn.fetchval("SELECT 1")
    assert hung_conn.is_closed()


async def test_reaping_never_terminates_the_reapers_own_connection(
    settings: Settings, pool: asyncpg.Pool
) -> None:
    worker_id = await _register(pool)
    await _backdate(pool, worker_id)
    own = await _worker_connection(settings, worker_id)  # same application_name as the stale one
    try:
        assert await workers.reap_stale(own, 30, "self") == [worker_id]
        assert await own.fetchval("SELECT 1") == 1
    finally:
        await own.close()


async def test_a_reaped_worker_has_its_heartbeat_refused_and_registers_again(
    pool: asyncpg.Pool,
) -> None:
    worker_id = await _register(pool)
    await _backdate(pool, worker_id)
    async with pool.acquire() as conn:
        assert await workers.reap_stale(conn, 30, "reaper") == [worker_id]
        assert await workers.heartbeat(conn, worker_id) is False
        await workers.register(conn, worker_id, "w", "test", "host", 4242)
        assert await workers.heartbeat(conn, worker_id) is True
    row = await _row(pool, worker_id)
    assert row["stopped_at"] is None
    assert row["stop_reason"] is None


async def test_two_concurrent_reapers_reap_every_stale_worker_exactly_once(
    settings: Settings, pool: asyncpg.Pool
) -> None:
    stale = {await _register(pool, f"stale-{i}") for i in range(20)}
    for worker_id in stale:
        await _backdate(pool, worker_id)
    fresh = await _register(pool, "fresh")
    one = await asyncpg.connect(settings.postgres_dsn)
    two = await asyncpg.connect(settings.postgres_dsn)
    try:
        first, second = await asyncio.gather(
            workers.reap_stale(one, 30, "one"), workers.reap_stale(two, 30, "two")
        )
        third = await workers.reap_stale(one, 30, "one")
    finally:
        await one.close()
        await two.close()
    assert not set(first) & set(second)
    assert set(first) | set(second) == stale
    assert third == []
    assert fresh not in set(first) | set(second)
    async with pool.acquire() as conn:
        reasons = await conn.fetch(
            "SELECT stop_reason FROM telecom.workers WHERE id = ANY($1::uuid[])", list(stale)
        )
    by = {"one": set(first), "two": set(second)}
    assert sum(r["stop_reason"].endswith(f"by {name}") for r in reasons for name in by) == 20


async def test_a_reaper_skips_the_workers_another_reaper_is_reaping_without_waiting(
    settings: Settings, pool: asyncpg.Pool
) -> None:
    stale = [await _register(pool, f"stale-{i}") for i in range(6)]
    for worker_id in stale:
        await _backdate(pool, worker_id)
    one = await asyncpg.connect(settings.postgres_dsn)
    two = await asyncpg.connect(settings.postgres_dsn)
    try:
        async with one.transaction():  # reaper one, in the middle of reaping the first three
            await one.execute(
                "UPDATE telecom.workers SET stopped_at = now(), stop_reason = 'by one' "
                "WHERE id = ANY($1::uuid[])",
                stale[:3],
            )
            second = await asyncio.wait_for(workers.reap_stale(two, 30, "two"), timeout=10)
        assert set(second) == set(stale[3:])
        assert await workers.reap_stale(two, 30, "two") == []
    finally:
        await one.close()
        await two.close()


async def test_a_lease_is_held_by_one_live_worker_and_renewed_by_it(pool: asyncpg.Pool) -> None:
    holder, other = await _register(pool, "holder"), await _register(pool, "other")
    async with pool.acquire() as conn:
        assert await leases.acquire(conn, RETENTION, holder, 60, stale_after_s=30)
        assert not await leases.acquire(conn, RETENTION, other, 60, stale_after_s=30)
        assert await leases.acquire(conn, RETENTION, holder, 60, stale_after_s=30)  # renewal
        assert await leases.acquire(conn, EXPIRY_SWEEP, other, 60)  # another lease is free
        assert not await leases.release(conn, RETENTION, other)
        assert await leases.holder(conn, RETENTION) == holder
        assert await leases.release(conn, RETENTION, holder)
        assert await leases.acquire(conn, RETENTION, other, 60)


async def test_an_expired_lease_is_taken_over(pool: asyncpg.Pool) -> None:
    holder, other = await _register(pool, "holder"), await _register(pool, "other")
    async with pool.acquire() as conn:
        assert await leases.acquire(conn, RETENTION, holder, 60)
        await conn.execute("UPDATE telecom.leases SET expires_at = now() - interval '1 second'")
        assert await leases.acquire(conn, RETENTION, other, 60)
        assert await leases.holder(conn, RETENTION) == other


async def test_the_lease_of_a_stale_or_stopped_holder_is_taken_over_before_it_expires(
    pool: asyncpg.Pool,
) -> None:
    holder, other = await _register(pool, "holder"), await _register(pool, "other")
    async with pool.acquire() as conn:
        assert await leases.acquire(conn, RETENTION, holder, 3600)
        await _backdate(pool, holder, 100)
        assert not await leases.acquire(conn, RETENTION, other, 60)  # no stale threshold given
        assert await leases.acquire(conn, RETENTION, other, 60, stale_after_s=30)
        assert await leases.holder(conn, RETENTION) == other

        assert await leases.acquire(conn, EXPIRY_SWEEP, other, 3600)
        await conn.execute("UPDATE telecom.workers SET stopped_at = now() WHERE id = $1", other)
        assert await leases.acquire(conn, EXPIRY_SWEEP, holder, 60)


async def test_services_registers_the_process_on_connections_named_after_it_and_stops_it(
    settings: Settings, pool: asyncpg.Pool, amqp: AbstractRobustConnection
) -> None:
    async with services(settings, "testrole", wait_seconds=10) as svc:
        row = await _row(pool, svc.worker_id)
        assert row["name"].startswith("pkgq-testrole@")
        assert row["role"] == "testrole"
        assert row["stopped_at"] is None
        async with svc.pool.acquire() as conn:
            assert await conn.fetchval("SELECT current_setting('application_name')") == (
                f"pkgq:{svc.worker_id}"
            )
        await svc.set_routes(["telecom.usage_record", "telecom.package_cancel"])
        assert (await _row(pool, svc.worker_id))["routes"] == [
            "telecom.usage_record",
            "telecom.package_cancel",
        ]
    row = await _row(pool, svc.worker_id)
    assert row["stopped_at"] is not None
    assert row["stop_reason"] == "exited"


async def test_the_heartbeat_task_registers_again_after_being_reaped_and_keeps_its_routes(
    settings: Settings, pool: asyncpg.Pool, amqp: AbstractRobustConnection
) -> None:
    svc = Services(pool, amqp)
    beat = WorkerHeartbeat(settings, svc, "pkgq-test@h:1", "test", "h", 1)
    await beat.beat()  # no row yet: the refused heartbeat registers it
    await svc.set_routes(["telecom.usage_record"])
    await _backdate(pool, svc.worker_id)
    async with pool.acquire() as conn:
        assert await workers.reap_stale(conn, 30, "reaper") == [svc.worker_id]
    await beat.beat()
    await beat.stop("exited")
    row = await _row(pool, svc.worker_id)
    assert row["routes"] == ["telecom.usage_record"]
    assert row["stop_reason"] == "exited"


async def test_the_heartbeat_task_survives_an_unreachable_postgres(
    settings: Settings, pool: asyncpg.Pool, amqp: AbstractRobustConnection
) -> None:
    unreachable = settings.model_copy(
        update={"postgres_dsn": "postgresql://postgres@127.0.0.1:1/nowhere"}
    )
    svc = Services(pool, amqp)
    beat = WorkerHeartbeat(unreachable, svc, "pkgq-test@h:1", "test", "h", 1)
    assert await beat.beat() == []
    assert await beat.beat() == []
    await beat.stop("exited")  # recorded nowhere, and no error either


async def test_a_worker_reaps_its_peers_only_after_heartbeating_for_stale_after_itself(
    settings: Settings, pool: asyncpg.Pool, amqp: AbstractRobustConnection
) -> None:
    """After an outage every heartbeat is old: the first worker back must not judge the others
    before they had the time to heartbeat too."""
    peer = await _register(pool, "peer")
    await _backdate(pool, peer)
    quick = settings.model_copy(update={"worker_stale_after": 1.0, "heartbeat_interval": 0.1})
    beat = WorkerHeartbeat(quick, Services(pool, amqp), "pkgq-test@h:1", "test", "h", 1)
    assert await beat.beat() == []
    assert (await _row(pool, peer))["stopped_at"] is None
    reaped: list[UUID] = []

    async def reaps_the_peer() -> bool:
        reaped.extend(await beat.beat())
        return bool(reaped)

    await eventually(reaps_the_peer, within=20, every=0.2)
    await beat.stop("exited")
    assert reaped == [peer]


async def test_housekeeping_runs_a_job_only_under_its_lease_and_releases_its_leases_on_stop(
    settings: Settings, pool: asyncpg.Pool
) -> None:
    me, peer = await _register(pool, "me"), await _register(pool, "peer")
    package = await add_package(pool, 1000)
    async with pool.acquire() as conn:
        # The peer (alive) holds the sweep's lease, so this worker must not sweep.
        assert await leases.acquire(conn, EXPIRY_SWEEP, peer, 3600)
        await conn.execute(
            "INSERT INTO telecom.package_queue (user_id, package_id, status, activated_at, "
            "expire_at) VALUES ($1, $2, 'active', now() - interval '2 hours', "
            "now() - interval '1 hour')",
            uuid4(),
            package,
        )
        await conn.execute(
            "INSERT INTO telecom.inbox (consumer, message_id, processed_at) "
            "VALUES ('usage_record', $1, now() - interval '30 days')",
            uuid4(),
        )
    slow = settings.model_copy(update={"housekeeping_interval": 3600.0})
    stop = asyncio.Event()
    task = asyncio.create_task(housekeeping_forever(slow, pool, me, stop))

    async def pruned() -> bool:
        async with pool.acquire() as conn:
            return not await conn.fetchval("SELECT count(*) FROM telecom.inbox")

    await eventually(pruned)  # retention ran (it comes after the sweep in a round)
    async with pool.acquire() as conn:
        assert await leases.holder(conn, RETENTION) == me
        assert await leases.holder(conn, EXPIRY_SWEEP) == peer
        assert await conn.fetchval("SELECT count(*) FROM telecom.outbox") == 0  # not swept
    stop.set()
    await task
    async with pool.acquire() as conn:
        assert await leases.holder(conn, RETENTION) is None
        assert await leases.holder(conn, EXPIRY_SWEEP) == peer
