"""Receiving: a delivery handed over by aiormq, as the consumer loop holds it and the processors
see it, and whether it can still be settled.

`Handover` is the consumer callback of every subscription (infra/rabbit/subscription.py): it
turns aiormq's DeliveredMessage into an `AmqpDelivery` (its `raw`: the RawDelivery the
processors read), puts it into the consumer's buffer and tells the processor, which takes it
ahead of its batch (consumers/delivery/decode.py). The consumer loop takes it from the buffer
next (infra/rabbit/consumer.py). `InHand` counts the batches taken from the buffer and not yet
settled, which a pause waits for.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from datetime import UTC, datetime
from types import TracebackType
from typing import Any

import aiormq.abc
import structlog
from aiormq.exceptions import ChannelInvalidStateError

from events.decoding import RawDelivery
from events.envelope import H_MESSAGE_ID, H_MESSAGE_TYPE, header_text

log = structlog.get_logger(__name__)

Ahead = Callable[[RawDelivery], None]
"""Told of each delivery as it arrives, in the channel's reader task (QueueConsumer's `ahead`)."""


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


class Handover:
    """The consumer callback: each delivery into the buffer, and told to `ahead`, without
    awaiting (the processor decodes it ahead of its batch, without any I/O). With the wire
    accelerator (infra/rabbit/wire/) it is called in the channel's reader task, in delivery
    order, without a Task of its own (`called_inline`); without it, from aiormq's Task.

    If a handover fails, nothing after it is handed over, and the channel is closed: the broker
    then gives that delivery and every later one back, in order. (Handing over the later ones
    would let an ack with `multiple` take the failed one along unprocessed.)"""

    __slots__ = ("_ahead", "_buffer", "_failed")
    called_inline = True

    def __init__(self, buffer: asyncio.Queue[AmqpDelivery], ahead: Ahead | None) -> None:
        self._buffer = buffer
        self._ahead = ahead
        self._failed = False

    def __call__(self, message: aiormq.abc.DeliveredMessage) -> None:
        if self._failed:
            return  # left unacknowledged: given back when the channel closes
        try:
            delivery = AmqpDelivery(message)
            self._buffer.put_nowait(delivery)
            if self._ahead is not None:
                self._ahead(delivery.raw)
        except Exception as exc:
            self._failed = True
            log.exception("inline_consumer_failed", delivery_tag=message.delivery_tag)
            _close_soon(message.channel, exc)


def _handover_failed(exc: Exception) -> ChannelInvalidStateError:
    """What the channel is closed with (and its waiting futures fail with): a channel error,
    not the consumer's own exception, which callers could take for their own failure."""
    error = ChannelInvalidStateError(f"a delivery could not be handed over: {exc!r}")
    error.__cause__ = exc
    return error


_closing: set[asyncio.Task[object]] = set()
"""Channel closes under way (a reference, so that they are not collected half done)."""


def _close_soon(channel: aiormq.abc.AbstractChannel, exc: Exception) -> None:
    """Close a channel from its own reader task's callback (the close waits for that reader)."""
    task: asyncio.Task[object] = asyncio.get_running_loop().create_task(
        channel.close(_handover_failed(exc))
    )
    _closing.add(task)
    task.add_done_callback(_closing.discard)


class InHand:
    """A count of batches in hand (being processed or settled), taken with `with in_hand:`
    around one batch, which a pause waits for. The count is the one fact; the event that
    `emptied` waits on is set from it, here and nowhere else."""

    def __init__(self) -> None:
        self._count = 0
        self._none = asyncio.Event()
        self._none.set()

    def __enter__(self) -> None:
        self._count += 1
        self._none.clear()

    def __exit__(
        self,
        kind: type[BaseException] | None,
        error: BaseException | None,
        traceback: TracebackType | None,
    ) -> None:
        self._count -= 1
        if self._count == 0:
            self._none.set()

    async def emptied(self) -> None:
        """Return once no batch is in hand (at once if none is)."""
        await self._none.wait()
