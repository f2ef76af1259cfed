"""A broker dead letter that reaches the ingester more than once is filed once: here the copy a
quorum dead-letter queue gives again after the ingester stored it and died before its ack,
carrying the queue's `x-delivery-count` (the replicated profile's queues, on the dev broker)."""

from __future__ import annotations

import asyncio
from uuid import uuid4

import aio_pika
import asyncpg
from aio_pika.abc import AbstractChannel, AbstractRobustConnection

from consumers import ingest
from domain.delivery import Fate
from events.models import AdjustQuota
from events.routes import QUOTA_ADJUST
from infra.rabbit.deliveries import AmqpDelivery, raw_delivery
from infra.rabbit.topology import declare_all, delete_all, routing_key_for
from infra.settings import Settings


async def _got(channel: AbstractChannel, queue: str) -> AmqpDelivery:
    """The queue's next message (basic.get, to be acked by the caller), waited for."""
    raw = await channel.get_underlay_channel()
    for _ in range(200):
        message = await raw.basic_get(queue, no_ack=False)
        if message.delivery_tag is not None:
            return AmqpDelivery(message)
        await asyncio.sleep(0.05)
    raise AssertionError(f"nothing reached {queue} in 10 s")


async def test_a_dead_letter_redelivered_by_a_quorum_queue_after_the_ingester_died_is_filed_once(
    settings: Settings, pool: asyncpg.Pool, amqp: AbstractRobustConnection
) -> None:
    quorum = settings.with_queue_type("quorum")
    channel = await amqp.channel()
    # The test's classic queues made again as quorum ones (the same names: its clean-up
    # deletes them).
    await delete_all(channel, settings)
    await declare_all(channel, quorum)
    message_id = str(uuid4())
    body = AdjustQuota(user_id=uuid4(), item_id=1, delta=1).model_dump_json().encode()
    exchange = await channel.get_exchange(quorum.exchange)
    # quota_adjust has no consumer here: the broker dead-letters it when it expires.
    await exchange.publish(
        aio_pika.Message(body, message_id=message_id, expiration=0.1),
        routing_key_for(quorum, QUOTA_ADJUST.name, None),
    )
    ingester = ingest.make_ingester(pool)

    taking = await amqp.channel()
    first = await _got(taking, quorum.dead_letter_queue)
    assert [r.fate for r in await ingester([raw_delivery(first)])] == [Fate.DEAD_LETTERED]
    await taking.close()  # died before its ack: the queue gives the message again

    again_channel = await amqp.channel()
    again = await _got(again_channel, quorum.dead_letter_queue)
    assert again.message_id == message_id
    assert again.headers.get("x-delivery-count") == 1  # the copy differs from the first
    assert [r.fate for r in await ingester([raw_delivery(again)])] == [Fate.DEAD_LETTERED]
    await again.ack()
    await again_channel.close()

    async with pool.acquire() as conn:
        rows = await conn.fetch(
            "SELECT reason, repeats FROM telecom.dead_letters WHERE message_id = $1", message_id
        )
    assert [(r["reason"], r["repeats"]) for r in rows] == [("expired", 1)]
