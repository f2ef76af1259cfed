"""Moving a broker's queues to another type (classic to quorum) by drain-and-recreate.

RabbitMQ cannot change a queue's type or arguments in place. For each queue, `convert`:
1. declares a holding queue `<queue>.converting` of the new type, bound like the queue, and
   unbinds the queue: from then on new messages wait in the holding queue, and the queue only
   drains (the route's consumers, still running with the old settings, apply what is left);
2. waits until the queue is drained and has no consumer (the operator stops the route's
   consumers once it is empty; a consumer that stops with messages in hand gives them back,
   and they are drained again when it starts);
3. deletes the queue once it is unbound, empty and without a consumer (seen twice; nothing can
   come into it then) and declares it anew with the new arguments;
4. moves the holding queue's messages into it, as they are, by the broker's own dead-lettering
   (the holding queue dead-letters into the default exchange with the queue's name as key, and
   every message is rejected once), while the holding queue is still bound; then binds the new
   queue, unbinds the holding queue, moves what came in meanwhile, and deletes the holding
   queue once it is empty.

Nothing is lost at any point: every message is in the old queue, the holding queue or the new
one. Order: a message published while the holding queue is being emptied, in the milliseconds
between the new queue's binding and the holding queue's unbinding, may land in the new queue
ahead of an older one; with the route's publishers paused (`pkgq partitions pause` holds pkgq's
own relay back) the order is exact. A message that was in both queues at a switch arrives
twice, and the consumers' inbox drops the second copy.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import structlog
from aio_pika.abc import AbstractRobustConnection
from aiormq.exceptions import ChannelNotFoundEntity, ChannelPreconditionFailed

from events.routes import ALL_ROUTES
from infra.rabbit.topology import (
    dead_letter_queue_arguments,
    queue_arguments,
    route_queues,
    unroutable_keys,
)
from infra.settings import Settings

log = structlog.get_logger(__name__)

HOLDING_SUFFIX = ".converting"


@dataclass(frozen=True, slots=True)
class QueueSpec:
    """A queue as pkgq declares it: its arguments and what it is bound to."""

    name: str
    arguments: dict[str, Any]
    bindings: tuple[tuple[str, str], ...]
    """(exchange, routing key) pairs."""

    @property
    def holding(self) -> str:
        return self.name + HOLDING_SUFFIX


def queue_specs(settings: Settings) -> list[QueueSpec]:
    """Every queue pkgq declares with these settings, the dead-letter queue first."""
    specs = [
        QueueSpec(
            settings.dead_letter_queue,
            dead_letter_queue_arguments(settings),
            (
                (settings.dlx, "#"),
                *((settings.unroutable_exchange, key) for key in unroutable_keys()),
            ),
        )
    ]
    for route in ALL_ROUTES.values():
        for name, key in route_queues(settings, route.name):
            specs.append(
                QueueSpec(name, queue_arguments(settings, route.name), ((settings.exchange, key),))
            )
    return specs


@dataclass
class Progress:
    """What `convert` reports as it goes (the CLI shows it)."""

    queue: str
    step: str
    ready: int | None = None
    consumers: int | None = None
    moved: int = 0


Report = Callable[[Progress], None]


class Converter:
    def __init__(
        self, connection: AbstractRobustConnection, report: Report, poll: float = 0.5
    ) -> None:
        self._connection = connection
        self._report = report
        self._poll = poll

    async def needs_converting(self, spec: QueueSpec) -> bool:
        """Whether the queue exists with other arguments, or an interrupted conversion left
        its holding queue (a missing queue is simply declared)."""
        if await self._exists(spec.holding):
            return True
        channel = await self._connection.channel()
        try:
            await channel.declare_queue(spec.name, durable=True, arguments=spec.arguments)
        except ChannelPreconditionFailed:
            return True
        finally:
            if not channel.is_closed:
                await channel.close()
        await self._bind(spec.name, spec.bindings)
        return False

    async def hold(self, spec: QueueSpec) -> None:
        """Step 1: new messages go to the holding queue; the queue only drains."""
        await self._declare_holding(spec)
        await self._bind(spec.holding, spec.bindings)
        await self._unbind(spec.name, spec.bindings)
        self._report(Progress(spec.name, "holding"))

    async def replace(self, spec: QueueSpec) -> int:
        """Steps 2 to 4 for a queue that `hold` has unbound. Returns how many messages moved."""
        await self._delete_when_drained(spec)
        channel = await self._connection.channel()
        try:
            await channel.declare_queue(spec.name, durable=True, arguments=spec.arguments)
        finally:
            await channel.close()
        self._report(Progress(spec.name, "declared"))
        moved = await self._move(spec)
        await self._bind(spec.name, spec.bindings)
        await self._unbind(spec.holding, spec.bindings)
        moved += await self._move(spec)
        await self._delete_holding(spec)
        self._report(Progress(spec.name, "converted", moved=moved))
        return moved

    async def _delete_when_drained(self, spec: QueueSpec) -> None:
        while True:
            ready, consumers = await self._figures(spec.name)
            self._report(Progress(spec.name, "draining", ready, consumers))
            if ready == 0 and consumers == 0 and await self._delete_if_idle(spec.name):
                return
            await asyncio.sleep(self._poll)

    async def _move(self, spec: QueueSpec) -> int:
        """Reject every message of the holding queue once: the broker dead-letters each, as it
        is (properties, headers and AMQP user_id kept), into the new queue."""
        channel = await self._connection.channel()
        moved = 0
        try:
            holding = await channel.declare_queue(spec.holding, passive=True)
            while (message := await holding.get(no_ack=False, fail=False)) is not None:
                await message.reject(requeue=False)
                moved += 1
            # At-least-once dead-lettering keeps a message in the holding queue until the new
            # queue has confirmed it: wait for that before anything deletes the holding queue.
            for _ in range(200):
                if not (await self._figures(spec.holding))[0]:
                    break
                await asyncio.sleep(0.05)
        finally:
            if not channel.is_closed:
                await channel.close()
        if moved:
            self._report(Progress(spec.name, "moving", moved=moved))
        return moved

    async def _delete_holding(self, spec: QueueSpec) -> None:
        while not await self._delete_if_idle(spec.holding):
            await self._move(spec)  # one came in before the unbinding took effect

    async def _delete_if_idle(self, name: str) -> bool:
        """Delete an unbound queue that has no message and no consumer, seen twice a moment
        apart; False if it has either. Quorum queues refuse the `if-empty` flag (RabbitMQ 3.x
        closes the connection), so this is the check: unbound, nothing can come in but a
        consumer, and a consumer finds nothing to take."""
        for _ in range(2):
            if await self._figures(name) != (0, 0):
                return False
            await asyncio.sleep(0.2)
        channel = await self._connection.channel()
        try:
            await channel.queue_delete(name)
        finally:
            await channel.close()
        return True

    async def _declare_holding(self, spec: QueueSpec) -> None:
        arguments = {
            "x-queue-type": spec.arguments.get("x-queue-type", "classic"),
            "x-dead-letter-exchange": "",
            "x-dead-letter-routing-key": spec.name,
        }
        if arguments["x-queue-type"] == "quorum":
            arguments |= {"x-dead-letter-strategy": "at-least-once", "x-overflow": "reject-publish"}
        channel = await self._connection.channel()
        try:
            await channel.declare_queue(spec.holding, durable=True, arguments=arguments)
        finally:
            await channel.close()

    async def _exists(self, name: str) -> bool:
        channel = await self._connection.channel()
        try:
            await channel.declare_queue(name, passive=True)
        except ChannelNotFoundEntity:
            return False
        finally:
            if not channel.is_closed:
                await channel.close()
        return True

    async def _figures(self, name: str) -> tuple[int, int]:
        channel = await self._connection.channel()
        try:
            result = (await channel.declare_queue(name, passive=True)).declaration_result
            return result.message_count or 0, result.consumer_count or 0
        finally:
            await channel.close()

    async def _bind(self, queue: str, bindings: tuple[tuple[str, str], ...]) -> None:
        channel = await self._connection.channel()
        try:
            declared = await channel.declare_queue(queue, passive=True)
            for exchange, key in bindings:
                await declared.bind(exchange, routing_key=key)
        finally:
            await channel.close()

    async def _unbind(self, queue: str, bindings: tuple[tuple[str, str], ...]) -> None:
        channel = await self._connection.channel()
        try:
            declared = await channel.declare_queue(queue, passive=True)
            for exchange, key in bindings:
                await declared.unbind(exchange, routing_key=key)
        except ChannelNotFoundEntity:
            pass
        finally:
            if not channel.is_closed:
                await channel.close()


async def convert(
    connection: AbstractRobustConnection, settings: Settings, report: Report
) -> dict[str, int]:
    """Bring every queue to the arguments these settings declare (PKGQ_QUEUE_TYPE, the route
    file): the ones that differ are held, drained and recreated, all held first so that they
    drain together. Returns, per converted queue, how many held messages moved into it."""
    converter = Converter(connection, report)
    changing = [spec for spec in queue_specs(settings) if await converter.needs_converting(spec)]
    for spec in changing:
        await converter.hold(spec)
    return {spec.name: await converter.replace(spec) for spec in changing}
