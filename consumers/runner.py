"""`pkgq run`: one RouteConsumer per route, in one process, sharing a pool and a connection."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Iterable

import structlog

from consumers.registry import HANDLERS
from consumers.runtime import Services
from consumers.unit_of_work import make_processor
from events.routes import Route
from infra.rabbit.consumer import RouteConsumer
from infra.rabbit.publisher import Publisher
from infra.rabbit.topology import declare_exchanges
from infra.settings import Settings

log = structlog.get_logger(__name__)


async def run_consumers(
    settings: Settings, svc: Services, routes: Iterable[Route], stop: asyncio.Event
) -> int:
    """Consume until `stop` is set (exit code 0) or a consumer's worker dies (exit code 1)."""
    channel = await svc.amqp.channel()
    await declare_exchanges(channel, settings)
    await channel.close()
    dead_letters = await Publisher.open(svc.amqp, settings.dlx)
    consumers = [
        RouteConsumer(
            route,
            settings,
            svc.amqp,
            make_processor(
                svc.pool,
                route.short_name,
                HANDLERS[route.name],
                kill_before_commit=settings.fault_kill_before_commit == route.name,
            ),
            dead_letters,
        )
        for route in routes
    ]
    try:
        for consumer in consumers:
            await consumer.start()
        log.info("ready", routes=[c.route.name for c in consumers])
        waiters = [asyncio.ensure_future(stop.wait())]
        waiters += [asyncio.ensure_future(c.failed.wait()) for c in consumers]
        await asyncio.wait(waiters, return_when=asyncio.FIRST_COMPLETED)
        for waiter in waiters:
            waiter.cancel()
        return 0 if stop.is_set() else 1
    finally:
        await asyncio.gather(*(c.stop() for c in consumers), return_exceptions=True)
        with contextlib.suppress(Exception):  # bounded: the broker may be down
            await asyncio.wait_for(dead_letters.close(), timeout=2)
        log.info("stopped", processed={c.route.short_name: c.processed for c in consumers})
