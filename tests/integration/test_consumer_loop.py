"""The consumer loop survives its connection being closed under it, with deliveries buffered."""

from __future__ import annotations

import asyncio
import re
from collections.abc import Awaitable, Callable, Sequence
from uuid import UUID, uuid4

import aiormq.abc
import asyncpg
import pytest
from aio_pika.abc import AbstractRobustConnection
from aiormq.exceptions import ChannelAccessRefused

from domain.delivery import Fate
from events.decoding import RawDelivery
from events.envelope import H_DEAD_REASON
from events.models import RecordUsage
from events.routes import USAGE_RECORD
from infra.rabbit import deliveries
from infra.rabbit.connection import connect
from infra.rabbit.consumer import Decided, Processor, QueueConsumer
from infra.rabbit.deliveries import AmqpDelivery
from infra.rabbit.management import passive_figures
from infra.rabbit.publisher import Publisher
from infra.rabbit.route_consumer import route_consumer
from infra.rabbit.tap import Tap
from infra.settings import Settings
from tests.support.broker_connections import close_connection
from tests.support.deliveries import Sending, send
from tests.support.in_process import StartApp
from tests.support.observing import eventually


async def test_buffered_deliveries_of_a_closed_connection_are_redelivered_and_all_processed(
    settings: Settings, amqp: AbstractRobustConnection
) -> None:
    name = f"pkgq-test-consumer-{uuid4().hex[:8]}"
    connection = await connect(settings.amqp_url, name)
    seen: list[UUID] = []

    async def slow_processor(raw: RawDelivery) -> Fate:
        await asyncio.sleep(0.02)
        seen.append(UUID(str(raw.message_id)))
        return Fate.ACKED

    tuned = settings.model_copy(update={"prefetch": 10})  # deliveries wait in the buffer
    dead_letters = await Publisher.open(connection, settings.dlx)
    consumer = route_consumer(
        USAGE_RECORD, tuned, connection, one_at_a_time(slow_processor), dead_letters
    )
    await consumer.start()
    sent = []
    async with Sending(settings, amqp) as sending:
        for _ in range(40):
            body = RecordUsage(user_id=uuid4(), upload=1, download=1)
            sent.append(await sending.send(USAGE_RECORD, body))

    async def some_processed() -> bool:
        return len(seen) >= 5

    await eventually(some_processed)
    await close_connection(settings, name)

    async def all_processed() -> bool:
        return set(sent) <= set(seen)

    await eventually(all_processed, within=30)
    assert not consumer.failed.is_set()
    await consumer.stop()
    await connection.close()


def one_at_a_time(processor: Callable[[RawDelivery], Awaitable[Fate]]) -> Processor:
    """A batch processor made of a single-delivery one (batches here are of one anyway)."""

    async def run(raws: Sequence[RawDelivery]) -> list[Decided]:
        return [Decided.of(i, raw, await processor(raw)) for i, raw in enumerate(raws)]

    return run


async def _consume_with(
    settings: Settings, processor: Callable[[RawDelivery], Awaitable[Fate]]
) -> tuple[QueueConsumer, AbstractRobustConnection]:
    connection = await connect(settings.amqp_url, f"pkgq-test-consumer-{uuid4().hex[:8]}")
    dead_letters = await Publisher.open(connection, settings.dlx)
    consumer = route_consumer(
        USAGE_RECORD, settings, connection, one_at_a_time(processor), dead_letters
    )
    await consumer.start()
    return consumer, connection


async def test_an_outage_is_waited_out_and_the_message_applied_once(
    settings: Settings, amqp: AbstractRobustConnection, tap: Tap
) -> None:
    calls: list[UUID] = []

    async def flaky(raw: RawDelivery) -> Fate:
        calls.append(UUID(str(raw.message_id)))
        if len(calls) <= 7:  # more than tenacity's 5 quick attempts: the outage path
            raise ConnectionRefusedError(111, "Connect call failed")
        return Fate.ACKED

    consumer, connection = await _consume_with(settings, flaky)
    sent = await send(
        settings, amqp, USAGE_RECORD, RecordUsage(user_id=uuid4(), upload=1, download=1)
    )

    async def applied() -> bool:
        return consumer.processed == 1

    await eventually(applied, within=30)
    await consumer.stop()
    await connection.close()
    assert set(calls) == {sent}
    assert not [t for t in tap.seen if t.exchange == settings.dlx]


async def test_a_bug_in_the_failure_path_itself_sends_a_confirmed_copy_to_the_dlx_not_a_loop(
    settings: Settings, amqp: AbstractRobustConnection, tap: Tap
) -> None:
    poison = uuid4()
    applied: list[UUID] = []

    async def buggy(raw: RawDelivery) -> Fate:
        if raw.message_id == str(poison):
            raise asyncpg.InterfaceError(
                "the server expects 1 argument for this query, 2 were passed"
            )
        applied.append(UUID(str(raw.message_id)))
        return Fate.ACKED

    consumer, connection = await _consume_with(settings, buggy)
    body = RecordUsage(user_id=uuid4(), upload=1, download=1)
    await send(settings, amqp, USAGE_RECORD, body, message_id=poison)
    good = await send(settings, amqp, USAGE_RECORD, body)

    async def next_one_applied() -> bool:
        return good in applied

    await eventually(next_one_applied, within=15)
    await tap.wait_for(lambda seen: any(t.exchange == settings.dlx for t in seen), within=10)
    (dead,) = [t for t in tap.seen if t.exchange == settings.dlx]
    assert dead.message_id == str(poison)
    assert dead.headers[H_DEAD_REASON] == "handler_error"
    await consumer.stop()
    await connection.close()


async def test_each_message_of_a_batch_logs_one_line_with_its_ids_outcome_and_own_time(
    in_process: StartApp, settings: Settings, pool: asyncpg.Pool, amqp: AbstractRobustConnection
) -> None:
    from structlog.testing import capture_logs

    from consumers.publishing import publish
    from infra.tracing import configure_tracing

    configure_tracing("test")  # what every pkgq process does at start
    user = uuid4()
    trace = uuid4().hex
    app = in_process(settings, pool, amqp)
    with capture_logs() as logs:
        for upload in (1, 2, 3):
            await publish(
                settings,
                amqp,
                USAGE_RECORD,
                RecordUsage(user_id=user, upload=upload, download=0),
                traceparent=f"00-{trace}-{uuid4().hex[:16]}-01",
            )
        untraced = uuid4()  # published without a traceparent: its first hop starts a trace
        await publish(
            settings, amqp, USAGE_RECORD, RecordUsage(user_id=untraced, upload=1, download=0)
        )
        await app.start_consumers([USAGE_RECORD])

        async def four_logged() -> bool:
            return sum(1 for e in logs if e["event"] == "processed") == 4

        await eventually(four_logged)
        await app.close()
    (started,) = [e for e in logs if e["event"] == "processed" and e["user_id"] == str(untraced)]
    assert re.fullmatch(r"[0-9a-f]{32}", started["trace_id"])
    assert started["trace_id"] != trace
    lines = [e for e in logs if e["event"] == "processed" and e["user_id"] == str(user)]
    for line in lines:
        assert (
            line["route"]
            == settings.queue_name(USAGE_RECORD.name).removeprefix(settings.queue_prefix + ".")
            or line["route"] == USAGE_RECORD.name
        )
        assert line["user_id"] == str(user)
        assert line["trace_id"] == trace
        assert line["outcome"] == "acked"
        assert line["batch"] >= 1  # queued before the consumer started: usually one batch
        assert 0 <= line["ms"] <= line["batch_ms"]  # its own share of the batch's time
    assert len({line["message_id"] for line in lines}) == 3


async def test_a_poison_message_whose_dead_letter_copy_fails_is_not_acked_with_its_batch(
    settings: Settings, amqp: AbstractRobustConnection
) -> None:
    # A batch [poison, good] fails, so its deliveries are taken one at a time. The poison's
    # last-resort copy cannot be made (its exchange is gone) and the consumer is stopped
    # meanwhile: the poison must stay unacked and go back to the queue, not be taken along by
    # an ack of the good one.
    poison = uuid4()
    seen: list[UUID] = []

    async def batch_breaks_on_poison(raws: Sequence[RawDelivery]) -> list[Decided]:
        seen.extend(UUID(str(r.message_id)) for r in raws)
        if any(r.message_id == str(poison) for r in raws):
            raise RuntimeError("a bug in the failure path")
        return [Decided.of(i, raw, Fate.ACKED) for i, raw in enumerate(raws)]

    gone = f"{settings.exchange}.gone"
    channel = await amqp.channel()
    await channel.declare_exchange(gone, durable=False, auto_delete=False)
    connection = await connect(settings.amqp_url, f"pkgq-test-consumer-{uuid4().hex[:8]}")
    broken_dlx = await Publisher.open(connection, gone)
    await channel.exchange_delete(gone)
    body = RecordUsage(user_id=uuid4(), upload=1, download=1)
    await send(settings, amqp, USAGE_RECORD, body, message_id=poison)
    good = await send(settings, amqp, USAGE_RECORD, body)
    batched = settings.model_copy(update={"batch_size": 2, "batch_linger_ms": 500})
    consumer = route_consumer(USAGE_RECORD, batched, connection, batch_breaks_on_poison, broken_dlx)
    await consumer.start()

    async def poison_taken_alone() -> bool:
        return seen.count(poison) >= 2  # in the batch, then alone

    await eventually(poison_taken_alone, within=15)
    await consumer.stop()
    await connection.close()
    queue = await channel.declare_queue(
        f"{settings.queue_prefix}.{USAGE_RECORD.name}", passive=True
    )
    left = []
    while (message := await queue.get(fail=False, no_ack=True)) is not None:
        left.append(UUID(str(message.message_id)))
    await channel.close()
    assert poison in left  # back in the queue: neither lost nor dead-lettered
    assert set(left) <= {poison, good}


async def test_a_consumer_whose_queue_is_deleted_under_it_subscribes_again_and_goes_on(
    settings: Settings, amqp: AbstractRobustConnection
) -> None:
    """The broker cancels a subscription whose queue is deleted (an operator, a conversion):
    the consumer gives back what it holds, declares its queue again and consumes from it."""
    seen: list[UUID] = []

    async def record(raw: RawDelivery) -> Fate:
        seen.append(UUID(str(raw.message_id)))
        return Fate.ACKED

    consumer, connection = await _consume_with(settings, record)
    before = await send(
        settings, amqp, USAGE_RECORD, RecordUsage(user_id=uuid4(), upload=1, download=1)
    )

    async def first_seen() -> bool:
        return before in seen

    await eventually(first_seen)
    channel = await amqp.channel()
    await channel.queue_delete(f"{settings.queue_prefix}.{USAGE_RECORD.name}")

    async def subscribed_again() -> bool:
        name = f"{settings.queue_prefix}.{USAGE_RECORD.name}"
        figures = (await passive_figures(amqp, [name]))[name]  # None: not declared again yet
        return figures is not None and figures[1] > 0

    await eventually(subscribed_again, within=15)
    after = await send(
        settings, amqp, USAGE_RECORD, RecordUsage(user_id=uuid4(), upload=1, download=1)
    )

    async def second_seen() -> bool:
        return after in seen

    await eventually(second_seen, within=15)
    assert not consumer.failed.is_set()
    await channel.close()
    await consumer.stop()
    await connection.close()


async def test_a_consumer_that_cannot_subscribe_again_after_a_reconnection_fails_loudly(
    settings: Settings, amqp: AbstractRobustConnection, monkeypatch: pytest.MonkeyPatch
) -> None:
    """If the broker refuses the subscription on the reopened channel, the consumer is marked
    failed, so the process exits and is restarted (its deliveries go back to the queue), rather
    than stay up consuming nothing. (A connection lost again meanwhile is waited out instead:
    tests/integration/test_consumer_start_outage.py.)"""

    async def record(raw: RawDelivery) -> Fate:
        return Fate.ACKED

    consumer, connection = await _consume_with(settings, record)

    async def refused() -> None:
        raise ChannelAccessRefused("ACCESS_REFUSED - the queue is not this user's")

    monkeypatch.setattr(consumer, "_take_deliveries", refused)
    await consumer._consume_again()  # what the robust channel's reopen calls

    assert consumer.failed.is_set()
    await consumer.stop()
    await connection.close()


async def test_a_delivery_failing_to_reach_the_buffer_comes_back_and_all_are_processed_in_order(
    settings: Settings, amqp: AbstractRobustConnection, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A failed handover (infra/rabbit/deliveries.Handover) closes the channel: the failed
    delivery and everything after it come back on the reopened channel, in order, and the
    consumer goes on; nothing is lost."""
    handed = 0

    def fails_once(message: aiormq.abc.DeliveredMessage) -> AmqpDelivery:
        nonlocal handed
        handed += 1
        if handed == 10:
            raise RuntimeError("a handover that fails")
        return AmqpDelivery(message)

    monkeypatch.setattr(deliveries, "AmqpDelivery", fails_once)
    connection = await connect(settings.amqp_url, f"pkgq-test-handover-{uuid4().hex[:8]}")
    seen: list[UUID] = []

    async def record(raw: RawDelivery) -> Fate:
        seen.append(UUID(str(raw.message_id)))
        return Fate.ACKED

    dead_letters = await Publisher.open(connection, settings.dlx)
    consumer = route_consumer(
        USAGE_RECORD, settings, connection, one_at_a_time(record), dead_letters
    )
    user = uuid4()
    sent = [
        await send(settings, amqp, USAGE_RECORD, RecordUsage(user_id=user, upload=n, download=0))
        for n in range(40)
    ]
    await consumer.start()

    async def all_processed() -> bool:
        return set(sent) <= set(seen)

    await eventually(all_processed, within=30)
    assert handed > 40  # the failed one and those after it were delivered again
    assert list(dict.fromkeys(seen)) == sent  # first applied in the order sent, none lost
    assert not consumer.failed.is_set()
    await consumer.stop()
    await connection.close()
