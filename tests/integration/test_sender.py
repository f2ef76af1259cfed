"""consumers/publishing.Sender: many messages on one connection, the topology declared once."""

from __future__ import annotations

from typing import Any
from uuid import UUID, uuid4

import pytest
from aio_pika.abc import AbstractRobustConnection

from consumers import publishing
from events.models import RecordUsage
from events.routes import USAGE_RECORD
from infra.rabbit.topology import declare_all, route_queues
from infra.settings import Settings


async def test_a_sender_declares_the_topology_once_and_its_messages_arrive_in_order(
    settings: Settings, amqp: AbstractRobustConnection, monkeypatch: pytest.MonkeyPatch
) -> None:
    declared = 0

    async def counting(*args: Any) -> None:
        nonlocal declared
        declared += 1
        await declare_all(*args)

    monkeypatch.setattr("consumers.publishing.declare_all", counting)
    user = uuid4()
    sender = await publishing.Sender.open(settings, amqp)
    try:
        sent = [
            await sender.send(USAGE_RECORD, RecordUsage(user_id=user, upload=k, download=0))
            for k in range(20)
        ]
    finally:
        await sender.close()
    assert declared == 1

    ((queue_name, _),) = route_queues(settings, USAGE_RECORD.name)
    channel = await amqp.channel()
    queue = await channel.get_queue(queue_name)
    received: list[UUID] = []
    while (message := await queue.get(no_ack=True, fail=False)) is not None:
        received.append(UUID(message.message_id))
    await channel.close()
    assert received == sent


async def test_publish_declares_the_topology_each_time_so_a_deleted_queue_comes_back(
    settings: Settings, amqp: AbstractRobustConnection
) -> None:
    ((queue_name, _),) = route_queues(settings, USAGE_RECORD.name)
    body = RecordUsage(user_id=uuid4(), upload=1, download=0)
    await publishing.publish(settings, amqp, USAGE_RECORD, body)
    channel = await amqp.channel()
    await channel.queue_delete(queue_name)

    again = await publishing.publish(settings, amqp, USAGE_RECORD, body)

    queue = await channel.get_queue(queue_name)
    message = await queue.get(no_ack=True, fail=False)
    await channel.close()
    assert message is not None
    assert UUID(message.message_id) == again
