"""Publishes begun together go to the broker in one write (infra/rabbit/coalesce.py), and the
broker's answer for each settles that publish alone: a return or a nack between two confirmed
messages fails only its own, and a publish cancelled before the write is never sent."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from uuid import uuid4

import pytest
from aio_pika.abc import AbstractQueue, AbstractRobustConnection

from infra.rabbit.publisher import Publisher, PublishFailedError, build_properties
from infra.settings import Settings


@pytest.fixture
async def queues(
    settings: Settings, amqp: AbstractRobustConnection
) -> AsyncIterator[tuple[AbstractQueue, AbstractQueue]]:
    """On the test's exchange: key "ok" to a plain queue, key "full" to a queue that holds one
    message and nacks any more (x-overflow=reject-publish); any other key is unroutable."""
    channel = await amqp.channel()
    ok = await channel.declare_queue(f"{settings.queue_prefix}.coalesced.ok", auto_delete=True)
    full = await channel.declare_queue(
        f"{settings.queue_prefix}.coalesced.full",
        auto_delete=True,
        arguments={"x-max-length": 1, "x-overflow": "reject-publish"},
    )
    await ok.bind(settings.exchange, routing_key="ok")
    await full.bind(settings.exchange, routing_key="full")
    yield ok, full
    await channel.close()


async def _publish(publisher: Publisher, body: str, key: str) -> None:
    properties = build_properties(message_id=uuid4(), message_type="test", headers={})
    await publisher.publish_properties(body.encode(), properties, key)


async def _bodies(queue: AbstractQueue) -> list[str]:
    found = []
    while (message := await queue.get(no_ack=True, fail=False)) is not None:
        found.append(message.body.decode())
    return found


async def test_publishes_begun_together_go_out_in_one_write_in_order_each_confirmed(
    settings: Settings, amqp: AbstractRobustConnection, queues: tuple[AbstractQueue, ...]
) -> None:
    ok, _ = queues
    publisher = await Publisher.open(amqp, settings.exchange)
    try:
        await asyncio.gather(*(_publish(publisher, f"m{i}", "ok") for i in range(40)))
        coalescer = publisher._coalescer
        assert coalescer is not None
        assert coalescer.writes == 1
        await asyncio.gather(*(_publish(publisher, f"n{i}", "ok") for i in range(3)))
        assert coalescer.writes == 2
    finally:
        await publisher.close()
    assert await _bodies(ok) == [f"m{i}" for i in range(40)] + [f"n{i}" for i in range(3)]


async def test_a_return_and_a_nack_inside_one_write_fail_only_their_own_publishes(
    settings: Settings, amqp: AbstractRobustConnection, queues: tuple[AbstractQueue, ...]
) -> None:
    ok, full = queues
    publisher = await Publisher.open(amqp, settings.exchange)
    plan = [("a", "ok"), ("b", "nowhere"), ("c", "full"), ("d", "full"), ("e", "ok")]
    try:
        outcomes = await asyncio.gather(
            *(_publish(publisher, body, key) for body, key in plan), return_exceptions=True
        )
        # The channel goes on: a later publish is confirmed.
        await _publish(publisher, "f", "ok")
    finally:
        await publisher.close()
    assert outcomes[0] is None
    assert outcomes[2] is None
    assert outcomes[4] is None
    returned, nacked = outcomes[1], outcomes[3]
    assert isinstance(returned, PublishFailedError)
    assert returned.returned
    assert isinstance(nacked, PublishFailedError)
    assert not nacked.returned
    assert await _bodies(ok) == ["a", "e", "f"]
    assert await _bodies(full) == ["c"]


async def test_a_publish_cancelled_before_the_write_is_never_sent_and_tags_stay_in_step(
    settings: Settings, amqp: AbstractRobustConnection, queues: tuple[AbstractQueue, ...]
) -> None:
    ok, _ = queues
    publisher = await Publisher.open(amqp, settings.exchange)
    try:
        first = asyncio.create_task(_publish(publisher, "cancelled", "ok"))
        second = asyncio.create_task(_publish(publisher, "sent", "ok"))
        await asyncio.sleep(0)  # both have begun; the write has not run yet
        first.cancel()
        await second
        with pytest.raises(asyncio.CancelledError):
            await first
        # Confirms still match their publishes: each of these is confirmed, none hangs.
        await asyncio.wait_for(
            asyncio.gather(*(_publish(publisher, f"later{i}", "ok") for i in range(5))), 10
        )
    finally:
        await publisher.close()
    assert await _bodies(ok) == ["sent"] + [f"later{i}" for i in range(5)]
