"""pkgq's connections read and write frames in chunks (infra/rabbit/wire/frames.py):
against the real broker, empty bodies, small ones and bodies larger than a frame arrive whole
and in order, and
concurrent confirmed publishes, merged into fewer writes, arrive once each in order; an inline
consumer is called in the channel's reader task, in order, and a failed handover closes the
channel so that the broker gives everything from it on back, in order."""

from __future__ import annotations

import asyncio
from typing import Any, cast
from uuid import uuid4

import aio_pika
import aiormq.abc
import aiormq.connection
import pytest
from aio_pika.abc import AbstractQueue, AbstractRobustChannel, AbstractRobustConnection
from aiormq.abc import ChannelFrame

from events.decoding import RawDelivery
from infra.rabbit.deliveries import AmqpDelivery, Handover
from infra.rabbit.publisher import Publisher, build_message
from infra.rabbit.wire.frames import (
    BufferedFrameReceiver,
    CoalescingFrameGenerator,
    InlineDeliveryChannel,
)
from infra.settings import Settings
from tests.support.deliveries import consume_numbers


async def test_deliveries_of_every_size_arrive_whole_and_in_order_through_chunked_reads(
    amqp: AbstractRobustConnection,
) -> None:
    assert aiormq.connection.FrameReceiver is BufferedFrameReceiver
    bodies = [b"", b"x", bytes(range(256)) * 1000, b"{}" * 70_000, b"tail"]  # 256 KB: 2 frames
    channel = await amqp.channel(publisher_confirms=True)
    queue = await channel.declare_queue(f"pkgq.test.frames.{uuid4().hex}", exclusive=True)
    for number, body in enumerate(bodies * 20):
        await channel.default_exchange.publish(
            aio_pika.Message(body, headers={"n": number, "nested": {"deep": [number]}}),
            routing_key=queue.name,
        )
    underlay = await channel.get_underlay_channel()
    received: asyncio.Queue[aiormq.abc.DeliveredMessage] = asyncio.Queue()

    async def on_delivery(message: aiormq.abc.DeliveredMessage) -> None:
        received.put_nowait(message)

    await underlay.basic_qos(prefetch_count=50)
    await underlay.basic_consume(queue.name, on_delivery, no_ack=True)
    got = [await asyncio.wait_for(received.get(), 10) for _ in range(len(bodies) * 20)]
    assert [m.body for m in got] == bodies * 20
    assert [m.header.properties.headers for m in got] == [
        {"n": n, "nested": {"deep": [n]}} for n in range(len(bodies) * 20)
    ]
    await channel.close()


async def test_concurrent_confirmed_publishes_written_together_arrive_once_each_in_order(
    amqp: AbstractRobustConnection, settings: Settings, monkeypatch: pytest.MonkeyPatch
) -> None:
    assert aiormq.connection.FrameGenerator is CoalescingFrameGenerator
    channel = await amqp.channel()
    queue = await channel.declare_queue(f"pkgq.test.writes.{uuid4().hex}", exclusive=True)
    await queue.bind(settings.exchange, routing_key=queue.name)
    publisher = await Publisher.open(amqp, settings.exchange)
    count = 300  # more than a relay round (200 by default), fewer than WRITE_QUEUE
    writes: list[int] = []
    merge = CoalescingFrameGenerator.__anext__

    async def counted(self: CoalescingFrameGenerator) -> ChannelFrame:
        frame = await merge(self)
        writes.append(len(frame.payload))
        return frame

    monkeypatch.setattr(CoalescingFrameGenerator, "__anext__", counted)
    await asyncio.gather(
        *(
            publisher.publish(
                build_message(str(n).encode(), message_id=uuid4(), message_type="t", headers={}),
                queue.name,
            )
            for n in range(count)
        )
    )
    monkeypatch.undo()
    assert len(writes) < count / 4  # the publishes reached the socket in a few writes
    assert await consume_numbers(amqp, queue.name, count) == list(range(count))
    await publisher.close()
    await channel.close()


async def test_an_inline_consumer_gets_every_delivery_in_order_in_the_channels_own_task(
    amqp: AbstractRobustConnection,
) -> None:
    channel = await amqp.channel(publisher_confirms=True)
    underlay = await channel.get_underlay_channel()
    assert isinstance(underlay, InlineDeliveryChannel)
    queue = await _numbered(channel, "inline", 200)
    got: list[int] = []
    tasks: set[asyncio.Task[Any] | None] = set()
    done = asyncio.Event()

    def deliver(message: RawDelivery) -> None:
        tasks.add(asyncio.current_task())
        got.append(int(message.body))
        if len(got) == 200:
            done.set()

    await underlay.basic_qos(prefetch_count=300)
    buffer: asyncio.Queue[AmqpDelivery] = asyncio.Queue()
    inline = cast(aiormq.abc.ConsumerCallback, Handover(buffer, deliver))
    await underlay.basic_consume(queue.name, inline, no_ack=True)
    await asyncio.wait_for(done.wait(), 10)
    assert got == list(range(200))
    assert len(tasks) == 1  # one reader task, no Task per delivery
    await channel.close()


async def test_a_failed_inline_handover_hands_nothing_more_and_the_broker_gives_all_back_in_order(
    amqp: AbstractRobustConnection,
) -> None:
    channel = await amqp.channel(publisher_confirms=True)
    queue = await _numbered(channel, "handover", 100)
    robust = await amqp.channel()
    consuming = await robust.get_underlay_channel()
    got: list[int] = []

    def deliver(message: RawDelivery) -> None:
        if int(message.body) == 7:
            raise RuntimeError("a consumer's bug")
        got.append(int(message.body))

    await consuming.basic_qos(prefetch_count=100)
    buffer: asyncio.Queue[AmqpDelivery] = asyncio.Queue()
    inline = cast(aiormq.abc.ConsumerCallback, Handover(buffer, deliver))
    await consuming.basic_consume(queue.name, inline)
    await asyncio.wait([consuming.closing], timeout=10)
    assert consuming.is_closed  # closed by the failed handover
    assert got == list(range(7))  # nothing after the failure was handed over
    # None was acked: all given back, in order.
    assert await consume_numbers(amqp, queue.name, 100) == list(range(100))
    await robust.close()
    await channel.close()


async def test_a_coroutine_consumer_on_the_same_channel_class_still_gets_its_own_task(
    amqp: AbstractRobustConnection,
) -> None:
    channel = await amqp.channel(publisher_confirms=True)
    underlay = await channel.get_underlay_channel()
    queue = await _numbered(channel, "tasks", 20)
    tasks: set[asyncio.Task[Any] | None] = set()
    bodies: list[bytes] = []
    done = asyncio.Event()

    async def on_message(message: aiormq.abc.DeliveredMessage) -> None:
        tasks.add(asyncio.current_task())
        bodies.append(message.body)
        if len(bodies) == 20:
            done.set()

    await underlay.basic_consume(queue.name, on_message, no_ack=True)
    await asyncio.wait_for(done.wait(), 10)
    assert sorted(int(b) for b in bodies) == list(range(20))
    assert len(tasks) == 20
    await channel.close()


async def _numbered(channel: AbstractRobustChannel, kind: str, count: int) -> AbstractQueue:
    """An exclusive queue of the test's own holding the messages "0" .. str(count - 1)."""
    queue = await channel.declare_queue(f"pkgq.test.{kind}.{uuid4().hex}", exclusive=True)
    for n in range(count):
        await channel.default_exchange.publish(aio_pika.Message(str(n).encode()), queue.name)
    return queue
