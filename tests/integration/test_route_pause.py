"""A paused route's consumers stop taking deliveries and give back what they held, so its
messages wait on the broker in order; resumed, they are processed in that order. The pause is
a row in Postgres that the pause watch obeys, audited when it is made and when it ends."""

from __future__ import annotations

import asyncio
import re
from collections.abc import AsyncIterator, Awaitable, Callable, Sequence
from typing import Any
from uuid import UUID, uuid4

import asyncpg
import pytest
from aio_pika.abc import AbstractRobustConnection

from consumers.delivery import DeliveryPipeline
from consumers.ingest import ingester
from consumers.retry_policy import RetryPolicy
from consumers.route_pauses import PauseWatch
from consumers.runner import handler_for
from consumers.unit_of_work import HandlerContext
from domain.delivery import Fate
from events.decoding import RawDelivery
from events.envelope import H_SCHEMA_VERSION
from events.models import PurchasePackage, RecordUsage
from events.partitioning import route_of_key
from events.routes import PACKAGE_PURCHASE, USAGE_RECORD
from infra.postgres import consumer_pauses, operator_actions
from infra.rabbit.connection import connect
from infra.rabbit.consumer import Decided, QueueConsumer
from infra.rabbit.management import passive_figures
from infra.rabbit.publisher import Publisher
from infra.rabbit.route_consumer import route_consumer
from infra.rabbit.topology import route_queues
from infra.route_config import BreakerSettings
from infra.settings import Settings
from tests.support.deliveries import add_package, send, send_raw
from tests.support.in_process import StartApp
from tests.support.observing import eventually, fetch

USER = UUID("00000000-0000-4000-8000-00000000a11e")


class Recorder:
    """A processor that records message ids in order; `gate` holds a batch in hand."""

    def __init__(self) -> None:
        self.seen: list[UUID] = []
        self.gate = asyncio.Event()
        self.gate.set()
        self.holding = asyncio.Event()

    async def __call__(self, raws: Sequence[RawDelivery]) -> list[Decided]:
        self.holding.set()
        await self.gate.wait()
        self.seen.extend(UUID(str(raw.message_id)) for raw in raws)
        return [Decided.of(i, raw, Fate.ACKED) for i, raw in enumerate(raws)]


@pytest.fixture
async def recorder_consumer(
    settings: Settings,
    amqp: AbstractRobustConnection,  # declares the test's exchanges
) -> AsyncIterator[tuple[QueueConsumer, Recorder, AbstractRobustConnection]]:
    connection = await connect(settings.amqp_url, f"pkgq-test-pause-{uuid4().hex[:8]}")
    dead_letters = await Publisher.open(connection, settings.dlx)
    recorder = Recorder()
    tuned = settings.model_copy(update={"prefetch": 20})  # deliveries wait in the buffer
    consumer = route_consumer(USAGE_RECORD, tuned, connection, recorder, dead_letters)
    yield consumer, recorder, connection
    await consumer.stop()
    await connection.close()


async def _send_usages(settings: Settings, amqp: AbstractRobustConnection, n: int) -> list[UUID]:
    return [
        await send(settings, amqp, USAGE_RECORD, RecordUsage(user_id=USER, upload=k, download=1))
        for k in range(n)
    ]


async def _ready_and_consumers(
    amqp: AbstractRobustConnection, consumer: QueueConsumer
) -> tuple[int, int]:
    figures = (await passive_figures(amqp, [consumer._queue.name]))[consumer._queue.name]
    assert figures is not None
    return figures


async def test_a_paused_consumer_leaves_messages_on_the_broker_in_order_and_resumed_takes_them_in_that_order(  # noqa: E501
    settings: Settings,
    amqp: AbstractRobustConnection,
    recorder_consumer: tuple[QueueConsumer, Recorder, AbstractRobustConnection],
) -> None:
    consumer, recorder, _ = recorder_consumer
    await consumer.start()
    first = await _send_usages(settings, amqp, 3)

    async def first_done() -> bool:
        return recorder.seen == first

    await eventually(first_done)
    # A batch in hand when the pause comes is processed and settled first (acked: never
    # processed again); the deliveries buffered behind it go back, in their place.
    recorder.gate.clear()
    recorder.holding.clear()
    second = await _send_usages(settings, amqp, 5)
    await recorder.holding.wait()
    pausing = asyncio.create_task(consumer.pause())
    await asyncio.sleep(0.1)
    assert not pausing.done()  # waits for the batch in hand
    recorder.gate.set()
    await pausing
    assert consumer.paused
    assert consumer.consuming  # paused on purpose: still ready
    taken = len(recorder.seen) - len(first)
    assert 1 <= taken < 5 + 1
    third = await _send_usages(settings, amqp, 4)
    left = second[taken:] + third
    assert await _ready_and_consumers(amqp, consumer) == (len(left), 0)
    assert recorder.seen == first + second[:taken]

    await consumer.resume()

    async def all_done() -> bool:
        return len(recorder.seen) == len(first) + len(second) + len(third)

    await eventually(all_done)
    assert recorder.seen == first + second + third  # in order, each once
    assert (await _ready_and_consumers(amqp, consumer))[1] == 1


async def test_a_consumer_started_paused_declares_its_queue_and_takes_nothing_until_resumed(
    settings: Settings,
    amqp: AbstractRobustConnection,
    recorder_consumer: tuple[QueueConsumer, Recorder, AbstractRobustConnection],
) -> None:
    consumer, recorder, _ = recorder_consumer
    await consumer.start(paused=True)
    sent = await _send_usages(settings, amqp, 3)  # the queue exists: kept, not dropped
    assert await _ready_and_consumers(amqp, consumer) == (3, 0)
    assert recorder.seen == []
    await consumer.resume()

    async def done() -> bool:
        return recorder.seen == sent

    await eventually(done)


async def test_the_pause_watch_obeys_the_row_in_postgres_and_both_changes_are_audited(
    settings: Settings,
    pool: asyncpg.Pool,
    recorder_consumer: tuple[QueueConsumer, Recorder, AbstractRobustConnection],
) -> None:
    consumer, _, _ = recorder_consumer
    await consumer.start()
    watch = PauseWatch(pool, [consumer], every=60)
    async with pool.acquire() as conn:
        assert await consumer_pauses.pause(conn, USAGE_RECORD.name, "olga", "billing outage")
        assert not await consumer_pauses.pause(conn, USAGE_RECORD.name, "vic")  # once
    await watch.round()
    assert consumer.paused
    await watch.round()  # stays paused
    assert consumer.paused
    async with pool.acquire() as conn:
        assert await consumer_pauses.resume(conn, USAGE_RECORD.name, "olga")
        assert not await consumer_pauses.resume(conn, USAGE_RECORD.name, "olga")
        audit = await operator_actions.recent(conn, limit=10)
    await watch.round()
    assert not consumer.paused
    assert consumer.consuming
    assert [(a["action"], a["actor"]) for a in reversed(audit)] == [
        ("pause_route", "olga"),
        ("resume_route", "olga"),
    ]
    assert audit[1]["detail"]["reason"] == "billing outage"


async def test_the_pause_watch_leaves_the_dead_letter_ingester_alone_even_under_a_pause_of_its_queues_name(  # noqa: E501
    settings: Settings,
    pool: asyncpg.Pool,
    amqp: AbstractRobustConnection,
    recorder_consumer: tuple[QueueConsumer, Recorder, AbstractRobustConnection],
) -> None:
    consumer, _, connection = recorder_consumer
    dead_letters = ingester(settings, pool, connection)
    assert consumer.pausable
    assert not dead_letters.pausable
    await consumer.start()
    await dead_letters.start()
    try:
        watch = PauseWatch(pool, [dead_letters, consumer], every=60)
        async with pool.acquire() as conn:  # a row naming it: not a route, never obeyed
            await consumer_pauses.pause(conn, route_of_key(dead_letters.name), "olga")
            await consumer_pauses.pause(conn, USAGE_RECORD.name, "olga")
        await watch.round()
        assert consumer.paused
        assert not dead_letters.paused
        assert not watch.holds(dead_letters)
        figures = await passive_figures(amqp, [settings.dead_letter_queue])
        assert figures[settings.dead_letter_queue] == (0, 1)
    finally:
        await dead_letters.stop()


def _failing_purchases(
    settings: Settings, pool: asyncpg.Pool, failing: set[UUID]
) -> DeliveryPipeline:
    """The purchase route, whose handler raises for the users in `failing` (a handler error:
    the route's own failure), with one attempt each so that each is buried at once."""
    real = handler_for(settings, PACKAGE_PURCHASE)

    async def handler(ctx: HandlerContext, body: Any) -> None:
        if body.user_id in failing:
            raise RuntimeError("the shop's rating engine is down (injected)")
        await real(ctx, body)

    return DeliveryPipeline(
        pool,
        PACKAGE_PURCHASE,
        handler,
        RetryPolicy(max_attempts=1),
        max_body_bytes=settings.max_body_bytes,
        trusted_publisher=settings.amqp_user,
    )


async def test_the_circuit_breaker_pauses_a_route_whose_handler_fails_and_an_operator_resumes_it(
    settings: Settings,
    pool: asyncpg.Pool,
    amqp: AbstractRobustConnection,
    in_process: StartApp,
) -> None:
    breaker = BreakerSettings(failure_rate=0.5, min_deliveries=4, window_s=600)
    tuned = settings.model_copy(update={"breaker": breaker, "pause_poll": 0.2})
    failing = {uuid4() for _ in range(4)}
    app = in_process(tuned, pool, amqp)
    pipelines = {PACKAGE_PURCHASE.name: _failing_purchases(tuned, pool, failing)}
    await app.start_consumers([PACKAGE_PURCHASE], pipelines=pipelines)
    package = await add_package(pool, 1000)
    queue = route_queues(tuned, PACKAGE_PURCHASE.name)[0][0]
    good = uuid4()
    await send(tuned, amqp, PACKAGE_PURCHASE, PurchasePackage(user_id=good, package_id=package))
    for user in failing:  # the handler fails: each one a max_attempts dead letter
        await send(tuned, amqp, PACKAGE_PURCHASE, PurchasePackage(user_id=user, package_id=package))

    async def tripped() -> bool:
        async with pool.acquire() as conn:
            pause = (await consumer_pauses.paused(conn)).get(PACKAGE_PURCHASE.name)
        figures = (await passive_figures(amqp, [queue]))[queue]
        return pause is not None and figures is not None and figures[1] == 0

    await eventually(tripped)
    async with pool.acquire() as conn:
        pause = (await consumer_pauses.paused(conn))[PACKAGE_PURCHASE.name]
    assert pause.automatic
    assert pause.paused_by.startswith("breaker@")
    # 3 of 4 or 4 of 5, as the batches fell: at least 4 counted, at least half failed
    assert re.fullmatch(
        r"circuit breaker: [34] of [45] deliveries failed in the last 600 s \(\d+% >= 50%\)",
        pause.reason or "",
    ), pause.reason

    later = uuid4()  # waits on the broker while the route is paused
    await send(tuned, amqp, PACKAGE_PURCHASE, PurchasePackage(user_id=later, package_id=package))
    figures = (await passive_figures(amqp, [queue]))[queue]
    assert figures is not None
    ready, consumers = figures
    assert consumers == 0
    assert ready >= 1  # and the last failing one, if the trip came before it was taken
    assert not await _items_of(pool, later)
    async with pool.acquire() as conn:
        assert await consumer_pauses.resume(conn, PACKAGE_PURCHASE.name, "olga", "fixed")

    async def applied() -> bool:
        return await _items_of(pool, later) == 1

    await eventually(applied)


async def test_what_pkgq_refuses_never_trips_the_breaker_only_handler_failures_would(
    settings: Settings,
    pool: asyncpg.Pool,
    amqp: AbstractRobustConnection,
    in_process: StartApp,
) -> None:
    """Anyone who may publish can send garbage, broken domain rules, versions from the future
    or an expired copy: none of it is the route's failure, so none of it pauses the route for
    everyone (the same breaker as above trips at 4 failures of 8)."""
    breaker = BreakerSettings(failure_rate=0.5, min_deliveries=4, window_s=600)
    tuned = settings.model_copy(update={"breaker": breaker, "pause_poll": 0.2})
    app = in_process(tuned, pool, amqp)
    await app.start_consumers([PACKAGE_PURCHASE], ingest=True)
    package = await add_package(pool, 1000)
    for _ in range(4):  # no such package: each one a domain_rule dead letter
        missing = PurchasePackage(user_id=uuid4(), package_id=package + 1)
        await send(tuned, amqp, PACKAGE_PURCHASE, missing)
    for body in (b"{not json", b"[]", b"{}", b'{"user_id": 1}'):  # bad input
        await send_raw(tuned, amqp, PACKAGE_PURCHASE, body)
    newer = {H_SCHEMA_VERSION: PACKAGE_PURCHASE.schema_version + 7}  # unsupported_version
    await send_raw(tuned, amqp, PACKAGE_PURCHASE, b"{}", headers=newer)
    good = uuid4()
    await send(tuned, amqp, PACKAGE_PURCHASE, PurchasePackage(user_id=good, package_id=package))

    async def filed() -> bool:
        found = await fetch(pool, "SELECT count(*) AS n FROM telecom.dead_letters")
        return found[0]["n"] == 9 and await _items_of(pool, good) == 1

    await eventually(filed)
    await asyncio.sleep(0.6)  # three pause polls: a trip would have been obeyed by now
    async with pool.acquire() as conn:
        assert (await consumer_pauses.paused(conn)).get(PACKAGE_PURCHASE.name) is None
    after = uuid4()
    await send(tuned, amqp, PACKAGE_PURCHASE, PurchasePackage(user_id=after, package_id=package))

    async def applied() -> bool:
        return await _items_of(pool, after) == 1

    await eventually(applied)


async def _items_of(pool: asyncpg.Pool, user: UUID) -> int:
    async with pool.acquire() as conn:
        found: int = await conn.fetchval(
            "SELECT count(*) FROM telecom.package_queue WHERE user_id = $1", user
        )
    return found


async def test_a_breakers_pause_ends_by_itself_after_its_time_and_an_operators_never_does(
    pool: asyncpg.Pool,
) -> None:
    async with pool.acquire() as conn:
        await consumer_pauses.pause(conn, "telecom.usage_record", "breaker@h:1", automatic=True)
        await consumer_pauses.pause(conn, "telecom.quota_adjust", "olga")
        assert not await consumer_pauses.resume_breaker(conn, "telecom.usage_record", 3600)
        await conn.execute("SELECT pg_sleep(0.05)")
        assert await consumer_pauses.resume_breaker(conn, "telecom.usage_record", 0.01)
        assert not await consumer_pauses.resume_breaker(conn, "telecom.quota_adjust", 0.01)
        assert set(await consumer_pauses.paused(conn)) == {"telecom.quota_adjust"}
        audit = await operator_actions.recent(conn, limit=1)
    assert (audit[0]["action"], audit[0]["actor"]) == ("resume_route", "breaker")


async def test_every_replica_obeys_a_pause_and_one_started_while_paused_does_not_subscribe(
    settings: Settings,
    pool: asyncpg.Pool,
    amqp: AbstractRobustConnection,
    in_process: StartApp,
) -> None:
    tuned = settings.model_copy(update={"pause_poll": 0.2})
    queue = route_queues(tuned, PACKAGE_PURCHASE.name)[0][0]
    package = await add_package(pool, 1000)

    def consumers(count: int) -> Callable[[], Awaitable[bool]]:
        async def check() -> bool:
            figures = (await passive_figures(amqp, [queue]))[queue]
            return figures is not None and figures[1] == count

        return check

    first = in_process(tuned, pool, amqp)
    await first.start_consumers([PACKAGE_PURCHASE])
    await eventually(consumers(1))
    async with pool.acquire() as conn:
        await consumer_pauses.pause(conn, PACKAGE_PURCHASE.name, "olga")
    await eventually(consumers(0))
    second = in_process(tuned, pool, amqp)  # as after a restart, or a scale-up
    await second.start_consumers([PACKAGE_PURCHASE])
    user = uuid4()
    await send(tuned, amqp, PACKAGE_PURCHASE, PurchasePackage(user_id=user, package_id=package))
    assert (await passive_figures(amqp, [queue]))[queue] == (1, 0)

    async with pool.acquire() as conn:
        await consumer_pauses.resume(conn, PACKAGE_PURCHASE.name, "olga")
    await eventually(consumers(2))  # both replicas subscribe again

    async def applied() -> bool:
        return await _items_of(pool, user) == 1

    await eventually(applied)
