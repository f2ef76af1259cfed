"""The batch pipeline on real Postgres: orders bought once (within a batch and across batches,
even when the first purchase's items are gone from the queue), retired packages refused, and
cancels and quota adjustments announced and audited with their reason and operator."""

from __future__ import annotations

import json
from collections.abc import Sequence
from datetime import timedelta
from uuid import UUID, uuid4

import asyncpg

from consumers.delivery import DeliveryPipeline
from consumers.registry import HANDLERS
from consumers.retry_policy import RetryPolicy
from domain.delivery import Fate
from events.decoding import RawDelivery
from events.models import AdjustQuota, CancelPackage, PackageQueuePushEvent, PurchasePackage
from events.routes import (
    PACKAGE_CANCEL,
    PACKAGE_CANCELLED,
    PACKAGE_PURCHASE,
    PACKAGE_QUEUING,
    QUOTA_ADJUST,
    Route,
)
from infra.postgres import catalog
from tests.support.deliveries import add_package, raw_for


async def run(pool: asyncpg.Pool, route: Route, raws: Sequence[RawDelivery]) -> list[Fate]:
    """One batch through the route's real pipeline."""
    pipeline = DeliveryPipeline(
        pool, route, HANDLERS[route.name], RetryPolicy(), max_body_bytes=2**20
    )
    return [r.fate for r in await pipeline.process_batch(raws)]


async def item_ids(pool: asyncpg.Pool, user: UUID) -> list[int]:
    async with pool.acquire() as conn:
        rows = await conn.fetch(
            "SELECT id FROM telecom.package_queue WHERE user_id = $1 ORDER BY id", user
        )
    return [r["id"] for r in rows]


async def dead_letter_reasons(pool: asyncpg.Pool) -> list[str]:
    async with pool.acquire() as conn:
        return [r["reason"] for r in await conn.fetch("SELECT reason FROM telecom.dead_letters")]


async def buy_and_activate(pool: asyncpg.Pool, user: UUID, package: int, amount: int) -> list[int]:
    purchase = PurchasePackage(user_id=user, package_id=package, amount=amount)
    assert await run(pool, PACKAGE_PURCHASE, [raw_for(PACKAGE_PURCHASE, purchase)]) == [Fate.ACKED]
    ids = await item_ids(pool, user)
    push = PackageQueuePushEvent(user_id=user, item_ids=ids, package_id=package, pushed_at=1)
    assert await run(pool, PACKAGE_QUEUING, [raw_for(PACKAGE_QUEUING, push)]) == [Fate.ACKED]
    return ids


async def test_two_purchases_of_one_order_in_one_batch_queue_one_set_of_items(
    pool: asyncpg.Pool,
) -> None:
    package = await add_package(pool, 1000)
    user, order = uuid4(), uuid4()
    first = PurchasePackage(user_id=user, package_id=package, by_order=order, amount=2)
    resent = PurchasePackage(user_id=user, package_id=package, by_order=order, amount=2)

    outcomes = await run(
        pool,
        PACKAGE_PURCHASE,
        [raw_for(PACKAGE_PURCHASE, first), raw_for(PACKAGE_PURCHASE, resent)],
    )

    assert outcomes == [Fate.ACKED, Fate.DUPLICATE_ORDER]
    ids = await item_ids(pool, user)
    assert len(ids) == 2
    async with pool.acquire() as conn:
        orders = await conn.fetch("SELECT by_order, item_ids FROM telecom.orders")
        pushes = await conn.fetchval(
            "SELECT count(*) FROM telecom.outbox WHERE route = $1", PACKAGE_QUEUING.name
        )
    assert [(r["by_order"], r["item_ids"]) for r in orders] == [(order, ids)]
    assert pushes == 1
    assert await dead_letter_reasons(pool) == []


async def test_a_resent_order_whose_items_have_left_the_queue_is_still_a_duplicate(
    pool: asyncpg.Pool,
) -> None:
    package = await add_package(pool, 1000)
    user, order = uuid4(), uuid4()
    body = PurchasePackage(user_id=user, package_id=package, by_order=order)
    assert await run(pool, PACKAGE_PURCHASE, [raw_for(PACKAGE_PURCHASE, body)]) == [Fate.ACKED]
    async with pool.acquire() as conn:  # the item ran its course: no longer loaded as live
        await conn.execute("UPDATE telecom.package_queue SET status = 'consumed'")
    other_user = uuid4()
    same_order_elsewhere = PurchasePackage(user_id=other_user, package_id=package, by_order=order)

    outcomes = await run(
        pool,
        PACKAGE_PURCHASE,
        [raw_for(PACKAGE_PURCHASE, body), raw_for(PACKAGE_PURCHASE, same_order_elsewhere)],
    )

    assert outcomes == [Fate.DUPLICATE_ORDER, Fate.ACKED]  # orders are per user
    assert len(await item_ids(pool, user)) == 1
    assert len(await item_ids(pool, other_user)) == 1


async def test_a_retired_package_is_dead_lettered_as_a_domain_rule_and_bought_items_stay(
    pool: asyncpg.Pool,
) -> None:
    package = await add_package(pool, 1000, timedelta(days=1))
    user = uuid4()
    [item] = await buy_and_activate(pool, user, package, 1)
    async with pool.acquire() as conn:
        await catalog.retire_package(conn, package)

    late = PurchasePackage(user_id=user, package_id=package)
    outcomes = await run(pool, PACKAGE_PURCHASE, [raw_for(PACKAGE_PURCHASE, late)])

    assert outcomes == [Fate.DEAD_LETTERED]
    assert await dead_letter_reasons(pool) == ["domain_rule"]
    async with pool.acquire() as conn:
        status = await conn.fetchval(
            "SELECT status::text FROM telecom.package_queue WHERE id = $1", item
        )
    assert await item_ids(pool, user) == [item]
    assert status == "active"


async def test_a_cancel_is_announced_through_the_outbox_and_audited_with_reason_and_operator(
    pool: asyncpg.Pool,
) -> None:
    package = await add_package(pool, 1000, timedelta(days=1))
    user = uuid4()
    first, second = await buy_and_activate(pool, user, package, 2)
    cancel = raw_for(
        PACKAGE_CANCEL,
        CancelPackage(user_id=user, item_id=first, reason="refund 42", operator="ops@host"),
    )

    assert await run(pool, PACKAGE_CANCEL, [cancel]) == [Fate.ACKED]

    async with pool.acquire() as conn:
        announced = await conn.fetch(
            "SELECT body FROM telecom.outbox WHERE route = $1", PACKAGE_CANCELLED.name
        )
        audit = await conn.fetch("SELECT * FROM telecom.item_audit")
    assert [json.loads(r["body"]) for r in announced] == [
        {
            "user_id": str(user),
            "item_id": first,
            "package_id": package,
            "cancelled_at": json.loads(announced[0]["body"])["cancelled_at"],
            "was_active": True,
            "reason": "refund 42",
            "operator": "ops@host",
            "publisher": "unverified",  # delivered without an AMQP user_id: nobody vouched
        }
    ]
    assert [
        (r["item_id"], r["user_id"], r["action"], r["reason"], r["operator"], str(r["message_id"]))
        for r in audit
    ] == [(first, user, "cancel", "refund 42", "ops@host", cancel.message_id)]
    assert [r["publisher"] for r in audit] == ["unverified"]
    assert second in await item_ids(pool, user)


async def test_a_quota_adjustment_is_audited_and_a_refused_one_leaves_no_audit_row(
    pool: asyncpg.Pool,
) -> None:
    package = await add_package(pool, 1000, timedelta(days=1))
    unlimited = await add_package(pool, None, timedelta(days=1))
    user, other = uuid4(), uuid4()
    [item] = await buy_and_activate(pool, user, package, 1)
    [time_only] = await buy_and_activate(pool, other, unlimited, 1)
    adjust = AdjustQuota(user_id=user, item_id=item, delta=-100, reason="goodwill", operator="me")
    refused = AdjustQuota(user_id=other, item_id=time_only, delta=-100, operator="me")

    outcomes = await run(
        pool, QUOTA_ADJUST, [raw_for(QUOTA_ADJUST, adjust), raw_for(QUOTA_ADJUST, refused)]
    )

    assert outcomes == [Fate.ACKED, Fate.DEAD_LETTERED]
    assert await dead_letter_reasons(pool) == ["domain_rule"]
    async with pool.acquire() as conn:
        audit = await conn.fetch("SELECT * FROM telecom.item_audit")
        quota = await conn.fetchval(
            "SELECT adjust_quota FROM telecom.package_queue WHERE id = $1", item
        )
    assert [(r["item_id"], r["action"], r["delta"], r["reason"], r["operator"]) for r in audit] == [
        (item, "adjust_quota", -100, "goodwill", "me")
    ]
    assert quota == -100
