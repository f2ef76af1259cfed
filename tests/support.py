"""Helpers for integration and end-to-end tests: plain functions and classes (the fixtures that
build and tear down what they need are in tests/conftest.py)."""

from __future__ import annotations

import asyncio
import os
import signal
import socket
import subprocess
import sys
import tempfile
from collections.abc import Awaitable, Callable
from datetime import timedelta
from typing import Any
from uuid import UUID, uuid4

import asyncpg
import pika
from aio_pika.abc import AbstractRobustConnection

from consumers import publishing
from consumers.delivery import DeliveryPipeline
from consumers.runner import run_consumers
from consumers.runtime import Services
from events.decoding import RawDelivery
from events.envelope import CONTENT_TYPE, H_SCHEMA_VERSION, H_SEQ, H_USER_ID
from events.models import WireModel
from events.routes import ROUTES, Route
from infra.outbox.relay import Relay
from infra.postgres import catalog
from infra.rabbit.publisher import Publisher, build_message
from infra.settings import Settings
from infra.transient import is_transient
from tests import pg_roles


async def eventually(
    check: Callable[[], Awaitable[bool]], within: float = 20.0, every: float = 0.1
) -> None:
    """Poll `check` until it returns True; fail the test after `within` seconds."""
    loop = asyncio.get_running_loop()
    deadline = loop.time() + within
    while not await check():
        if loop.time() > deadline:
            raise AssertionError(f"condition not met within {within}s: {check.__qualname__}")
        await asyncio.sleep(every)


async def fetch(pool: asyncpg.Pool, sql: str, *args: Any) -> list[dict[str, Any]]:
    """The rows of a query, as dicts (tests inspect tables directly)."""
    async with pool.acquire() as conn:
        return [dict(r) for r in await conn.fetch(sql, *args)]


def raw_for(route: Route, body: WireModel, *, seq: int | None = None) -> RawDelivery:
    """A delivery of `body` on `route` as the broker would hand it over (no AMQP involved)."""
    headers: dict[str, object] = {H_SCHEMA_VERSION: 1, H_USER_ID: str(body.user_id)}
    if seq is not None:
        headers[H_SEQ] = seq
    return RawDelivery(
        body=body.model_dump_json().encode(),
        message_id=str(uuid4()),
        message_type=route.message_type,
        content_type=CONTENT_TYPE,
        timestamp=None,
        headers=headers,
    )


async def add_package(
    pool: asyncpg.Pool,
    traffic: int | None,
    duration: timedelta | None = None,
    name: str = "test",
) -> int:
    async with pool.acquire() as conn:
        return (await catalog.add_package(conn, name, traffic, duration)).id


async def send(
    settings: Settings,
    amqp: AbstractRobustConnection,
    route: Route,
    body: WireModel,
    message_id: UUID | None = None,
) -> UUID:
    """Publish with a confirm; while the broker restarts, retry with the same message_id."""
    message_id = message_id or uuid4()
    for attempt in range(120):
        try:
            return await publishing.publish(settings, amqp, route, body, message_id=message_id)
        except Exception as exc:
            # RuntimeError: aio-pika's "Connection was not opened" while it reconnects.
            if attempt == 119 or not (is_transient(exc) or isinstance(exc, RuntimeError)):
                raise
            await asyncio.sleep(0.5)
    raise AssertionError("unreachable")


async def send_raw(
    settings: Settings,
    amqp: AbstractRobustConnection,
    route: Route,
    body: bytes,
    *,
    message_id: str | None = "fresh",
    message_type: str | None = "route",
    content_type: str | None = CONTENT_TYPE,
    headers: dict[str, Any] | None = None,
) -> str | None:
    """Publish arbitrary bytes and properties, to exercise the bad-input paths."""
    mid = str(uuid4()) if message_id == "fresh" else message_id
    if mid is None:
        await asyncio.to_thread(
            _publish_without_message_id,
            settings,
            route.name,
            body,
            route.message_type if message_type == "route" else message_type,
            content_type,
            headers if headers is not None else {H_SCHEMA_VERSION: route.schema_version},
        )
        return None
    publisher = await Publisher.open(amqp, settings.exchange, user_id=settings.amqp_user)
    try:
        message = build_message(
            body,
            message_id=mid,
            message_type=route.message_type if message_type == "route" else message_type,
            headers=headers if headers is not None else {H_SCHEMA_VERSION: route.schema_version},
            content_type=content_type,
        )
        await publisher.publish(message, route.name)
    finally:
        await publisher.close()
    return mid


def _publish_without_message_id(
    settings: Settings,
    routing_key: str,
    body: bytes,
    message_type: str | None,
    content_type: str | None,
    headers: dict[str, Any],
) -> None:
    """Publish through pika, which (unlike aiormq) does not invent a message_id."""
    connection = pika.BlockingConnection(pika.URLParameters(settings.amqp_url))
    try:
        channel = connection.channel()
        channel.confirm_delivery()
        channel.basic_publish(
            settings.exchange,
            routing_key,
            body,
            properties=pika.BasicProperties(
                content_type=content_type,
                type=message_type,
                headers=headers,
                delivery_mode=2,
                user_id=settings.amqp_user,  # as pkgq's own publishers do: trusted everywhere
            ),
            mandatory=True,
        )
    finally:
        connection.close()


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


def settings_env(settings: Settings, **extra: str) -> dict[str, str]:
    """A spawned `pkgq` process's environment: it connects as the session's runtime role (the
    owner for `pkgq migrate`), as in production, whatever role the test's fixtures use."""
    return {
        **os.environ,
        **settings.child_env(),
        "PKGQ_POSTGRES_DSN": pg_roles.as_role(settings.postgres_dsn, pg_roles.RUNTIME),
        "PKGQ_LOG_FORMAT": "json",
        "PKGQ_LOG_LEVEL": "info",
        **extra,
    }


def pkgq(
    settings: Settings, *args: str, stdin: str | None = None, **env: str
) -> subprocess.CompletedProcess[str]:
    """Run one `pkgq` command (python -m consumers ...) against the test's namespace, with
    `env` added to its environment."""
    return subprocess.run(
        [sys.executable, "-m", "consumers", *args],
        env=settings_env(settings, **env),
        input=stdin,
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )


async def cli(
    settings: Settings, *args: str, stdin: str | None = None, **env: str
) -> subprocess.CompletedProcess[str]:
    return await asyncio.to_thread(pkgq, settings, *args, stdin=stdin, **env)


class PkgqProcess:
    """A real `pkgq` process started through the CLI (python -m consumers ...)."""

    def __init__(self, settings: Settings, *args: str, **env: str) -> None:
        self.args = args
        self.log = tempfile.NamedTemporaryFile(prefix="pkgq-", suffix=".log")  # noqa: SIM115
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "consumers", *args],
            env=settings_env(settings, **env),
            stdout=self.log,
            stderr=subprocess.STDOUT,
        )

    def terminate(self, timeout: float = 30) -> int:
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
        return self.proc.wait(timeout=timeout)

    def kill(self) -> None:
        if self.proc.poll() is None:
            self.proc.kill()
        self.proc.wait(timeout=10)

    def logs(self) -> str:
        self.log.flush()
        with open(self.log.name, "rb") as f:
            return f.read().decode(errors="replace")


def free_port() -> int:
    """A TCP port nothing listens on now (for a process's status port)."""
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


async def http_get(port: int, path: str) -> tuple[int, str]:
    """GET a path of a local status port: (status code, body)."""
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    writer.write(f"GET {path} HTTP/1.0\r\nHost: test\r\n\r\n".encode())
    await writer.drain()
    response = (await reader.read()).decode()
    writer.close()
    head, _, body = response.partition("\r\n\r\n")
    return int(head.split()[1]), body
