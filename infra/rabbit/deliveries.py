"""AMQP deliveries as the consumer loop holds them and the processors see them, and whether one
can still be settled."""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Any

import aiormq.abc
from aiormq.exceptions import ChannelInvalidStateError

from events.decoding import RawDelivery
from events.envelope import H_MESSAGE_ID, H_MESSAGE_TYPE, header_text


class AmqpDelivery:
    """One delivery, read once from aiormq's frame (the consumer takes deliveries from aiormq
    directly: aio-pika's own message object and the Task it makes for each delivery cost about
    a tenth of a busy consumer's CPU). It is settled on the channel it came on, so a delivery
    buffered before a reconnection can never be acked by its tag on the channel after it."""

    __slots__ = (
        "body",
        "channel",
        "content_type",
        "delivery_tag",
        "exchange",
        "headers",
        "message_id",
        "raw",
        "routing_key",
        "timestamp",
        "type",
        "user_id",
    )

    def __init__(self, message: aiormq.abc.DeliveredMessage) -> None:
        properties = message.header.properties
        self.channel: aiormq.abc.AbstractChannel = message.channel
        self.body: bytes = message.body
        self.headers: dict[str, Any] = properties.headers or {}
        self.message_id: str | None = properties.message_id
        self.type: str | None = properties.message_type
        self.content_type: str | None = properties.content_type
        self.timestamp: datetime | None = properties.timestamp
        self.routing_key: str | None = message.routing_key
        self.user_id: str | None = properties.user_id
        self.exchange: str | None = message.exchange
        self.delivery_tag: int | None = message.delivery_tag
        self.raw: RawDelivery = raw_delivery(self)
        """The delivery as pkgq reads it, made once as it arrives (a processor may take it
        ahead of its batch: QueueConsumer's `ahead`)."""

    async def ack(self, multiple: bool = False) -> None:
        if self.delivery_tag is None:
            raise ChannelInvalidStateError("a delivery without a tag cannot be acked")
        await self.channel.basic_ack(self.delivery_tag, multiple=multiple)

    async def nack(self, requeue: bool = True) -> None:
        if self.delivery_tag is None:
            raise ChannelInvalidStateError("a delivery without a tag cannot be nacked")
        await self.channel.basic_nack(self.delivery_tag, requeue=requeue)


def raw_delivery(message: AmqpDelivery) -> RawDelivery:
    """The delivery as pkgq reads it. A client that cannot set the message_id or type property
    (amqp-publish) may send it as the x-message-id or x-message-type header; the property wins
    when both are there. Either way the value is only a claim, checked like any other."""
    ts = message.timestamp
    if ts is not None and ts.tzinfo is None:
        ts = ts.replace(tzinfo=UTC)
    headers = dict(message.headers)
    return RawDelivery(
        body=message.body,
        message_id=message.message_id or header_text(headers, H_MESSAGE_ID, 64),
        message_type=message.type or header_text(headers, H_MESSAGE_TYPE, 255),
        content_type=message.content_type,
        timestamp=ts,
        headers=headers,
        routing_key=message.routing_key,
        publisher=message.user_id,
        exchange=message.exchange,
    )


def channel_open(message: AmqpDelivery) -> bool:
    """Whether the delivery's channel is open (else the broker redelivers it: no ack)."""
    try:
        return not message.channel.is_closed
    except ChannelInvalidStateError:
        return False
