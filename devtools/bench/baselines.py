"""The consumers `pkgq bench`'s backlog phases hold pkgq against (devtools/bench/backlog.py
drains the same backlog with each of them and with `pkgq run`):

- simple_consumer: aio-pika and asyncpg written the obvious way, one message at a time;
- faststream_broker: a FastStream RabbitMQ subscriber written the way FastStream's documentation
  shows, with its defaults;
- broker_consume_ack: RabbitMQ's own consume-and-ack rate, no database.

The database work of the first two is the same statements, bench_data.apply_usage_simply's (its
SQL lives in infra/postgres like all SQL), in one transaction per message.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable, Coroutine
from typing import Any
from uuid import UUID

import asyncpg
from aio_pika.abc import AbstractRobustConnection
from faststream.rabbit import RabbitBroker, RabbitQueue
from faststream.rabbit.annotations import RabbitMessage
from faststream.security import BaseSecurity
from pydantic import BaseModel

from devtools.bench.support import message
from devtools.postgres import bench_data
from events.models import RecordUsage
from events.routes import USAGE_RECORD
from infra.rabbit.connection import tls_context
from infra.settings import Settings, split_urls


async def simple_consumer(
    amqp: AbstractRobustConnection, queue_name: str, pool: asyncpg.Pool, prefetch: int
) -> None:
    """The baseline, written the obvious way: for each message, in delivery order, one
    transaction (claim it in the inbox, lock the user's row, add the usage to the active item),
    commit, ack."""
    consumer = USAGE_RECORD.short_name
    channel = await amqp.channel()
    try:
        await channel.set_qos(prefetch_count=prefetch)
        queue = await channel.get_queue(queue_name, ensure=False)
        async with queue.iterator() as messages:
            async for delivery in messages:
                usage = RecordUsage.model_validate_json(delivery.body)
                async with pool.acquire() as conn, conn.transaction():
                    await bench_data.apply_usage_simply(
                        conn,
                        consumer,
                        UUID(str(delivery.message_id)),
                        usage.user_id,
                        usage.upload,
                        usage.download,
                    )
                await delivery.ack()
    finally:
        await channel.close()


class Usage(BaseModel):
    """The usage record as a FastStream user declares the body their handler takes (pkgq's own
    RecordUsage is strict, which FastStream's validation of the decoded JSON does not pass)."""

    user_id: UUID
    upload: int
    download: int


Handler = Callable[[Usage, RabbitMessage], Coroutine[Any, Any, None]]


def faststream_broker(
    settings: Settings, queues: list[str], pool: asyncpg.Pool, errors: list[BaseException]
) -> RabbitBroker:
    """A FastStream consumer of `queues`, the way its documentation shows one: a RabbitBroker,
    a `@broker.subscriber(queue)` handler taking the decoded body, one asyncpg transaction per
    message (the simple consumer's statements), acked after the handler returns (FastStream's
    default ack policy). Defaults otherwise, which means: no prefetch limit and a task per
    delivery (aio-pika's consume callback), so up to the pool's size of messages are applied at
    once and a user's records are not applied in order. Two departures: the queues exist
    already (`declare=False`: FastStream's declaration would not match pkgq's arguments), and
    FastStream's access log (two INFO lines per message, to stdout, where the bench prints its
    key=value lines) goes to a logger at WARNING, which spares it that cost as
    PKGQ_LOG_LEVEL=warning spares `pkgq run` in the bench. A handler's exception is appended to
    `errors` (and the message rejected, FastStream's default)."""
    quiet = logging.getLogger("pkgq.bench.faststream")
    quiet.setLevel(logging.WARNING)
    context = tls_context(settings)
    broker = RabbitBroker(
        split_urls(settings.amqp_url)[0],
        logger=quiet,
        security=BaseSecurity(ssl_context=context) if context is not None else None,
    )
    consumer = USAGE_RECORD.short_name

    def handler() -> Handler:
        async def handle(usage: Usage, msg: RabbitMessage) -> None:
            try:
                async with pool.acquire() as conn, conn.transaction():
                    await bench_data.apply_usage_simply(
                        conn,
                        consumer,
                        UUID(msg.message_id),
                        usage.user_id,
                        usage.upload,
                        usage.download,
                    )
            except Exception as error:
                errors.append(error)
                raise

        return handle

    for name in queues:
        broker.subscriber(RabbitQueue(name, declare=False))(handler())
    return broker


async def broker_consume_ack(
    amqp: AbstractRobustConnection, queue_name: str, bodies: list[RecordUsage], prefetch: int
) -> tuple[float, float]:
    """RabbitMQ's own consume-and-ack rate, no database: `bodies` are published (persistent,
    with pkgq's envelope, with confirms; not timed) into a durable classic queue of the bench's
    namespace, then consumed with aio-pika at `prefetch` (pkgq's, so both sides have the same
    window; a queue iterator) and acked. Returns the seconds from the start of the consume
    until the last ack is sent, and the CPU seconds this process spent meanwhile (the
    consuming client's: near the seconds, the client and not the broker sets the pace). Acks
    go with `multiple` every half prefetch and on the last: the faster way for the broker (one
    ack frame per hundreds of deliveries instead of one each; on the 2-core dev box acking one
    by one drained at about half the rate). The queue has none of pkgq's arguments (no
    priorities, no dead-lettering): the broker at its plainest."""
    ack_every = max(1, prefetch // 2)
    count = len(bodies)
    channel = await amqp.channel(publisher_confirms=True)
    consumer_channel = await amqp.channel()
    try:
        queue = await channel.declare_queue(queue_name, durable=True, auto_delete=False)
        await queue.purge()
        window = 1000
        for first in range(0, count, window):
            await asyncio.gather(
                *(
                    channel.default_exchange.publish(
                        message(body.model_dump_json().encode(), USAGE_RECORD, body.user_id),
                        routing_key=queue_name,
                    )
                    for body in bodies[first : first + window]
                )
            )
        await consumer_channel.set_qos(prefetch_count=prefetch)
        consumer_queue = await consumer_channel.get_queue(queue_name, ensure=False)
        received = 0
        started, cpu_started = time.perf_counter(), time.process_time()
        async with consumer_queue.iterator() as deliveries:
            async for delivery in deliveries:
                received += 1
                if received == count:
                    await delivery.ack(multiple=True)
                    break
                if received % ack_every == 0:
                    await delivery.ack(multiple=True)
        seconds = time.perf_counter() - started
        cpu_seconds = time.process_time() - cpu_started
        await queue.delete(if_unused=False, if_empty=False)
    finally:
        await consumer_channel.close()
        await channel.close()
    return seconds, cpu_seconds


def usage_bodies(users: list[UUID], records: int, upload: int, download: int) -> list[RecordUsage]:
    """`records` usage records, record j for user j % len(users) (the backlog's order)."""
    return [
        RecordUsage(user_id=users[j % len(users)], upload=upload, download=download)
        for j in range(records)
    ]
