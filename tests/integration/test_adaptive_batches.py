"""Adaptive batches: a consumer waits (up to the linger) for batch_size deliveries, and takes up
to batch_max when that many are already in its prefetch buffer, so a backlog drains in large
batches while a trickle stays in small ones."""

from __future__ import annotations

import asyncio
from collections.abc import Sequence
from uuid import UUID, uuid4

from aio_pika.abc import AbstractRobustConnection

from domain.delivery import Fate
from events.decoding import RawDelivery
from events.models import RecordUsage
from events.routes import USAGE_RECORD
from infra.rabbit.connection import connect
from infra.rabbit.consumer import Decided, QueueConsumer
from infra.rabbit.publisher import Publisher
from infra.rabbit.route_consumer import route_consumer
from infra.settings import Settings
from tests.support.deliveries import send
from tests.support.observing import eventually


class Recorder:
    """A processor that applies everything and notes each batch's message ids."""

    def __init__(self) -> None:
        self.batches: list[list[UUID]] = []

    async def __call__(self, raws: Sequence[RawDelivery]) -> list[Decided]:
        self.batches.append([UUID(str(r.message_id)) for r in raws])
        await asyncio.sleep(0.01)  # a commit's worth: deliveries pile up meanwhile
        return [Decided.of(i, raw, Fate.ACKED) for i, raw in enumerate(raws)]

    @property
    def seen(self) -> list[UUID]:
        return [m for batch in self.batches for m in batch]


async def consume(
    settings: Settings, recorder: Recorder
) -> tuple[QueueConsumer, AbstractRobustConnection]:
    connection = await connect(settings.amqp_url, f"pkgq-test-batches-{uuid4().hex[:8]}")
    dead_letters = await Publisher.open(connection, settings.dlx)
    consumer = route_consumer(USAGE_RECORD, settings, connection, recorder, dead_letters)
    await consumer.start()
    return consumer, connection


async def drained_backlog(
    settings: Settings, tuned: Settings, amqp: AbstractRobustConnection, count: int
) -> tuple[list[UUID], Recorder]:
    """`count` usage records queued first, then drained by a consumer with `tuned` settings."""
    sent = [
        await send(settings, amqp, USAGE_RECORD, RecordUsage(user_id=uuid4(), upload=1, download=1))
        for _ in range(count)
    ]
    recorder = Recorder()
    consumer, connection = await consume(tuned, recorder)

    async def all_seen() -> bool:
        return len(recorder.seen) >= len(sent)

    await eventually(all_seen, within=30)
    await consumer.stop()
    await connection.close()
    return sent, recorder


async def test_a_backlog_is_taken_in_batches_beyond_batch_size_up_to_batch_max_in_order(
    settings: Settings, amqp: AbstractRobustConnection
) -> None:
    tuned = settings.model_copy(
        update={"batch_size": 4, "batch_max": 16, "prefetch": 64, "batch_linger_ms": 0}
    )
    sent, recorder = await drained_backlog(settings, tuned, amqp, 120)

    sizes = [len(batch) for batch in recorder.batches]
    assert recorder.seen == sent  # each once, in the order they were queued
    assert max(sizes) == 16  # a backlog fills batches beyond batch_size ...
    assert all(size <= 16 for size in sizes)  # ... but never beyond batch_max


async def test_a_trickle_is_taken_as_it_comes_never_waiting_beyond_the_linger(
    settings: Settings, amqp: AbstractRobustConnection
) -> None:
    tuned = settings.model_copy(
        update={"batch_size": 4, "batch_max": 16, "prefetch": 64, "batch_linger_ms": 20}
    )
    recorder = Recorder()
    consumer, connection = await consume(tuned, recorder)
    sent = []
    for _ in range(6):
        body = RecordUsage(user_id=uuid4(), upload=1, download=1)
        sent.append(await send(settings, amqp, USAGE_RECORD, body))

        async def taken(count: int = len(sent)) -> bool:
            return len(recorder.seen) >= count

        await eventually(taken, within=10)  # each is taken before the next is sent
    await consumer.stop()
    await connection.close()

    assert recorder.seen == sent
    assert [len(batch) for batch in recorder.batches] == [1] * 6


async def test_batch_max_below_batch_size_is_raised_to_it(settings: Settings) -> None:
    tuned = settings.model_copy(update={"batch_size": 8, "batch_max": 2})

    assert tuned.batch_max_for(USAGE_RECORD.name) == 8


async def test_a_batch_size_of_one_stays_one_at_a_time_whatever_batch_max_says(
    settings: Settings, amqp: AbstractRobustConnection
) -> None:
    tuned = settings.model_copy(update={"batch_size": 1, "batch_max": 16, "prefetch": 64})
    sent, recorder = await drained_backlog(settings, tuned, amqp, 20)

    assert tuned.batch_max_for(USAGE_RECORD.name) == 1
    assert recorder.seen == sent
    assert {len(batch) for batch in recorder.batches} == {1}
