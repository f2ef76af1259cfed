"""Start-up and shutdown shared by the long-running processes (`pkgq run`, `pkgq relay`)."""

from __future__ import annotations

import asyncio
import os
import signal
import socket
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from dataclasses import dataclass

import asyncpg
import structlog
from aio_pika.abc import AbstractRobustConnection
from tenacity import AsyncRetrying, retry_if_exception, stop_after_delay, wait_exponential

from infra.observability import (
    DEAD_LETTERS,
    OUTBOX_OLDEST,
    OUTBOX_PENDING,
    RECONNECTS,
    Ready,
    StatusServer,
)
from infra.postgres import stats
from infra.postgres.pool import create_pool
from infra.rabbit.connection import connect
from infra.settings import Settings
from infra.transient import is_transient

log = structlog.get_logger(__name__)


@dataclass(slots=True)
class Services:
    pool: asyncpg.Pool
    amqp: AbstractRobustConnection


def _startup_retrying(seconds: float) -> AsyncRetrying:
    return AsyncRetrying(
        retry=retry_if_exception(is_transient),
        stop=stop_after_delay(seconds),
        wait=wait_exponential(multiplier=0.5, max=5),
        reraise=True,
    )


@asynccontextmanager
async def services(
    settings: Settings, role: str, wait_seconds: float = 60
) -> AsyncIterator[Services]:
    """Connect to Postgres and RabbitMQ, waiting up to `wait_seconds` for them to come up."""
    name = f"pkgq-{role}@{socket.gethostname()}:{os.getpid()}"
    async for attempt in _startup_retrying(wait_seconds):
        with attempt:
            pool = await create_pool(
                settings.postgres_dsn,
                min_size=settings.pool_min_size,
                max_size=settings.pool_max_size,
            )
    try:
        async for attempt in _startup_retrying(wait_seconds):
            with attempt:
                amqp = await connect(settings.amqp_url, name)
        amqp.reconnect_callbacks.add(lambda *_: RECONNECTS.inc())
        try:
            log.info(
                "connected",
                role=role,
                postgres=settings.safe_postgres_dsn(),
                amqp=settings.safe_amqp_url(),
            )
            yield Services(pool, amqp)
        finally:
            await amqp.close()
    finally:
        await pool.close()


def stop_on_signals() -> asyncio.Event:
    """An event set by SIGTERM or SIGINT (the start of a graceful drain)."""
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, _request_stop, stop, sig)
    return stop


def _request_stop(stop: asyncio.Event, sig: signal.Signals) -> None:
    log.info("stopping", signal=sig.name)
    stop.set()


async def start_status_server(
    settings: Settings, ready: Ready, pool: asyncpg.Pool
) -> StatusServer | None:
    """The process's /metrics, /healthz and /readyz port, if `PKGQ_HTTP_PORT` is set."""
    if not settings.http_port:
        return None

    async def refresh() -> None:
        async with pool.acquire(timeout=2) as conn:
            figures = await stats.backlog(conn)
        OUTBOX_PENDING.set(figures.outbox_pending)
        OUTBOX_OLDEST.set(figures.outbox_oldest_s)
        DEAD_LETTERS.clear()
        for route, count in figures.buried_by_route.items():
            DEAD_LETTERS.labels(route=route).set(count)

    server = StatusServer(
        settings.http_host,
        settings.http_port,
        ready,
        refresh,
        refresh_every=settings.metrics_refresh_interval,
    )
    await server.start()
    return server
