"""Handlers over real Postgres and RabbitMQ, with consumers and relay in the test's loop."""

from __future__ import annotations

import asyncio
from dataclasses import dataclass
from datetime import timedelta
from uuid import UUID, uuid4

import asyncpg
import pytest
from aio_pika.abc import AbstractRobustConnection

from events.envelope import H_SCHEMA_VERSION, H_SEQ, H_USER_ID
from events.models import (
    AdjustQuota,
    AllPackageExpiredEvent,
    CancelPackage,
    PurchasePackage,
    RecordUsage,
    WireModel,
)
from events.routes import (
    ALL_EXPIRED,
    EXPIRY_DUE,
    PACKAGE_ACTIVATE,
    PACKAGE_CANCEL,
    PACKAGE_EXPIRING,
    PACKAGE_PURCHASE,
    QUOTA_ADJUST,
    ROUTES,
    USAGE_RECORD,
    Route,
)
from infra.outbox.sweep import sweep_overdue_expiries
from infra.postgres import access
from infra.rabbit.tap import Tap
from infra.settings import Settings
from tests.support.deliveries import add_package, send, send_raw
from tests.support.in_process import InProcess, StartApp
from tests.support.observing import eventually


@dataclass
class World:
    """The test's services, with consumers and relay running in its event loop."""

    settings: Settings
    pool: asyncpg.Pool
    amqp: AbstractRobustConnection
    tap: Tap

    async def send(self, route: Route, body: WireModel, message_id: UUID | None = None) -> UUID:
        return await send(self.settings, self.amqp, route, body, message_id)

    async def statuses(self, user: UUID) -> list[str]:
        async with self.pool.acquire() as conn:
            rows = await conn.fetch(
                "SELECT status::text FROM telecom.package_queue WHERE user_id = $1 "
                "ORDER BY created_at, id",
                user,
            )
        return [r["status"] for r in rows]

    def lifecycle(self, user: UUID) -> list[str]:
        """The user's lifecycle events in the order they crossed the wire."""
        names = {PACKAGE_ACTIVATE.name, PACKAGE_EXPIRING.name, ALL_EXPIRED.name}
        return [
            t.routing_key.removeprefix("telecom.")
            for t in self.tap.seen
            if t.routing_key in names
            and t.exchange == self.settings.exchange
            and t.json().get("user_id") == str(user)
        ]


@pytest.fixture
async def w(
    running_app: InProcess,
    settings: Settings,
    pool: asyncpg.Pool,
    amqp: AbstractRobustConnection,
    tap: Tap,
) -> World:
    """The test's services, with every consumer and the relay running (`running_app`)."""
    return World(settings, pool, amqp, tap)


async def test_purchase_activates_the_first_item_and_grants_access(w: World) -> None:
    package = await add_package(w.pool, 1000)
    user = uuid4()
    await w.send(
        PACKAGE_PURCHASE,
        PurchasePackage(user_id=user, package_id=package, amount=3),
    )

    async def granted() -> bool:
        async with w.pool.acquire() as conn:
            row = await access.get_access(conn, user)
        return row is not None and row["granted"]

    await eventually(granted)
    assert await w.statuses(user) == ["active", "in_queue", "in_queue"]
    async with w.pool.acquire() as conn:
        row = await access.get_access(conn, user)
    assert row is not None
    assert row["remaining"] == 1000


async def test_the_same_message_delivered_twice_has_one_effect(w: World) -> None:
    package = await add_package(w.pool, 1000)
    user = uuid4()
    body = PurchasePackage(user_id=user, package_id=package, amount=2)
    message_id = uuid4()
    await w.send(PACKAGE_PURCHASE, body, message_id=message_id)
    await w.send(PACKAGE_PURCHASE, body, message_id=message_id)
    await w.tap.wait_for(lambda _: w.lifecycle(user) == ["package_activate"], within=10)
    await asyncio.sleep(0.5)  # give a wrong second effect time to show
    assert await w.statuses(user) == ["active", "in_queue"]
    assert w.lifecycle(user) == ["package_activate"]
    async with w.pool.acquire() as conn:
        count = await conn.fetchval(
            "SELECT count(*) FROM telecom.inbox WHERE sent_as = $1", message_id
        )
    assert count == 1


async def test_usage_consumes_items_in_fifo_order_until_all_expired(w: World) -> None:
    package = await add_package(w.pool, 1000)
    user = uuid4()
    await w.send(
        PACKAGE_PURCHASE,
        PurchasePackage(user_id=user, package_id=package, amount=2),
    )
    await w.tap.wait_for(lambda _: "package_activate" in w.lifecycle(user), within=10)
    for _ in range(4):
        await w.send(USAGE_RECORD, RecordUsage(user_id=user, upload=250, download=250))
    await w.tap.wait_for(lambda _: "all_expired" in w.lifecycle(user), within=10)
    assert w.lifecycle(user) == [
        "package_activate",
        "package_expiring",
        "package_activate",
        "package_expiring",
        "all_expired",
    ]
    assert await w.statuses(user) == ["consumed", "consumed"]

    async def revoked() -> bool:
        async with w.pool.acquire() as conn:
            row = await access.get_access(conn, user)
        return row is not None and not row["granted"]

    await eventually(revoked)


async def test_usage_without_an_active_package_is_kept_as_unbilled_and_billed_later(
    w: World,
) -> None:
    package = await add_package(w.pool, 1000)
    user = uuid4()
    await w.send(USAGE_RECORD, RecordUsage(user_id=user, upload=100, download=200))

    async def unbilled() -> bool:
        async with w.pool.acquire() as conn:
            row = await conn.fetchrow(
                "SELECT unbilled_upload, unbilled_download FROM telecom.queue_users "
                "WHERE user_id = $1",
                user,
            )
        return row is not None and (row[0], row[1]) == (100, 200)

    await eventually(unbilled)
    await w.send(PACKAGE_PURCHASE, PurchasePackage(user_id=user, package_id=package))
    await w.tap.wait_for(lambda _: "package_activate" in w.lifecycle(user), within=10)
    async with w.pool.acquire() as conn:
        item = await conn.fetchrow(
            "SELECT upload, download FROM telecom.package_queue WHERE user_id = $1", user
        )
    assert item is not None
    assert (item["upload"], item["download"]) == (100, 200)


async def test_time_expiry_fires_from_the_outbox_schedule_and_advances_the_queue(w: World) -> None:
    short = await add_package(w.pool, 10**9, timedelta(seconds=1))
    user = uuid4()
    await w.send(PACKAGE_PURCHASE, PurchasePackage(user_id=user, package_id=short, amount=2))
    await w.tap.wait_for(lambda _: "all_expired" in w.lifecycle(user), within=15)
    assert w.lifecycle(user) == [
        "package_activate",
        "package_expiring",
        "package_activate",
        "package_expiring",
        "all_expired",
    ]
    reasons = [t.json()["reason"] for t in w.tap.on(PACKAGE_EXPIRING.name)]
    assert reasons == ["time", "time"]


async def test_cancelling_the_active_item_activates_the_next_one(w: World) -> None:
    package = await add_package(w.pool, 1000, timedelta(hours=1))
    user = uuid4()
    await w.send(
        PACKAGE_PURCHASE,
        PurchasePackage(user_id=user, package_id=package, amount=2),
    )
    await w.tap.wait_for(lambda _: w.lifecycle(user) == ["package_activate"], within=10)
    first = w.tap.on(PACKAGE_ACTIVATE.name)[0].json()["item_id"]
    await w.send(PACKAGE_CANCEL, CancelPackage(user_id=user, item_id=first))
    await w.tap.wait_for(lambda _: w.lifecycle(user).count("package_activate") == 2, within=10)
    assert await w.statuses(user) == ["cancelled", "active"]
    async with w.pool.acquire() as conn:
        pending = await conn.fetchval(
            "SELECT count(*) FROM telecom.outbox WHERE cancel_key = $1 AND published_at IS NULL",
            f"expire:{first}",
        )
    assert pending == 0  # the cancelled item's time expiry was withdrawn


async def test_lowering_the_quota_below_use_consumes_the_active_item_at_once(w: World) -> None:
    package = await add_package(w.pool, 1000)
    user = uuid4()
    await w.send(PACKAGE_PURCHASE, PurchasePackage(user_id=user, package_id=package))
    await w.tap.wait_for(lambda _: w.lifecycle(user) == ["package_activate"], within=10)
    item = w.tap.on(PACKAGE_ACTIVATE.name)[0].json()["item_id"]
    await w.send(USAGE_RECORD, RecordUsage(user_id=user, upload=300, download=0))
    await w.send(QUOTA_ADJUST, AdjustQuota(user_id=user, item_id=item, delta=-800))
    await w.tap.wait_for(lambda _: "all_expired" in w.lifecycle(user), within=10)
    expiring = w.tap.on(PACKAGE_EXPIRING.name)[0].json()
    assert expiring["reason"] == "usage"
    async with w.pool.acquire() as conn:
        row = await conn.fetchrow(
            "SELECT status::text, adjust_quota, upload FROM telecom.package_queue WHERE id = $1",
            item,
        )
    assert row is not None
    assert (row["status"], row["adjust_quota"], row["upload"]) == ("consumed", -800, 300)


async def test_an_older_all_expired_arriving_after_a_newer_activation_does_not_revoke_access(
    w: World,
) -> None:
    package = await add_package(w.pool, 1000)
    user = uuid4()
    await w.send(PACKAGE_PURCHASE, PurchasePackage(user_id=user, package_id=package))

    async def granted_at_seq() -> bool:
        async with w.pool.acquire() as conn:
            row = await access.get_access(conn, user)
        return row is not None and row["granted"] and row["seq"] >= 2

    await eventually(granted_at_seq)
    stale = AllPackageExpiredEvent(user_id=user, expired_at=0)
    await send_raw(
        w.settings,
        w.amqp,
        ALL_EXPIRED,
        stale.model_dump_json().encode(),
        headers={H_SCHEMA_VERSION: 1, H_USER_ID: str(user), H_SEQ: 1},
    )

    async def stale_applied_as_noop() -> bool:
        async with w.pool.acquire() as conn:
            n: int = await conn.fetchval(
                "SELECT count(*) FROM telecom.inbox WHERE consumer = 'all_expired'"
            )
        return n == 1

    await eventually(stale_applied_as_noop)
    async with w.pool.acquire() as conn:
        row = await access.get_access(conn, user)
    assert row is not None
    assert row["granted"] is True


async def test_sweep_resends_a_lost_time_expiry_and_the_item_expires(w: World) -> None:
    package = await add_package(w.pool, 1000, timedelta(hours=1))
    user = uuid4()
    await w.send(PACKAGE_PURCHASE, PurchasePackage(user_id=user, package_id=package))
    await w.tap.wait_for(lambda _: w.lifecycle(user) == ["package_activate"], within=10)
    async with w.pool.acquire() as conn:
        # Lose the scheduled trigger and move the clock of the item past its expiry.
        await conn.execute("DELETE FROM telecom.outbox WHERE cancel_key LIKE 'expire:%'")
        await conn.execute(
            "UPDATE telecom.package_queue SET expire_at = now() - interval '5 minutes' "
            "WHERE user_id = $1",
            user,
        )
    assert await sweep_overdue_expiries(w.pool, grace=60) == 1
    assert await sweep_overdue_expiries(w.pool, grace=60) == 0  # a pending trigger exists now
    await w.tap.wait_for(lambda _: "all_expired" in w.lifecycle(user), within=10)
    assert await w.statuses(user) == ["consumed"]


async def test_usage_after_expire_at_expires_the_item_by_time_once_and_bills_the_next(
    in_process: StartApp,
    settings: Settings,
    pool: asyncpg.Pool,
    amqp: AbstractRobustConnection,
    tap: Tap,
) -> None:
    """The timer is late (its consumer is down): usage must not land on the expired item, and
    when the timer finally arrives it must not announce a second expiry."""
    w = World(settings, pool, amqp, tap)
    app = in_process(settings, pool, amqp)
    await app.start_consumers([r for r in ROUTES.values() if r is not EXPIRY_DUE])
    await app.start_relay()
    package = await add_package(pool, 1000, timedelta(seconds=1))
    user = uuid4()
    await w.send(PACKAGE_PURCHASE, PurchasePackage(user_id=user, package_id=package, amount=2))
    await w.tap.wait_for(lambda _: w.lifecycle(user) == ["package_activate"], within=10)
    first = w.tap.on(PACKAGE_ACTIVATE.name)[0].json()["item_id"]
    await w.tap.wait_for(lambda seen: any(t.routing_key == EXPIRY_DUE.name for t in seen), 10)
    await w.send(USAGE_RECORD, RecordUsage(user_id=user, upload=10, download=20))
    await w.tap.wait_for(lambda _: w.lifecycle(user).count("package_activate") == 2, 10)
    late = in_process(settings, pool, amqp)
    await late.start_consumers([EXPIRY_DUE])  # the late timer is delivered now
    await asyncio.sleep(1.0)
    await late.close()
    await app.close()
    assert w.lifecycle(user)[:3] == ["package_activate", "package_expiring", "package_activate"]
    first_expiry = [t.json() for t in w.tap.on(PACKAGE_EXPIRING.name)]
    first_expiry = [e for e in first_expiry if e["item_id"] == first]
    assert [e["reason"] for e in first_expiry] == ["time"]  # once, though the timer came too
    async with pool.acquire() as conn:
        rows = await conn.fetch(
            "SELECT id, status::text, upload, download FROM telecom.package_queue "
            "WHERE user_id = $1 ORDER BY id",
            user,
        )
    assert (rows[0]["status"], rows[0]["upload"], rows[0]["download"]) == ("consumed", 0, 0)
    assert (rows[1]["upload"], rows[1]["download"]) == (10, 20)  # billed to the next item
