"""SIGKILL at the two dangerous moments: nothing lost, nothing applied twice."""

from __future__ import annotations

import asyncio
import signal
from collections import Counter
from collections.abc import Callable
from uuid import uuid4

import asyncpg
import pytest
from aio_pika.abc import AbstractRobustConnection

from events.models import PurchasePackage
from events.routes import PACKAGE_ACTIVATE, PACKAGE_PURCHASE, PACKAGE_QUEUING, ROUTES
from infra import faults
from infra.rabbit.tap import Tap
from infra.settings import Settings
from tests.e2e.workload import Workload
from tests.support.deliveries import Sending, add_package, send
from tests.support.observing import eventually
from tests.support.processes import PkgqProcess, assert_doctor_clean

pytestmark = pytest.mark.e2e

OTHER_ROUTES = [r.short_name for r in ROUTES.values() if r is not PACKAGE_QUEUING]


async def _exited(process: PkgqProcess, within: float = 20) -> int:
    async def done() -> bool:
        return process.proc.poll() is not None

    await eventually(done, within=within)
    code = process.proc.returncode
    assert code is not None
    return code


async def test_consumer_killed_after_commit_before_ack_is_redelivered_without_a_second_effect(
    settings: Settings,
    pool: asyncpg.Pool,
    amqp: AbstractRobustConnection,
    tap: Tap,
    spawn: Callable[..., PkgqProcess],
) -> None:
    package = await add_package(pool, 1000)
    spawn("relay")
    spawn("run", *OTHER_ROUTES)
    doomed = spawn(
        "run",
        "package_queuing",
        PKGQ_FAULTS=f"{faults.CONSUMER_AFTER_COMMIT}={PACKAGE_QUEUING.name}",
    )
    user = uuid4()
    await send(
        settings,
        amqp,
        PACKAGE_PURCHASE,
        PurchasePackage(user_id=user, package_id=package, amount=2),
    )
    assert await _exited(doomed) == -signal.SIGKILL

    async with pool.acquire() as conn:
        active = await conn.fetchval(
            "SELECT count(*) FROM telecom.package_queue WHERE user_id = $1 AND status = 'active'",
            user,
        )
    assert active == 1  # the commit happened before the crash

    survivor = spawn("run", "package_queuing")
    queue_name = settings.queue_name(PACKAGE_QUEUING.name)

    async def redelivered_and_acked() -> bool:
        channel = await amqp.channel()
        try:
            queue = await channel.declare_queue(queue_name, passive=True)
            return queue.declaration_result.message_count == 0 and '"duplicate"' in survivor.logs()
        finally:
            await channel.close()

    await eventually(redelivered_and_acked, within=20)
    await asyncio.sleep(0.5)
    activations = [t for t in tap.on(PACKAGE_ACTIVATE.name) if t.json()["user_id"] == str(user)]
    assert len(activations) == 1
    async with pool.acquire() as conn:
        statuses = await conn.fetch(
            "SELECT status::text FROM telecom.package_queue WHERE user_id = $1 ORDER BY id", user
        )
    assert [r["status"] for r in statuses] == ["active", "in_queue"]
    await assert_doctor_clean(settings)


async def test_relay_killed_mid_batch_still_delivers_everything_and_duplicates_are_absorbed(
    settings: Settings,
    pool: asyncpg.Pool,
    amqp: AbstractRobustConnection,
    tap: Tap,
    spawn: Callable[..., PkgqProcess],
) -> None:
    package = await add_package(pool, 1000)
    consumers = spawn("run")
    users = [uuid4() for _ in range(30)]
    async with Sending(settings, amqp) as sending:
        for user in users:
            await sending.send(PACKAGE_PURCHASE, PurchasePackage(user_id=user, package_id=package))

    async def all_purchases_in_outbox() -> bool:
        async with pool.acquire() as conn:
            n = await conn.fetchval(
                "SELECT count(*) FROM telecom.outbox WHERE route = $1", PACKAGE_QUEUING.name
            )
        return bool(n == len(users))

    await eventually(all_purchases_in_outbox)
    doomed = spawn(
        "relay", PKGQ_FAULTS=f"{faults.RELAY_AFTER_CONFIRM}@10", PKGQ_RELAY_BATCH_SIZE="100"
    )
    assert await _exited(doomed) == -signal.SIGKILL
    async with pool.acquire() as conn:
        unmarked = await conn.fetchval(
            "SELECT count(*) FROM telecom.outbox WHERE published_at IS NULL AND route = $1",
            PACKAGE_QUEUING.name,
        )
    assert unmarked == len(users)  # confirmed on the wire, never marked: all will be re-sent

    spawn("relay")

    def activated() -> set[str]:
        return {t.json()["user_id"] for t in tap.on(PACKAGE_ACTIVATE.name)}

    await tap.wait_for(lambda _: activated() == {str(u) for u in users}, within=30)
    await asyncio.sleep(0.5)
    sent = Counter(t.message_id for t in tap.on(PACKAGE_QUEUING.name))
    assert len(sent) == len(users)
    assert sum(1 for n in sent.values() if n > 1) >= 10  # the re-sent ones
    per_user = Counter(t.json()["user_id"] for t in tap.on(PACKAGE_ACTIVATE.name))
    assert set(per_user.values()) == {1}  # one activation each despite the duplicates
    async with pool.acquire() as conn:
        active = await conn.fetchval(
            "SELECT count(*) FROM telecom.package_queue WHERE status = 'active'"
        )
    assert active == len(users)
    assert consumers.terminate() == 0


async def test_sigterm_drains_and_exits_zero(
    settings: Settings,
    pool: asyncpg.Pool,
    amqp: AbstractRobustConnection,
    spawn: Callable[..., PkgqProcess],
) -> None:
    package = await add_package(pool, 1000)
    consumers = spawn("run")
    relay = spawn("relay")
    user = uuid4()
    await send(settings, amqp, PACKAGE_PURCHASE, PurchasePackage(user_id=user, package_id=package))

    async def active() -> bool:
        async with pool.acquire() as conn:
            n = await conn.fetchval(
                "SELECT count(*) FROM telecom.package_queue WHERE status = 'active'"
            )
        return bool(n == 1)

    await eventually(active)
    assert consumers.terminate(timeout=20) == 0
    assert relay.terminate(timeout=20) == 0
    assert '"stopping"' in consumers.logs()
    assert '"stopped"' in consumers.logs()
    for process in (consumers, relay):
        assert "guest:guest" not in process.logs()  # the AMQP password is masked
        assert "guest:***@" in process.logs()


async def test_standby_replica_takes_over_when_the_active_consumer_is_killed(
    settings: Settings,
    pool: asyncpg.Pool,
    amqp: AbstractRobustConnection,
    spawn: Callable[..., PkgqProcess],
) -> None:
    workload = await Workload.create(pool, seed=99)
    spawn("relay")
    first = spawn("run")
    await asyncio.sleep(1.0)  # `first` subscribes first and becomes every queue's active consumer
    spawn("run")
    await workload.send_purchases(settings, amqp)
    await workload.wait_all_queued(pool)
    usage = asyncio.create_task(workload.send_usage(settings, amqp))
    await asyncio.sleep(0.2)
    first.kill()
    await usage
    await workload.wait_end_state(pool)


async def test_consumer_killed_before_commit_leaves_nothing_and_the_redelivery_applies_once(
    settings: Settings,
    pool: asyncpg.Pool,
    amqp: AbstractRobustConnection,
    tap: Tap,
    spawn: Callable[..., PkgqProcess],
) -> None:
    package = await add_package(pool, 1000)
    spawn("relay")
    spawn("run", *[r.short_name for r in ROUTES.values() if r is not PACKAGE_PURCHASE])
    doomed = spawn(
        "run",
        "package_purchase",
        PKGQ_FAULTS=f"{faults.DELIVERY_BEFORE_COMMIT}={PACKAGE_PURCHASE.name}",
    )
    user = uuid4()
    body = PurchasePackage(user_id=user, package_id=package, amount=2)
    await send(settings, amqp, PACKAGE_PURCHASE, body)
    assert await _exited(doomed) == -signal.SIGKILL

    async with pool.acquire() as conn:
        left = await conn.fetchval(
            "SELECT (SELECT count(*) FROM telecom.package_queue WHERE user_id = $1)"
            " + (SELECT count(*) FROM telecom.outbox WHERE user_id = $1)"
            " + (SELECT count(*) FROM telecom.inbox WHERE consumer = 'package_purchase')",
            user,
        )
    assert left == 0  # the transaction died with the process: nothing applied, nothing sent

    spawn("run", "package_purchase")

    def activated() -> list[str]:
        return [t.json()["user_id"] for t in tap.on(PACKAGE_ACTIVATE.name)]

    await tap.wait_for(lambda _: activated() == [str(user)], within=20)
    await asyncio.sleep(0.5)
    assert activated() == [str(user)]
    assert len(tap.on(PACKAGE_QUEUING.name)) == 1
    async with pool.acquire() as conn:
        items = await conn.fetchval(
            "SELECT count(*) FROM telecom.package_queue WHERE user_id = $1", user
        )
    assert items == 2
    await assert_doctor_clean(settings)
