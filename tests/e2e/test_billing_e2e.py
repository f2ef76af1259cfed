"""Billing-grade behaviour end to end, with real `pkgq run` and `pkgq relay` processes: resent
orders, terms fixed at purchase, packages exhausted at activation, unlimited traffic, the
current package following the clock, and cancels announced and audited from the CLI."""

from __future__ import annotations

import json
from collections.abc import Callable
from datetime import timedelta
from uuid import UUID, uuid4

import asyncpg
import pytest
from aio_pika.abc import AbstractRobustConnection

from events.models import PurchasePackage, RecordUsage
from events.routes import (
    ALL_EXPIRED,
    EXPIRY_DUE,
    PACKAGE_ACTIVATE,
    PACKAGE_CANCELLED,
    PACKAGE_EXPIRING,
    PACKAGE_PURCHASE,
    PACKAGE_QUEUING,
    USAGE_RECORD,
)
from infra.rabbit.tap import Tap
from infra.settings import Settings
from tests.support.deliveries import add_package, send
from tests.support.observing import eventually
from tests.support.processes import PkgqProcess, cli

pytestmark = pytest.mark.e2e


def events_of(tap: Tap, settings: Settings, route: str, user: UUID) -> list[dict[str, object]]:
    return [
        t.json()
        for t in tap.seen
        if t.routing_key == route
        and t.exchange == settings.exchange
        and t.json().get("user_id") == str(user)
    ]


async def rows(pool: asyncpg.Pool, user: UUID) -> list[asyncpg.Record]:
    async with pool.acquire() as conn:
        return list(
            await conn.fetch(
                "SELECT id, status::text AS status, upload, expire_at, expire_at <= now() AS due "
                "FROM telecom.package_queue WHERE user_id = $1 ORDER BY id",
                user,
            )
        )


async def statuses(pool: asyncpg.Pool, user: UUID) -> list[str]:
    return [r["status"] for r in await rows(pool, user)]


async def show(settings: Settings, user: UUID) -> dict[str, object]:
    out = await cli(settings, "user", "show", str(user), "--json")
    assert out.returncode == 0, out.stderr
    result: dict[str, object] = json.loads(out.stdout)
    return result


async def test_a_purchase_resent_with_a_new_message_id_leaves_one_set_of_items(
    settings: Settings,
    pool: asyncpg.Pool,
    amqp: AbstractRobustConnection,
    tap: Tap,
    spawn: Callable[..., PkgqProcess],
) -> None:
    package = await add_package(pool, 1000, timedelta(days=1))
    user, order = uuid4(), uuid4()
    body = PurchasePackage(user_id=user, package_id=package, by_order=order, amount=2)
    spawn("relay")
    run = spawn("run")
    await send(settings, amqp, PACKAGE_PURCHASE, body)

    async def activated() -> bool:
        return await statuses(pool, user) == ["active", "in_queue"]

    await eventually(activated, within=30)
    resent = await send(settings, amqp, PACKAGE_PURCHASE, body)  # a new message_id

    def said_duplicate() -> bool:
        return any(
            f'"{resent}"' in line and '"outcome": "duplicate_order"' in line
            for line in run.logs().splitlines()
        )

    async def logged() -> bool:
        return said_duplicate()

    await eventually(logged, within=30)
    assert await statuses(pool, user) == ["active", "in_queue"]
    assert len(events_of(tap, settings, PACKAGE_QUEUING.name, user)) == 1
    async with pool.acquire() as conn:
        assert await conn.fetchval("SELECT count(*) FROM telecom.dead_letters") == 0


async def test_a_catalog_edit_after_a_purchase_leaves_the_bought_items_quota_unchanged(
    settings: Settings,
    pool: asyncpg.Pool,
    amqp: AbstractRobustConnection,
    spawn: Callable[..., PkgqProcess],
) -> None:
    package = await add_package(pool, 1000, timedelta(days=1), name="1000 B / day")
    user = uuid4()
    spawn("relay")
    spawn("run")
    await send(settings, amqp, PACKAGE_PURCHASE, PurchasePackage(user_id=user, package_id=package))

    async def active() -> bool:
        return await statuses(pool, user) == ["active"]

    await eventually(active, within=30)
    edit = await cli(
        settings,
        "catalog",
        "edit",
        str(package),
        "10 B / hour",
        "--traffic",
        "10",
        "--duration",
        "1h",
    )
    assert edit.returncode == 0, edit.stderr
    await send(settings, amqp, USAGE_RECORD, RecordUsage(user_id=user, upload=500, download=0))

    async def billed() -> bool:
        return [r["upload"] for r in await rows(pool, user)] == [500]

    await eventually(billed, within=30)
    state = await show(settings, user)
    packages = state["packages"]
    assert isinstance(packages, list)
    [item] = packages
    assert (item["status"], item["quota"], item["remaining"]) == ("active", 1000, 500)
    assert (item["package"], item["duration_s"]) == ("1000 B / day", 86400)


async def test_zero_duration_and_zero_traffic_packages_expire_at_once_and_the_queue_moves_on(
    settings: Settings,
    pool: asyncpg.Pool,
    amqp: AbstractRobustConnection,
    tap: Tap,
    spawn: Callable[..., PkgqProcess],
) -> None:
    zero_time = await add_package(pool, 1000, timedelta(0))
    zero_traffic = await add_package(pool, 0, timedelta(days=1))
    normal = await add_package(pool, 1000, timedelta(days=1))
    user = uuid4()
    for package in (zero_time, zero_traffic, normal):
        await send(
            settings, amqp, PACKAGE_PURCHASE, PurchasePackage(user_id=user, package_id=package)
        )
    # All three are queued before the relay publishes the first queue push: one queue to walk.
    spawn("run")

    async def queued() -> bool:
        return await statuses(pool, user) == ["in_queue"] * 3

    await eventually(queued, within=30)
    spawn("relay")

    async def moved_on() -> bool:
        return await statuses(pool, user) == ["consumed", "consumed", "active"] and (
            len(events_of(tap, settings, PACKAGE_EXPIRING.name, user)) == 2
            and len(events_of(tap, settings, PACKAGE_ACTIVATE.name, user)) == 3
        )

    await eventually(moved_on, within=30)
    ids = [r["id"] for r in await rows(pool, user)]
    activated = [e["item_id"] for e in events_of(tap, settings, PACKAGE_ACTIVATE.name, user)]
    expired = [
        (e["item_id"], e["reason"]) for e in events_of(tap, settings, PACKAGE_EXPIRING.name, user)
    ]
    assert activated == ids
    assert expired == [(ids[0], "time"), (ids[1], "usage")]
    assert events_of(tap, settings, ALL_EXPIRED.name, user) == []


async def test_an_unlimited_traffic_package_expires_only_by_time(
    settings: Settings,
    pool: asyncpg.Pool,
    amqp: AbstractRobustConnection,
    tap: Tap,
    spawn: Callable[..., PkgqProcess],
) -> None:
    time_only = await add_package(pool, None, timedelta(seconds=6))
    user = uuid4()
    spawn("relay")
    spawn("run")
    await send(
        settings, amqp, PACKAGE_PURCHASE, PurchasePackage(user_id=user, package_id=time_only)
    )

    async def active() -> bool:
        return await statuses(pool, user) == ["active"]

    await eventually(active, within=30)
    await send(settings, amqp, USAGE_RECORD, RecordUsage(user_id=user, upload=2**40, download=0))

    async def billed_or_expired() -> bool:
        return [r["upload"] for r in await rows(pool, user)] == [2**40]

    await eventually(billed_or_expired, within=30)

    async def ended() -> bool:
        return len(events_of(tap, settings, ALL_EXPIRED.name, user)) == 1

    await eventually(ended, within=30)
    expired = [e["reason"] for e in events_of(tap, settings, PACKAGE_EXPIRING.name, user)]
    assert expired == ["time"]
    assert await statuses(pool, user) == ["consumed"]


async def test_user_show_reports_an_item_past_its_expire_at_as_expired_before_its_timer_runs(
    settings: Settings,
    pool: asyncpg.Pool,
    amqp: AbstractRobustConnection,
    tap: Tap,
    spawn: Callable[..., PkgqProcess],
) -> None:
    package = await add_package(pool, 1000, timedelta(seconds=12))
    user = uuid4()
    relay = spawn("relay")
    spawn("run")
    await send(settings, amqp, PACKAGE_PURCHASE, PurchasePackage(user_id=user, package_id=package))

    async def active() -> bool:
        return await statuses(pool, user) == ["active"]

    await eventually(active, within=30)
    assert relay.terminate() == 0, relay.logs()  # nobody publishes the timer now

    async def past_expire_at() -> bool:
        return [r["due"] for r in await rows(pool, user)] == [True]

    await eventually(past_expire_at, within=30)
    state = await show(settings, user)

    async with pool.acquire() as conn:
        timer_pending = await conn.fetchval(
            "SELECT count(*) FROM telecom.outbox WHERE route = $1 AND published_at IS NULL",
            EXPIRY_DUE.name,
        )
    assert timer_pending == 1  # the timer has not run: the stored status is still active
    assert await statuses(pool, user) == ["active"]
    assert state["current"] is None
    packages = state["packages"]
    assert isinstance(packages, list)
    [item] = packages
    assert (item["status"], item["expired_by_time_pending_timer"]) == ("consumed", True)

    spawn("relay")  # the timer runs and the stored status catches up

    async def consumed_and_announced() -> bool:
        # The status commits before the relay publishes package_expiring: wait for both.
        announced = events_of(tap, settings, PACKAGE_EXPIRING.name, user)
        return bool(announced) and await statuses(pool, user) == ["consumed"]

    await eventually(consumed_and_announced, within=30)
    expired = [e["reason"] for e in events_of(tap, settings, PACKAGE_EXPIRING.name, user)]
    assert expired == ["time"]


async def test_a_cancel_from_the_cli_is_announced_and_audited_with_its_reason_and_operator(
    settings: Settings,
    pool: asyncpg.Pool,
    amqp: AbstractRobustConnection,
    tap: Tap,
    spawn: Callable[..., PkgqProcess],
) -> None:
    package = await add_package(pool, 1000, timedelta(days=1))
    user = uuid4()
    spawn("relay")
    spawn("run")
    await send(
        settings,
        amqp,
        PACKAGE_PURCHASE,
        PurchasePackage(user_id=user, package_id=package, amount=2),
    )

    async def active() -> bool:
        return await statuses(pool, user) == ["active", "in_queue"]

    await eventually(active, within=30)
    queued = (await rows(pool, user))[1]["id"]
    done = await cli(settings, "user", "cancel", str(queued), "--reason", "refund #7")
    assert done.returncode == 0, done.stderr

    async def announced() -> bool:
        return len(events_of(tap, settings, PACKAGE_CANCELLED.name, user)) == 1

    await eventually(announced, within=30)
    [event] = events_of(tap, settings, PACKAGE_CANCELLED.name, user)
    assert (event["item_id"], event["was_active"], event["reason"]) == (queued, False, "refund #7")
    async with pool.acquire() as conn:
        audit = await conn.fetchrow("SELECT * FROM telecom.item_audit WHERE item_id = $1", queued)
    assert audit is not None
    assert (audit["action"], audit["reason"]) == ("cancel", "refund #7")
    assert audit["operator"] == event["operator"]
    assert "@" in str(audit["operator"])  # user@host of whoever ran the command
    assert await statuses(pool, user) == ["active", "cancelled"]
