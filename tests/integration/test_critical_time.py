"""The time a user waits (infra/observability.py): from a message's publication to the commit
that applied it, through the real broker and Postgres. A publisher's clock ahead counts as no
wait and as clock skew; a retry is measured from its first publication; a purchase's time runs
on to the access grant it caused."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from uuid import UUID, uuid4

import asyncpg
from aio_pika.abc import AbstractRobustConnection
from prometheus_client import REGISTRY

from consumers.delivery import DeliveryPipeline
from consumers.handlers import usage_record
from consumers.retry_policy import RetryPolicy
from consumers.unit_of_work import HandlerContext
from events.envelope import H_SCHEMA_VERSION, H_SINCE, H_SINCE_CLOCK, H_USER_ID
from events.models import PurchasePackage, RecordUsage, WireModel
from events.routes import PACKAGE_ACTIVATE, PACKAGE_PURCHASE, USAGE_RECORD, Route
from infra.observability import CRITICAL_BOUNDS, critical_bucket
from infra.postgres import trends
from infra.rabbit.publisher import Publisher, build_message
from infra.settings import Settings
from tests.support.deliveries import add_package
from tests.support.in_process import InProcess, StartApp
from tests.support.observing import eventually, fetch


def sample(name: str, **labels: str) -> float:
    return REGISTRY.get_sample_value(name, labels) or 0.0


async def publish_at(
    settings: Settings,
    amqp: AbstractRobustConnection,
    route: Route,
    body: WireModel,
    timestamp: datetime,
) -> UUID:
    """Publish as pkgq's user does, with the AMQP timestamp `timestamp`."""
    message_id = uuid4()
    publisher = await Publisher.open(amqp, settings.exchange, user_id=settings.amqp_user)
    try:
        message = build_message(
            body.model_dump_json().encode(),
            message_id=message_id,
            message_type=route.message_type,
            headers={H_SCHEMA_VERSION: route.schema_version, H_USER_ID: str(body.user_id)},
            timestamp=timestamp,
        )
        await publisher.publish(message, route.name)
    finally:
        await publisher.close()
    return message_id


async def test_a_purchase_stamped_in_the_future_waits_no_time_and_counts_as_clock_skew(
    settings: Settings,
    pool: asyncpg.Pool,
    amqp: AbstractRobustConnection,
    in_process: StartApp,
) -> None:
    app = in_process(settings, pool, amqp)
    await app.start_consumers()
    await app.start_relay()
    purchase = {"route": PACKAGE_PURCHASE.name, "clock": "publisher"}
    activate = {"route": PACKAGE_ACTIVATE.name, "clock": "publisher"}
    skew = {"route": PACKAGE_PURCHASE.name, "direction": "ahead"}
    before = {
        "purchases": sample("pkgq_critical_seconds_count", **purchase),
        "purchase_seconds": sample("pkgq_critical_seconds_sum", **purchase),
        "activations": sample("pkgq_critical_seconds_count", **activate),
        "ahead": sample("pkgq_publisher_clock_skew_total", **skew),
        "granted": sample("pkgq_access_granted_seconds_count"),
        "granted_seconds": sample("pkgq_access_granted_seconds_sum"),
    }
    user = uuid4()
    package = await add_package(pool, 10_000, timedelta(days=30))
    an_hour_ahead = datetime.now(UTC) + timedelta(hours=1)
    await publish_at(
        settings, amqp, PACKAGE_PURCHASE, PurchasePackage(user_id=user, package_id=package),
        an_hour_ahead,
    )  # fmt: skip

    async def granted() -> bool:
        return sample("pkgq_access_granted_seconds_count") > before["granted"]

    await eventually(granted, within=30)
    assert sample("pkgq_critical_seconds_count", **purchase) == before["purchases"] + 1
    # An hour in the future: bounded to no wait at all, and counted as the publisher's skew.
    assert sample("pkgq_critical_seconds_sum", **purchase) == before["purchase_seconds"]
    assert sample("pkgq_publisher_clock_skew_total", **skew) == before["ahead"] + 1
    # Its activation (published by the relay, with a timestamp of its own) was measured too,
    # and the grant it caused is measured from the purchase's (future) time: 0 s, not negative.
    assert sample("pkgq_critical_seconds_count", **activate) == before["activations"] + 1
    assert sample("pkgq_access_granted_seconds_count") == before["granted"] + 1
    assert sample("pkgq_access_granted_seconds_sum") == before["granted_seconds"]
    (access,) = await fetch(pool, "SELECT granted FROM telecom.access WHERE user_id = $1", user)
    assert access["granted"]
    # The console's minute buckets got the purchase in the first bucket, in the batch's write.
    rows = await fetch(
        pool,
        "SELECT bucket, sum(count) AS n FROM telecom.critical_minutes WHERE route = $1 "
        "GROUP BY bucket",
        PACKAGE_PURCHASE.name,
    )
    assert [(r["bucket"], r["n"]) for r in rows] == [(0, 1)]
    async with pool.acquire() as conn:
        found = await trends.read_critical(conn, CRITICAL_BOUNDS, [PACKAGE_PURCHASE.name])
    purchases = found[PACKAGE_PURCHASE.name]
    assert purchases.count == 1
    assert purchases.p99 is not None
    assert purchases.p99 <= CRITICAL_BOUNDS[0]


async def test_a_retried_message_is_measured_from_its_first_publication(
    settings: Settings,
    pool: asyncpg.Pool,
    amqp: AbstractRobustConnection,
    app: InProcess,
) -> None:
    calls: list[UUID] = []

    async def fails_once(ctx: HandlerContext, body: RecordUsage) -> None:
        calls.append(body.user_id)
        if len(calls) == 1:
            raise RuntimeError("the rating engine is down")
        await usage_record.handle(ctx, body)

    policy = RetryPolicy(max_attempts=3, backoff=lambda _: 0.05)
    pipeline = DeliveryPipeline(pool, USAGE_RECORD, fails_once, policy, max_body_bytes=2**20)
    await app.start_consumers([USAGE_RECORD], pipelines={USAGE_RECORD.name: pipeline})
    labels = {"route": USAGE_RECORD.name, "clock": "publisher"}
    count, seconds = (sample(f"pkgq_critical_seconds_{s}", **labels) for s in ("count", "sum"))
    user = uuid4()
    # Published ten minutes ago (whole seconds, as AMQP carries it).
    first = (datetime.now(UTC) - timedelta(minutes=10)).replace(microsecond=0)
    await publish_at(
        settings, amqp, USAGE_RECORD, RecordUsage(user_id=user, upload=1, download=0), first
    )

    async def applied() -> bool:
        return sample("pkgq_critical_seconds_count", **labels) > count

    await eventually(applied, within=30)
    assert len(calls) == 2  # failed, then applied from its retry
    (retry,) = await fetch(
        pool, "SELECT headers FROM telecom.outbox WHERE route = $1", USAGE_RECORD.name
    )
    headers = retry["headers"]
    assert headers[H_SINCE_CLOCK] == "publisher"
    assert datetime.fromisoformat(headers[H_SINCE]) == first
    # The relay stamped the retry with its own publication time; the wait counts from the first.
    waited = sample("pkgq_critical_seconds_sum", **labels) - seconds
    assert waited >= 600
    rows = await fetch(
        pool,
        "SELECT bucket FROM telecom.critical_minutes WHERE route = $1",
        USAGE_RECORD.name,
    )
    assert [r["bucket"] for r in rows] == [critical_bucket(601)]  # in (600 s, 1800 s]
