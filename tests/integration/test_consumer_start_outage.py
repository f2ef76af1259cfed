"""A RabbitMQ connection lost while `pkgq run` is still setting up (a consumer's channel, QoS,
queue declaration or subscription) is an outage it waits out, as it does once running: the
consumer subscribes once the connection is back, once, and consumes. Seen in the network-fault
tests as `pkgq run` exiting with "RabbitMQ did not answer" when a reset came while its later
consumers were still starting."""

from __future__ import annotations

import asyncio
from collections.abc import Sequence
from urllib.parse import urlsplit
from uuid import UUID, uuid4

import asyncpg
import pytest
from aio_pika.abc import AbstractChannel, AbstractQueue, AbstractRobustConnection
from aiormq.exceptions import AMQPConnectionError, ChannelPreconditionFailed

from domain.delivery import Fate
from events.decoding import RawDelivery
from events.models import RecordUsage
from events.routes import USAGE_RECORD
from infra.outbox.relay import Relay
from infra.rabbit.connection import connect
from infra.rabbit.consumer import Decided, QueueConsumer
from infra.rabbit.management import passive_figures
from infra.rabbit.publisher import Publisher
from infra.rabbit.topology import declare_exchanges, declare_route_queue, route_queues
from infra.settings import Settings
from tests.support.cuttable import QUEUE_DECLARE, Cuttable
from tests.support.deliveries import Sending
from tests.support.observing import eventually


async def test_a_connection_reset_while_a_consumer_declares_its_queue_is_waited_out_and_it_consumes(
    settings: Settings, amqp: AbstractRobustConnection
) -> None:
    target = urlsplit(settings.amqp_url)
    async with Cuttable((target.hostname or "127.0.0.1", target.port or 5672)) as proxy:
        connection = await connect(proxy.url(settings.amqp_url), f"pkgq-test-{uuid4().hex[:8]}")
        await _consume_through(settings, amqp, connection, proxy)


async def _consume_through(
    settings: Settings,
    amqp: AbstractRobustConnection,
    connection: AbstractRobustConnection,
    proxy: Cuttable,
) -> None:
    declared = 0

    async def declare(channel: AbstractChannel) -> AbstractQueue:
        nonlocal declared
        declared += 1
        exchange, _ = await declare_exchanges(channel, settings)
        if declared > 1:
            return await declare_route_queue(channel, settings, exchange, USAGE_RECORD, 0)
        # The queue's declaration is sent and its answer never comes: the connection is
        # reset while the call waits for it.
        proxy.hold()
        declaring = asyncio.ensure_future(
            declare_route_queue(channel, settings, exchange, USAGE_RECORD, 0)
        )

        async def declaration_sent() -> bool:
            return any(QUEUE_DECLARE in chunk for chunk in proxy.held)

        await eventually(declaration_sent)
        proxy.cut()
        return await declaring

    seen: list[UUID] = []

    async def processor(raws: Sequence[RawDelivery]) -> list[Decided]:
        seen.extend(UUID(str(raw.message_id)) for raw in raws)
        return [Decided.of(i, raw, Fate.ACKED) for i, raw in enumerate(raws)]

    dead_letters = await Publisher.open(amqp, settings.dlx)
    queue_name, key = route_queues(settings, USAGE_RECORD.name)[0]
    consumer = QueueConsumer(key, declare, settings, connection, processor, dead_letters)
    try:
        await asyncio.wait_for(consumer.start(), timeout=30)
        assert declared >= 2  # the first attempt met the reset
        async with Sending(settings, amqp) as sending:
            sent = [
                await sending.send(USAGE_RECORD, RecordUsage(user_id=uuid4(), upload=1, download=1))
                for _ in range(5)
            ]

        async def all_processed() -> bool:
            return set(sent) <= set(seen)

        await eventually(all_processed, within=30)
        figures = await passive_figures(amqp, [queue_name])
        found = figures[queue_name]
        assert found is not None
        assert found[1] == 1  # one subscription: the half-made one was not restored beside it
        assert not consumer.failed.is_set()
    finally:
        await consumer.stop()
        await dead_letters.close()
        await connection.close()


async def test_a_queue_declared_with_other_arguments_still_fails_a_consumer_at_start(
    settings: Settings, amqp: AbstractRobustConnection
) -> None:
    """Only a lost connection is waited out: a refusal from a live broker fails at once."""
    name = f"pkgq-test-start-{uuid4().hex[:8]}"
    channel = await amqp.channel()
    await channel.declare_queue(name, auto_delete=True, arguments={"x-max-length": 5})

    async def declare(on: AbstractChannel) -> AbstractQueue:
        return await on.declare_queue(name, auto_delete=True, arguments={"x-max-length": 7})

    async def processor(raws: Sequence[RawDelivery]) -> list[Decided]:
        return [Decided.of(i, raw, Fate.ACKED) for i, raw in enumerate(raws)]

    consumer = QueueConsumer(name, declare, settings, amqp, processor, None)
    try:
        with pytest.raises(ChannelPreconditionFailed):
            await asyncio.wait_for(consumer.start(), timeout=30)
    finally:
        await consumer.stop()
        await channel.close()


async def test_a_connection_lost_again_while_subscribing_after_a_reconnection_is_waited_out(
    settings: Settings, amqp: AbstractRobustConnection, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The reopened channel's subscription meets a connection lost again (a flapping network):
    the consumer gives back and subscribes on a new channel, rather than fail the process."""
    connection = await connect(settings.amqp_url, f"pkgq-test-{uuid4().hex[:8]}")
    seen: list[UUID] = []

    async def processor(raws: Sequence[RawDelivery]) -> list[Decided]:
        seen.extend(UUID(str(raw.message_id)) for raw in raws)
        return [Decided.of(i, raw, Fate.ACKED) for i, raw in enumerate(raws)]

    queue_name, key = route_queues(settings, USAGE_RECORD.name)[0]

    async def declare(channel: AbstractChannel) -> AbstractQueue:
        exchange, _ = await declare_exchanges(channel, settings)
        return await declare_route_queue(channel, settings, exchange, USAGE_RECORD, 0)

    consumer = QueueConsumer(key, declare, settings, connection, processor, None)
    await consumer.start()
    take = consumer._take_deliveries
    lost = 0

    async def lost_once() -> None:
        nonlocal lost
        lost += 1
        if lost == 1:
            raise AMQPConnectionError("Server communication error: ConnectionResetError(104)")
        await take()

    monkeypatch.setattr(consumer, "_take_deliveries", lost_once)
    try:
        await consumer._consume_again()  # what the robust channel's reopen calls

        async def subscribed_again() -> bool:
            return consumer.consuming and lost >= 2

        await eventually(subscribed_again, within=30)
        async with Sending(settings, amqp) as sending:
            sent = [
                await sending.send(USAGE_RECORD, RecordUsage(user_id=uuid4(), upload=1, download=1))
                for _ in range(3)
            ]

        async def all_processed() -> bool:
            return set(sent) <= set(seen)

        await eventually(all_processed, within=30)
        found = (await passive_figures(amqp, [queue_name]))[queue_name]
        assert found is not None
        assert found[1] == 1
        assert not consumer.failed.is_set()
    finally:
        await consumer.stop()
        await connection.close()


async def test_a_connection_reset_while_the_relay_sets_up_is_waited_out_and_it_gets_ready(
    settings: Settings, pool: asyncpg.Pool, amqp: AbstractRobustConnection
) -> None:
    """`pkgq relay` too: its start-up (a channel, the topology, the publisher) meets a reset;
    it waits for the connection and gets ready to publish."""
    target = urlsplit(settings.amqp_url)
    async with Cuttable((target.hostname or "127.0.0.1", target.port or 5672)) as proxy:
        connection = await connect(proxy.url(settings.amqp_url), f"pkgq-test-{uuid4().hex[:8]}")
        relay = Relay(settings, pool, connection)
        stop = asyncio.Event()
        proxy.hold()  # the relay's first call (its channel's opening) is never answered
        running = asyncio.create_task(relay.run(stop))
        try:

            async def declaring() -> bool:
                return bool(proxy.held)

            await eventually(declaring)
            proxy.cut()

            async def relaying() -> bool:
                return relay.ready()

            await eventually(relaying, within=30)
            assert not running.done()
        finally:
            stop.set()
            await asyncio.wait_for(running, timeout=30)
            await connection.close()
