"""Messages for tests: a delivery built without AMQP, a package in the catalog, a message
published through the real broker (as pkgq would, or raw, as an outsider could), numbered
messages consumed back."""

from __future__ import annotations

import asyncio
import contextlib
from datetime import timedelta
from typing import Any
from uuid import UUID, uuid4

import aio_pika
import asyncpg
import pika
from aio_pika.abc import AbstractRobustConnection

from consumers import publishing
from events.decoding import RawDelivery
from events.envelope import CONTENT_TYPE, H_SCHEMA_VERSION, H_SEQ, H_USER_ID
from events.models import WireModel
from events.routes import Route
from infra.postgres import catalog
from infra.rabbit.publisher import Publisher, build_message
from infra.settings import Settings
from infra.transient import is_transient


def raw_for(route: Route, body: WireModel, *, seq: int | None = None) -> RawDelivery:
    """A delivery of `body` on `route` as the broker would hand it over (no AMQP involved)."""
    headers: dict[str, object] = {
        H_SCHEMA_VERSION: route.schema_version,
        H_USER_ID: str(body.user_id),
    }
    if seq is not None:
        headers[H_SEQ] = seq
    return RawDelivery(
        body=body.model_dump_json().encode(),
        message_id=str(uuid4()),
        message_type=route.message_type,
        content_type=CONTENT_TYPE,
        timestamp=None,
        headers=headers,
    )


async def add_package(
    pool: asyncpg.Pool,
    traffic: int | None,
    duration: timedelta | None = None,
    name: str = "test",
) -> int:
    async with pool.acquire() as conn:
        return (await catalog.add_package(conn, name, traffic, duration)).id


class Sending:
    """Many messages through the real broker on one connection: the topology declared once and
    one confirming channel (consumers/publishing.Sender), where `send` opens both for every
    message. While the broker restarts, the channel is opened again (the topology declared
    again) and the message re-sent with the same message_id."""

    def __init__(self, settings: Settings, amqp: AbstractRobustConnection) -> None:
        self._settings = settings
        self._amqp = amqp
        self._sender: publishing.Sender | None = None

    async def __aenter__(self) -> Sending:
        return self

    async def __aexit__(self, *_: object) -> None:
        await self.close()

    async def send(self, route: Route, body: WireModel, message_id: UUID | None = None) -> UUID:
        message_id = message_id or uuid4()
        for attempt in range(120):
            try:
                if self._sender is None:
                    self._sender = await publishing.Sender.open(self._settings, self._amqp)
                return await self._sender.send(route, body, message_id=message_id)
            except Exception as exc:
                await self.close()
                # RuntimeError: aio-pika's "Connection was not opened" while it reconnects.
                if attempt == 119 or not (is_transient(exc) or isinstance(exc, RuntimeError)):
                    raise
                await asyncio.sleep(0.5)
        raise AssertionError("unreachable")

    async def close(self) -> None:
        sender, self._sender = self._sender, None
        if sender is not None:
            with contextlib.suppress(Exception):  # a channel the broker already took away
                await sender.close()


async def send(
    settings: Settings,
    amqp: AbstractRobustConnection,
    route: Route,
    body: WireModel,
    message_id: UUID | None = None,
) -> UUID:
    """Publish with a confirm, the topology declared first; while the broker restarts, retry
    with the same message_id."""
    async with Sending(settings, amqp) as sending:
        return await sending.send(route, body, message_id)


async def send_raw(
    settings: Settings,
    amqp: AbstractRobustConnection,
    route: Route,
    body: bytes,
    *,
    message_id: str | None = "fresh",
    message_type: str | None = "route",
    content_type: str | None = CONTENT_TYPE,
    headers: dict[str, Any] | None = None,
) -> str | None:
    """Publish arbitrary bytes and properties, to exercise the bad-input paths."""
    mid = str(uuid4()) if message_id == "fresh" else message_id
    if mid is None:
        await asyncio.to_thread(
            _publish_without_message_id,
            settings,
            route.name,
            body,
            route.message_type if message_type == "route" else message_type,
            content_type,
            headers if headers is not None else {H_SCHEMA_VERSION: route.schema_version},
        )
        return None
    publisher = await Publisher.open(amqp, settings.exchange, user_id=settings.amqp_user)
    try:
        message = build_message(
            body,
            message_id=mid,
            message_type=route.message_type if message_type == "route" else message_type,
            headers=headers if headers is not None else {H_SCHEMA_VERSION: route.schema_version},
            content_type=content_type,
        )
        await publisher.publish(message, route.name)
    finally:
        await publisher.close()
    return mid


def _publish_without_message_id(
    settings: Settings,
    routing_key: str,
    body: bytes,
    message_type: str | None,
    content_type: str | None,
    headers: dict[str, Any],
) -> None:
    """Publish through pika, which (unlike aiormq) does not invent a message_id."""
    connection = pika.BlockingConnection(pika.URLParameters(settings.amqp_url))
    try:
        channel = connection.channel()
        channel.confirm_delivery()
        channel.basic_publish(
            settings.exchange,
            routing_key,
            body,
            properties=pika.BasicProperties(
                content_type=content_type,
                type=message_type,
                headers=headers,
                delivery_mode=2,
                user_id=settings.amqp_user,  # as pkgq's own publishers do: trusted everywhere
            ),
            mandatory=True,
        )
    finally:
        connection.close()


async def publish_as_outsider(
    connection: AbstractRobustConnection,
    settings: Settings,
    route: Route,
    body: WireModel,
    *,
    seq: int | None = None,
    user_id: str | None = None,
    message_id: UUID | None = None,
    marks: dict[str, Any] | None = None,
    expiration: timedelta | None = None,
) -> str:
    """Publish as an outsider would: pkgq's envelope, confirmed, with an optional user_id,
    message_id of its choosing, extra headers (`marks`) and AMQP `expiration` (a TTL the
    broker applies: expired in the queue, it is dead-lettered as `expired`)."""
    message_id_text = str(message_id or uuid4())
    headers: dict[str, Any] = {
        H_SCHEMA_VERSION: route.schema_version,
        H_USER_ID: str(body.user_id),
        **(marks or {}),
    }
    if seq is not None:
        headers[H_SEQ] = seq
    channel = await connection.channel(publisher_confirms=True)
    try:
        exchange = await channel.get_exchange(settings.exchange, ensure=False)
        await exchange.publish(
            aio_pika.Message(
                body.model_dump_json().encode(),
                message_id=message_id_text,
                type=route.message_type,
                content_type=CONTENT_TYPE,
                headers=headers,
                user_id=user_id,
                expiration=expiration,
                delivery_mode=aio_pika.DeliveryMode.PERSISTENT,
            ),
            route.name,
            mandatory=True,
        )
    finally:
        if not channel.is_closed:
            await channel.close()
    return message_id_text


async def consume_numbers(amqp: AbstractRobustConnection, name: str, n: int) -> list[int]:
    """The next n messages' bodies (each an integer), consumed and acked on a channel of their
    own (a quorum queue with single active consumer refuses basic.get)."""
    found: list[int] = []
    channel = await amqp.channel()
    queue = await channel.declare_queue(name, passive=True)
    async with queue.iterator() as messages:
        async for message in messages:
            found.append(int(message.body))
            await message.ack()
            if len(found) == n:
                break
    await channel.close()
    return found
