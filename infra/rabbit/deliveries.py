"""AMQP deliveries as the processors see them, and whether one can still be settled."""

from __future__ import annotations

from datetime import UTC

from aio_pika.abc import AbstractIncomingMessage
from aiormq.exceptions import ChannelInvalidStateError

from events.decoding import RawDelivery
from events.envelope import H_MESSAGE_ID, H_MESSAGE_TYPE, header_text


def raw_delivery(message: AbstractIncomingMessage) -> RawDelivery:
    """The delivery as pkgq reads it. A client that cannot set the message_id or type property
    (amqp-publish) may send it as the x-message-id or x-message-type header; the property wins
    when both are there. Either way the value is only a claim, checked like any other."""
    ts = message.timestamp
    if ts is not None and ts.tzinfo is None:
        ts = ts.replace(tzinfo=UTC)
    headers = dict(message.headers or {})
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


def channel_open(message: AbstractIncomingMessage) -> bool:
    """Whether the delivery's channel is open (else the broker redelivers it: no ack)."""
    try:
        return not message.channel.is_closed
    except ChannelInvalidStateError:  # aio-pika raises once the channel is closed
        return False
