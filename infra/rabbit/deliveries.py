"""AMQP deliveries as the processors see them, and whether one can still be settled."""

from __future__ import annotations

from datetime import UTC

from aio_pika.abc import AbstractIncomingMessage
from aiormq.exceptions import ChannelInvalidStateError

from events.decoding import RawDelivery


def raw_delivery(message: AbstractIncomingMessage) -> RawDelivery:
    ts = message.timestamp
    if ts is not None and ts.tzinfo is None:
        ts = ts.replace(tzinfo=UTC)
    return RawDelivery(
        body=message.body,
        message_id=message.message_id,
        message_type=message.type,
        content_type=message.content_type,
        timestamp=ts,
        headers=dict(message.headers or {}),
        routing_key=message.routing_key,
        publisher=message.user_id,
        exchange=message.exchange,
    )


def channel_open(message: AbstractIncomingMessage) -> bool:
    """Whether the delivery's channel is open (else the broker redelivers it: no ack)."""
    try:
        return not message.channel.is_closed
    except ChannelInvalidStateError:  # aio-pika raises once the channel is closed
        return False
