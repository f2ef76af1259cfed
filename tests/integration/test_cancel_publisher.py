"""Who published a cancel, kept: the item audit and PackageCancelledEvent say who published it
(the broker's word: a publisher of its own, the shop, on the real broker) beside the operator it
claims (the body's), and a cancel parked behind its user's hold keeps the publisher it was
stamped with on arrival until the drain applies it."""

from __future__ import annotations

import json
from collections.abc import AsyncIterator
from dataclasses import replace
from typing import Any
from uuid import uuid4

import asyncpg
import pytest
from aio_pika.abc import AbstractRobustConnection

from consumers import operations
from consumers.delivery import DeliveryPipeline
from consumers.registry import HANDLERS
from consumers.retry_policy import RetryPolicy
from domain.delivery import Fate
from events.envelope import H_PUBLISHER
from events.models import CancelPackage, PurchasePackage
from events.routes import PACKAGE_CANCEL, PACKAGE_CANCELLED, PACKAGE_PURCHASE
from infra.postgres import holds
from infra.rabbit.connection import connect
from infra.rabbit.tap import Tap
from infra.settings import Settings
from tests.support.broker_users import broker_user, grant, unique_role_users, url_for
from tests.support.deliveries import add_package, publish_as_outsider, raw_for
from tests.support.in_process import StartApp
from tests.support.observing import eventually, fetch


@pytest.fixture
async def shop(settings: Settings) -> AsyncIterator[tuple[str, AbstractRobustConnection]]:
    """A broker user with the definitions' publisher role: the shop, an outside publisher."""
    users = unique_role_users()
    async with broker_user(users.publisher) as password:
        await grant(settings, users, users.publisher)
        connection = await connect(url_for(settings, users.publisher, password), "pkgq-test-shop")
        yield users.publisher, connection
        await connection.close()


async def test_a_cancel_is_audited_and_announced_with_its_verified_publisher_and_claimed_operator(
    in_process: StartApp,
    settings: Settings,
    pool: asyncpg.Pool,
    amqp: AbstractRobustConnection,
    tap: Tap,
    shop: tuple[str, AbstractRobustConnection],
) -> None:
    shop_user, connection = shop
    app = in_process(settings, pool, amqp)
    await app.start_consumers()
    await app.start_relay()
    package = await add_package(pool, 1000)
    user = uuid4()
    await publish_as_outsider(
        connection, settings, PACKAGE_PURCHASE, PurchasePackage(user_id=user, package_id=package)
    )

    async def items() -> list[dict[str, Any]]:
        return await fetch(
            pool, "SELECT id FROM telecom.package_queue WHERE user_id = $1 ORDER BY id", user
        )

    await eventually(lambda: _any(items()))
    (item,) = await items()
    forged = CancelPackage(user_id=user, item_id=item["id"], operator="web:alice", reason="x")
    await publish_as_outsider(connection, settings, PACKAGE_CANCEL, forged, user_id=shop_user)
    async with pool.acquire() as conn, conn.transaction():  # an operator's, from the console
        await operations.cancel_item(conn, item["id"], "web:olga", "again")

    async def audited() -> list[dict[str, Any]]:
        return await fetch(pool, "SELECT operator, publisher FROM telecom.item_audit ORDER BY id")

    await eventually(lambda: _count(audited(), 2))
    assert await audited() == [
        {"operator": "web:alice", "publisher": shop_user},  # the shop's claim, the broker's word
        {"operator": "web:olga", "publisher": settings.amqp_user},  # pkgq vouches for its own
    ]

    def announced(seen: list[Any]) -> bool:
        return any(t.routing_key == PACKAGE_CANCELLED.name for t in seen)

    await tap.wait_for(announced, within=15)
    await app.close()
    (event,) = [t.json() for t in tap.on(PACKAGE_CANCELLED.name)]  # one cancel took effect
    assert (event["operator"], event["publisher"]) == ("web:alice", shop_user)


async def _any(rows: Any) -> bool:
    return bool(await rows)


async def _count(rows: Any, count: int) -> bool:
    return len(await rows) >= count


async def test_a_parked_command_keeps_its_first_publisher_until_it_is_applied(
    settings: Settings, pool: asyncpg.Pool
) -> None:
    """Postgres keeps a parked message without its AMQP properties: the publisher it was
    stamped with on arrival is what its audit says once the drain applies it."""

    def pipeline(route: Any) -> DeliveryPipeline:
        return DeliveryPipeline(
            pool,
            route,
            HANDLERS[route.name],
            RetryPolicy(),
            max_body_bytes=2**20,
            trusted_publisher=settings.amqp_user,
        )

    package = await add_package(pool, 1000)
    user, blocker = uuid4(), uuid4()
    buy = replace(
        raw_for(PACKAGE_PURCHASE, PurchasePackage(user_id=user, package_id=package)),
        publisher="shop",
    )
    assert await pipeline(PACKAGE_PURCHASE).process_batch([buy]) != []
    (item,) = await fetch(pool, "SELECT id FROM telecom.package_queue WHERE user_id = $1", user)
    async with pool.acquire() as conn:
        await holds.hold_many(
            conn, PACKAGE_CANCEL.short_name, [holds.NewHold(user, blocker, "retrying")]
        )
    cancels = pipeline(PACKAGE_CANCEL)
    cancel = replace(
        raw_for(
            PACKAGE_CANCEL, CancelPackage(user_id=user, item_id=item["id"], operator="web:alice")
        ),
        publisher="shop",
    )
    assert [r.fate for r in await cancels.process_batch([cancel])] == [Fate.PARKED]
    (parked,) = await fetch(pool, "SELECT headers::text AS headers FROM telecom.parked")
    assert json.loads(parked["headers"])[H_PUBLISHER] == "shop"

    async with pool.acquire() as conn:
        assert await holds.release_hold(conn, PACKAGE_CANCEL.short_name, user, blocker)
    assert await cancels.drain_parked() == 1
    assert await fetch(pool, "SELECT operator, publisher FROM telecom.item_audit") == [
        {"operator": "web:alice", "publisher": "shop"}
    ]
    (body,) = await fetch(
        pool, "SELECT body FROM telecom.outbox WHERE route = $1", PACKAGE_CANCELLED.name
    )
    assert json.loads(bytes(body["body"]))["publisher"] == "shop"
