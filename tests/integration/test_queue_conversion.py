"""Moving a broker from classic to quorum queues by drain-and-recreate (infra/rabbit/convert.py):
what was queued is drained by the old consumers, what comes in meanwhile waits in a holding
queue and is moved into the new queue as it was; nothing is lost, order is kept, and the result
is exactly what pkgq declares for the replicated profile."""

from __future__ import annotations

import asyncio
from uuid import uuid4

import aio_pika
import pytest
from aio_pika.abc import AbstractIncomingMessage, AbstractRobustConnection
from aiormq.exceptions import ChannelNotFoundEntity

from events.routes import USAGE_RECORD
from infra.rabbit.convert import HOLDING_SUFFIX, Progress, convert, queue_specs
from infra.rabbit.topology import declare_all, route_queues
from infra.settings import Settings
from tests.support.deliveries import consume_numbers
from tests.support.observing import eventually


async def _publish(
    channel: aio_pika.abc.AbstractChannel, exchange: str, key: str, n: range
) -> None:
    target = await channel.get_exchange(exchange)
    for i in n:
        await target.publish(
            aio_pika.Message(str(i).encode(), message_id=str(uuid4()), user_id="guest"), key
        )


async def test_classic_queues_become_quorum_queues_with_nothing_lost_and_order_kept(
    settings: Settings, amqp: AbstractRobustConnection
) -> None:
    quorum = settings.model_copy(update={"queue_type": "quorum"})
    ((queue, key),) = route_queues(settings, USAGE_RECORD.name)
    channel = await amqp.channel()
    await _publish(channel, settings.exchange, key, range(5))  # queued before the conversion
    await _publish(channel, settings.dlx, "some.route", range(100, 102))  # two dead letters

    reports: list[Progress] = []
    conversion = asyncio.create_task(convert(amqp, quorum, reports.append))
    specs = queue_specs(quorum)
    await eventually(lambda: _all_held(reports, len(specs)), within=30)

    # Held: what comes in now waits in the holding queue, the old queue only drains.
    await _publish(channel, settings.exchange, key, range(5, 10))
    await _publish(channel, settings.dlx, "some.route", range(102, 103))
    old = await channel.declare_queue(queue, passive=True)
    drained: list[int] = []

    async def old_consumer(message: AbstractIncomingMessage) -> None:
        drained.append(int(message.body))
        await message.ack()

    tag = await old.consume(old_consumer)
    await eventually(lambda: _count(drained, 5), within=10)
    await old.cancel(tag)  # the operator stops the route's consumers once it is drained
    # The old dead-letter queue still holds its two: drain it as the ingester would.
    dead_old = await channel.declare_queue(settings.dead_letter_queue, passive=True)
    while (message := await dead_old.get(no_ack=True, fail=False)) is not None:
        drained.append(int(message.body))

    moved = await asyncio.wait_for(conversion, timeout=60)
    assert moved[queue] == 5
    assert moved[settings.dead_letter_queue] == 1
    assert drained == [0, 1, 2, 3, 4, 100, 101]

    # Every queue is now exactly what the replicated profile declares (a redeclare with other
    # arguments would fail), and no holding queue is left.
    check = await amqp.channel()
    await declare_all(check, quorum)
    for spec in specs:
        probe = await amqp.channel()
        with pytest.raises(ChannelNotFoundEntity):
            await probe.declare_queue(spec.name + HOLDING_SUFFIX, passive=True)
    assert await consume_numbers(amqp, queue, 5) == [5, 6, 7, 8, 9]
    assert await consume_numbers(amqp, settings.dead_letter_queue, 1) == [102]
    # And the new queue is bound: a message published now arrives in it.
    await _publish(channel, settings.exchange, key, range(10, 11))
    assert await consume_numbers(amqp, queue, 1) == [10]
    # Nothing else is there to deliver: no copy, nothing left behind. (RabbitMQ 3.10.8 may go
    # on counting the moved messages as ready after they were acked, so this asks a consumer.)
    with pytest.raises(TimeoutError):
        await asyncio.wait_for(consume_numbers(amqp, queue, 1), timeout=2)


async def test_a_second_conversion_finds_nothing_to_convert(
    settings: Settings, amqp: AbstractRobustConnection
) -> None:
    quorum = settings.model_copy(update={"queue_type": "quorum"})
    first = await asyncio.wait_for(convert(amqp, quorum, lambda _: None), timeout=60)
    assert set(first) == {spec.name for spec in queue_specs(quorum)}
    assert await convert(amqp, quorum, lambda _: None) == {}


async def _all_held(reports: list[Progress], n: int) -> bool:
    return len({r.queue for r in reports if r.step == "holding"}) == n


async def _count(found: list[int], n: int) -> bool:
    return len(found) >= n
