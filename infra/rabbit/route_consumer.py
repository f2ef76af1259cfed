"""The consumer of one partition of a route, configured from the settings."""

from __future__ import annotations

from aio_pika.abc import AbstractChannel, AbstractQueue, AbstractRobustConnection

from events.routes import Route
from infra.rabbit.consumer import Idle, Processor, QueueConsumer
from infra.rabbit.deliveries import Ahead
from infra.rabbit.publisher import Publisher
from infra.rabbit.topology import declare_exchanges, declare_route_queue, route_queues
from infra.settings import Settings


def route_consumer(
    route: Route,
    settings: Settings,
    connection: AbstractRobustConnection,
    processor: Processor,
    dead_letters: Publisher,
    *,
    idle: Idle | None = None,
    partition: int = 0,
    ahead: Ahead | None = None,
) -> QueueConsumer:
    """The consumer of one partition of a route: `pkgq.<route>` or `pkgq.<route>.p<k>`."""

    async def declare(channel: AbstractChannel) -> AbstractQueue:
        exchange, _ = await declare_exchanges(channel, settings)
        return await declare_route_queue(channel, settings, exchange, route, partition)

    _, key = route_queues(settings, route.name)[partition]
    return QueueConsumer(
        key,
        declare,
        settings,
        connection,
        processor,
        dead_letters,
        idle=idle,
        idle_every=settings.release_poll_interval,
        batch_size=settings.batch_size_for(route.name),
        batch_max=settings.batch_max_for(route.name),
        linger=settings.batch_linger_ms / 1000,
        prefetch=settings.prefetch_for(route.name),
        lanes=settings.concurrency_for(route.name),
        pausable=True,
        ahead=ahead,
    )
