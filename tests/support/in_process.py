"""The consumers and the relay as tasks of the test's own event loop."""

from __future__ import annotations

import asyncio
from collections.abc import Callable

import asyncpg
from aio_pika.abc import AbstractRobustConnection

from consumers.delivery import DeliveryPipeline
from consumers.runner import run_consumers
from consumers.worker import Services
from events.routes import ROUTES, Route
from infra.outbox.relay import Relay
from infra.settings import Settings


class InProcess:
    """The consumers and the relay as tasks of the test's own event loop (built by the
    `in_process` fixture, which closes it after the test)."""

    def __init__(self, settings: Settings, pool: asyncpg.Pool, amqp: AbstractRobustConnection):
        self.settings = settings
        self.services = Services(pool, amqp)
        self.stop = asyncio.Event()
        self.tasks: list[asyncio.Task[object]] = []
        self.closed = False

    async def start_consumers(
        self,
        routes: list[Route] | None = None,
        *,
        pipelines: dict[str, DeliveryPipeline] | None = None,
        ingest: bool = False,
    ) -> None:
        selected = routes if routes is not None else list(ROUTES.values())
        self.tasks.append(
            asyncio.create_task(
                run_consumers(
                    self.settings,
                    self.services,
                    selected,
                    self.stop,
                    ingest=ingest,
                    pipelines=pipelines,
                )
            )
        )
        await asyncio.sleep(0.3)  # let them declare and subscribe

    async def start_relay(self) -> Relay:
        relay = Relay(
            self.settings, self.services.pool, self.services.amqp, self.services.worker_id
        )
        self.tasks.append(asyncio.create_task(relay.run(self.stop)))
        return relay

    async def close(self) -> None:
        """Stop the consumers and the relay; raise what one of them died of. Once: the
        `in_process` fixture closes what a test left running, and closing again does nothing."""
        if self.closed:
            return
        self.closed = True
        self.stop.set()
        results = await asyncio.gather(*self.tasks, return_exceptions=True)
        for result in results:
            if isinstance(result, BaseException):
                raise result


StartApp = Callable[[Settings, asyncpg.Pool, AbstractRobustConnection], InProcess]
"""The `in_process` fixture (tests/conftest.py): an InProcess app on the given settings, pool
and connection, closed after the test if the test has not closed it."""
