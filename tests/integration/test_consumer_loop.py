"""The consumer loop survives its connection being closed under it, with deliveries buffered."""

from __future__ import annotations

import asyncio
import subprocess
from uuid import UUID, uuid4

from aio_pika.abc import AbstractRobustConnection

from events.decoding import Decoded
from events.models import RecordUsage
from events.routes import USAGE_RECORD
from infra.rabbit.connection import connect
from infra.rabbit.consumer import Outcome, RouteConsumer
from infra.rabbit.publisher import Publisher
from infra.settings import Settings
from tests.support import eventually, send


def close_connection_named(name: str) -> None:
    """Have the broker close the client connection called `name` (as an operator or a
    network partition would)."""
    listing = subprocess.run(
        ["rabbitmqctl", "-q", "list_connections", "pid", "client_properties"],
        capture_output=True,
        text=True,
        check=True,
        timeout=30,
    ).stdout
    pids = [line.split()[0] for line in listing.splitlines() if f'"{name}"' in line]
    assert len(pids) == 1, listing
    subprocess.run(
        ["rabbitmqctl", "-q", "close_connection", pids[0], "closed by test"],
        check=True,
        capture_output=True,
        timeout=30,
    )


async def test_buffered_deliveries_of_a_closed_connection_are_redelivered_and_all_processed(
    settings: Settings, amqp: AbstractRobustConnection
) -> None:
    name = f"pkgq-test-consumer-{uuid4().hex[:8]}"
    connection = await connect(settings.amqp_url, name)
    seen: list[UUID] = []

    async def slow_processor(decoded: Decoded) -> Outcome:
        await asyncio.sleep(0.02)
        seen.append(decoded.envelope.message_id)
        return Outcome.ACKED

    tuned = settings.model_copy(update={"prefetch": 10})  # deliveries wait in the buffer
    dead_letters = await Publisher.open(connection, settings.dlx)
    consumer = RouteConsumer(USAGE_RECORD, tuned, connection, slow_processor, dead_letters)
    await consumer.start()
    sent = []
    for _ in range(40):
        body = RecordUsage(user_id=uuid4(), upload=1, download=1)
        sent.append(await send(settings, amqp, USAGE_RECORD, body))

    async def some_processed() -> bool:
        return len(seen) >= 5

    await eventually(some_processed)
    await asyncio.to_thread(close_connection_named, name)

    async def all_processed() -> bool:
        return set(sent) <= set(seen)

    await eventually(all_processed, within=30)
    assert not consumer.failed.is_set()
    await consumer.stop()
    await connection.close()
