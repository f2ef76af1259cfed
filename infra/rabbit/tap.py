"""A tap on the exchange: an exclusive queue bound to every routing key, for watching traffic.

Used by `pkgq tail` (a live view for operators), by `pkgq demo` to show transitions as they
happen, and by the tests to assert on exactly what went over the wire. It never consumes from
pkgq's own queues.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any
from uuid import uuid4

from aio_pika.abc import (
    AbstractChannel,
    AbstractIncomingMessage,
    AbstractQueue,
    AbstractRobustConnection,
)

from events import bounded_json
from events.envelope import H_SEQ


@dataclass(frozen=True, slots=True)
class Tapped:
    exchange: str
    routing_key: str
    message_id: str | None
    message_type: str | None
    headers: dict[str, Any]
    body: bytes
    publisher: str | None = None
    """The AMQP user_id property (validated by the broker): who published it."""

    def json(self) -> Any:
        """The body's JSON value; ValueError when it is not JSON or nests too deep."""
        return bounded_json.loads(self.body)

    @property
    def seq(self) -> int | None:
        value = self.headers.get(H_SEQ)
        return None if value is None else int(value)


class Tap:
    def __init__(
        self, on_message: Callable[[Tapped], None] | None = None, *, keep: bool = True
    ) -> None:
        """`keep=False`: hand each message to `on_message` only, keeping none in `seen` (a
        long-running view must not grow without bound)."""
        self.seen: list[Tapped] = []
        self._keep = keep
        self._on_message = on_message
        self._changed = asyncio.Condition()
        self._channel: AbstractChannel | None = None
        self._queues: list[AbstractQueue] = []

    async def attach(
        self, connection: AbstractRobustConnection, *exchanges: str, prefix: str | None = None
    ) -> None:
        """Bind a queue of its own (exclusive, deleted with its connection) to each exchange.
        `prefix`: name them `<prefix>.<random>` (permissions can then allow them), instead of
        the broker's `amq.gen-…`."""
        self._channel = await connection.channel()
        for exchange in exchanges:
            name = "" if prefix is None else f"{prefix}.{uuid4().hex}"
            queue = await self._channel.declare_queue(name, exclusive=True, auto_delete=True)
            await queue.bind(exchange, routing_key="#")
            await queue.consume(self._received, no_ack=True)
            self._queues.append(queue)

    async def _received(self, message: AbstractIncomingMessage) -> None:
        tapped = Tapped(
            exchange=message.exchange or "",
            routing_key=message.routing_key or "",
            message_id=message.message_id,
            message_type=message.type,
            headers=dict(message.headers or {}),
            body=message.body,
            publisher=message.user_id,
        )
        if self._keep:
            self.seen.append(tapped)
        if self._on_message is not None:
            self._on_message(tapped)
        async with self._changed:
            self._changed.notify_all()

    async def wait_for(self, predicate: Callable[[list[Tapped]], bool], within: float) -> None:
        """Wait until `predicate(self.seen)` holds; raise TimeoutError after `within` seconds."""
        async with asyncio.timeout(within), self._changed:
            await self._changed.wait_for(lambda: predicate(self.seen))

    def on(self, routing_key: str) -> list[Tapped]:
        return [t for t in self.seen if t.routing_key == routing_key]

    async def close(self) -> None:
        if self._channel is not None:
            await self._channel.close()
