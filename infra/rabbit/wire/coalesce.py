"""Publishes begun in one turn of the event loop, handed to aiormq's writer as one frame.

The relay publishes every user's chain at once, so a round begins a dozen or more publishes
together. aiormq's `basic_publish` takes each on its own: the channel's lock (the publishes
queue for it, one task turn each), the frames marshalled, a put on the connection's write
queue. The writer then merges what is queued when it runs (infra/rabbit/wire/frames.py,
CoalescingFrameGenerator), but publishes that trickle in through the lock often reach it one
by one. `Coalescer` gathers the publishes begun before its flush runs (the next turn of the
loop), and under one hold of the channel's lock gives them their delivery tags in the order
they were begun, marshals them into one buffer and queues that as one frame. Nothing else
changes on the wire: the same frames, in the same order, with the same tags; each publish
still waits for its own confirm, and a return or a nack fails only its own message (aiormq's
reader settles each tag as before).

It uses what aiormq's own `basic_publish` uses of the channel (its lock, delivery tag,
confirmation and message-id maps, write queue, frame size): only with the aiormq versions
infra/rabbit/wire/frames.py was checked against (`usable`); with another, publishes go through
`basic_publish` one by one (infra/rabbit/publisher.py).
"""

from __future__ import annotations

import asyncio
from dataclasses import dataclass
from functools import cache, partial
from importlib.metadata import version
from typing import Any
from uuid import uuid4

import aiormq
from aiormq.abc import ChannelFrame
from aiormq.exceptions import ChannelInvalidStateError
from pamqp import frame
from pamqp.body import ContentBody
from pamqp.commands import Basic
from pamqp.header import ContentHeader

from infra.rabbit.wire.frames import TESTED_AIORMQ


@cache
def usable() -> bool:
    """Whether the installed aiormq is one whose channel internals were checked (read once,
    at the first publish, not at import)."""
    return version("aiormq") in TESTED_AIORMQ


@dataclass(slots=True)
class _Begun:
    body: bytes
    exchange: str
    routing_key: str
    properties: Basic.Properties
    message_id: str
    confirmation: asyncio.Future[Any]


class Coalescer:
    """The publishes of one aiormq channel (with publisher confirms) that began in the same
    turn of the loop, written together."""

    def __init__(self, channel: aiormq.Channel) -> None:
        self.channel = channel
        self._begun: list[_Begun] = []
        self._flush: asyncio.Task[None] | None = None
        self.writes = 0
        """Frames handed to aiormq's writer so far (each holding one or more publishes)."""

    def publish(
        self, body: bytes, exchange: str, routing_key: str, properties: Basic.Properties
    ) -> asyncio.Future[Any]:
        """Begin a mandatory publish; the future is settled by the broker's answer for it
        (Basic.Ack, else aiormq's DeliveryError or PublishError), or by the channel's closing.
        Cancelling it before the flush means it is never sent. A return is matched to its
        publish by `properties.message_id`: one is made if it is not set, as aiormq does."""
        if len(routing_key) > 255:
            raise ValueError("Routing key too long (max 255 bytes)")
        if not properties.message_id:
            properties.message_id = uuid4().hex  # as aiormq does: a return is matched by it
        confirmation = self.channel.create_future()
        self._begun.append(
            _Begun(body, exchange, routing_key, properties, properties.message_id, confirmation)
        )
        if self._flush is None:
            self._flush = asyncio.get_running_loop().create_task(self._send())
        return confirmation

    async def _send(self) -> None:
        channel = self.channel
        begun: list[_Begun] = []
        try:
            async with channel.lock:
                # Taken with the flush cleared in one step: a publish begun from now on
                # schedules the next flush, which waits for this one's lock.
                begun, self._begun, self._flush = self._begun, [], None
                await self._write([b for b in begun if not b.confirmation.done()])
        except BaseException as exc:
            if not begun:  # cancelled waiting for the lock: fail what waits for this flush
                begun, self._begun, self._flush = self._begun, [], None
            for item in begun:
                if not item.confirmation.done():
                    item.confirmation.set_exception(_as_exception(exc))
            if not isinstance(exc, Exception):
                raise  # a cancellation stays one; an error is each publish's (not the task's)

    async def _write(self, live: list[_Begun]) -> None:
        """Tags, maps and one frame for aiormq's writer, under the channel's lock."""
        if not live:
            return
        channel = self.channel
        first = channel.delivery_tag + 1
        sent = False
        try:
            payload = b"".join(
                publish_frames(
                    channel.number,
                    channel.max_content_size,
                    b.exchange,
                    b.routing_key,
                    b.body,
                    b.properties,
                )
                for b in live
            )
            for tag, item in enumerate(live, start=first):
                channel.confirmations[tag] = item.confirmation
                channel.message_id_delivery_tag[item.message_id] = tag
                item.confirmation.add_done_callback(
                    partial(_forget, channel.message_id_delivery_tag, item.message_id, tag)
                )
            channel.delivery_tag = first + len(live) - 1
            await channel.write_queue.put(ChannelFrame(payload=payload, should_close=False))
            sent = True
            self.writes += 1
        finally:
            if not sent:
                # The broker has seen none of them: the tags are given back, as aiormq does.
                channel.delivery_tag = first - 1
                for tag in range(first, first + len(live)):
                    channel.confirmations.pop(tag, None)


def publish_frames(
    number: int,
    max_content_size: int,
    exchange: str,
    routing_key: str,
    body: bytes,
    properties: Basic.Properties,
) -> bytes:
    """A mandatory publish's frames on channel `number`, as aiormq's `basic_publish` marshals
    them: the method, the content header, the body split at `max_content_size`."""
    parts = [
        frame.marshal(
            Basic.Publish(exchange=exchange, routing_key=routing_key, mandatory=True), number
        ),
        frame.marshal(ContentHeader(0, len(body), properties), number),
    ]
    parts += [
        frame.marshal(ContentBody(body[start : start + max_content_size]), number)
        for start in range(0, len(body), max_content_size)
    ]
    return b"".join(parts)


def _as_exception(exc: BaseException) -> BaseException:
    """What a publish that was never sent fails with."""
    if isinstance(exc, Exception):
        return exc
    return ChannelInvalidStateError(f"publish not sent: {exc!r}")


def _forget(tags: dict[str, int], message_id: str, tag: int, _: object) -> None:
    if tags.get(message_id) == tag:
        tags.pop(message_id)
