"""Publishing with publisher confirms and `mandatory`: a publish returns only once the broker
has taken responsibility for the message, and raises if it could not route it."""

from __future__ import annotations

import asyncio
import contextlib
from datetime import UTC, datetime, timedelta
from typing import Any, cast
from uuid import UUID

import aio_pika
import aiormq
from aio_pika.abc import AbstractChannel, AbstractExchange, AbstractRobustConnection
from aiormq.exceptions import ChannelInvalidStateError, DeliveryError, PublishError
from pamqp.commands import Basic

from events.envelope import CONTENT_TYPE
from infra.rabbit import wire


class PublishFailedError(Exception):
    """The broker did not confirm the message (nacked, returned as unroutable, or lost)."""

    def __init__(
        self, message_id: UUID | str, routing_key: str, why: str, *, returned: bool = False
    ) -> None:
        super().__init__(f"message {message_id} to {routing_key!r} was not published: {why}")
        self.message_id = message_id
        self.routing_key = routing_key
        self.returned = returned
        """Returned as unroutable: a fact about this message's route, not about the channel."""


def build_message(
    body: bytes,
    *,
    message_id: UUID | str,
    message_type: str | None,
    headers: dict[str, Any],
    content_type: str | None = CONTENT_TYPE,
    timestamp: datetime | None = None,
    priority: int | None = None,
    expiration_ms: int | None = None,
) -> aio_pika.Message:
    """A persistent message. `expiration_ms`: the broker drops it (dead-lettering it with reason
    `expired`) if it is not delivered within that many milliseconds."""
    return aio_pika.Message(
        body,
        message_id=str(message_id),
        type=message_type,
        content_type=content_type,
        timestamp=timestamp or datetime.now(UTC),
        headers=headers,
        priority=priority,
        expiration=timedelta(milliseconds=max(1, expiration_ms)) if expiration_ms else None,
        delivery_mode=aio_pika.DeliveryMode.PERSISTENT,
    )


def build_properties(
    *,
    message_id: UUID | str,
    message_type: str | None,
    headers: dict[str, Any],
    content_type: str | None = CONTENT_TYPE,
    timestamp: datetime | None = None,
    priority: int | None = None,
    expiration_ms: int | None = None,
) -> Basic.Properties:
    """The properties of the message `build_message` makes, built straight as the frame's
    (for `Publisher.publish_properties`): the relay's, since making an aio-pika Message and
    then its properties cost about nine times as much per message (71 against 8 µs measured
    on a loaded machine). The same bytes on the wire (tests/unit/test_publish_properties.py),
    but for the expiration: here the exact milliseconds, where aio-pika's arithmetic on a
    timedelta can drop one (1,001 ms went out as "1000")."""
    return Basic.Properties(
        content_type=content_type,
        delivery_mode=int(aio_pika.DeliveryMode.PERSISTENT),
        expiration=str(max(1, expiration_ms)) if expiration_ms else None,
        headers=headers or {},
        message_id=str(message_id),
        message_type=message_type,
        priority=priority or 0,  # what aio-pika sends for none
        timestamp=timestamp or datetime.now(UTC),
    )


class Publisher:
    """A confirming, mandatory publisher on one exchange.

    `user_id`: the AMQP user_id property of every message it publishes, which must be the
    connection's own user (the broker refuses any other and closes the channel). pkgq's
    lifecycle consumers take only messages with pkgq's user_id (see consumers/delivery/
    decode.py), so pkgq's own publishers (the relay, the last-resort copy, `pkgq publish`)
    pass Settings.amqp_user."""

    def __init__(
        self,
        channel: AbstractChannel,
        exchange: AbstractExchange,
        user_id: str | None = None,
        confirm_timeout: float = 30.0,
    ) -> None:
        self._channel = channel
        self._exchange = exchange
        self._user_id = user_id
        self._confirm_timeout = confirm_timeout
        self._publishing = wire.Publishing()

    @property
    def user_id(self) -> str | None:
        """The AMQP user_id it stamps on what it publishes (pkgq's own user)."""
        return self._user_id

    @classmethod
    async def open(
        cls,
        connection: AbstractRobustConnection,
        exchange_name: str,
        user_id: str | None = None,
        confirm_timeout: float = 30.0,
    ) -> Publisher:
        """`confirm_timeout`: seconds a publish waits for its confirm before it fails with
        TimeoutError (the channel should then be replaced: see the relay)."""
        channel = await connection.channel(publisher_confirms=True, on_return_raises=True)
        try:
            exchange = await channel.get_exchange(exchange_name, ensure=True)
        except BaseException:
            # Not to be restored by the robust connection as a channel nobody uses.
            with contextlib.suppress(Exception):
                await asyncio.wait_for(channel.close(), timeout=2)
            raise
        return cls(channel, exchange, user_id, confirm_timeout)

    async def publish(self, message: aio_pika.Message, routing_key: str) -> None:
        """Return once the broker has confirmed the message; raise PublishFailedError if it
        nacked or returned it. Publishes may run concurrently: each waits for its own confirm."""
        await self.publish_properties(message.body, message.properties, routing_key)

    async def publish_properties(
        self, body: bytes, properties: Basic.Properties, routing_key: str
    ) -> None:
        """`publish`, for a body and its properties (build_properties) rather than a Message.
        Sets the properties' user_id to this publisher's login, if it has one."""
        if self._channel.is_closed:
            raise ChannelInvalidStateError(f"{self._channel!r} is closed")
        channel = cast(aiormq.Channel, await self._channel.get_underlay_channel())
        if self._user_id is not None:
            properties.user_id = self._user_id
        try:
            confirmation = await self._publishing.publish(
                channel, body, self._exchange.name, routing_key, properties, self._confirm_timeout
            )
        except DeliveryError as exc:
            raise PublishFailedError(
                properties.message_id or "?",
                routing_key,
                repr(exc),
                returned=isinstance(exc, PublishError),  # a Basic.Return; else a Basic.Nack
            ) from exc
        if not isinstance(confirmation, Basic.Ack):
            raise PublishFailedError(
                properties.message_id or "?", routing_key, f"broker answered {confirmation!r}"
            )

    @property
    def is_open(self) -> bool:
        return not self._channel.is_closed

    async def close(self) -> None:
        await self._channel.close()
