"""Shared fixtures: every test gets its own database and its own RabbitMQ names.

The database is copied from a migrated template (fast), the exchange and queues carry a unique
prefix, and both are removed afterwards, so tests never see each other's data or messages.
"""

from __future__ import annotations

import asyncio
import os
from collections.abc import AsyncIterator, Iterator
from uuid import uuid4

import asyncpg
import pytest
from aio_pika.abc import AbstractRobustConnection

from infra.postgres.migrate import migrate
from infra.postgres.pool import create_pool
from infra.rabbit.connection import connect
from infra.rabbit.tap import Tap
from infra.rabbit.topology import declare_all, delete_all
from infra.settings import Settings

PG_SERVER = os.environ.get("PKGQ_TEST_PG_SERVER", "postgresql://postgres@127.0.0.1:5432")
AMQP_URL = os.environ.get("PKGQ_AMQP_URL", "amqp://guest:guest@127.0.0.1:5672/")
TEMPLATE = f"pkgq_test_template_{uuid4().hex[:8]}"
"""One per test session, so that two sessions on one machine never drop each other's."""


async def _admin() -> asyncpg.Connection:
    return await asyncpg.connect(f"{PG_SERVER}/postgres")


async def _build_template() -> None:
    admin = await _admin()
    try:
        await admin.execute(f"CREATE DATABASE {TEMPLATE}")
    finally:
        await admin.close()
    conn = await asyncpg.connect(f"{PG_SERVER}/{TEMPLATE}")
    try:
        await migrate(conn)
    finally:
        await conn.close()


async def _drop_template() -> None:
    admin = await _admin()
    try:
        await admin.execute(f"DROP DATABASE IF EXISTS {TEMPLATE} WITH (FORCE)")
    finally:
        await admin.close()


@pytest.fixture(scope="session")
def template_db() -> Iterator[str]:
    asyncio.run(_build_template())
    yield TEMPLATE
    asyncio.run(_drop_template())


def make_settings(namespace: str, **overrides: object) -> Settings:
    values: dict[str, object] = {
        "postgres_dsn": f"{PG_SERVER}/{namespace}",
        "amqp_url": AMQP_URL,
        "exchange": f"{namespace}.telecom",
        "queue_prefix": f"{namespace}.pkgq",
        "relay_poll_interval": 0.2,
        "drain_timeout": 10.0,
        "log_format": "json",
    }
    values.update(overrides)
    return Settings(**values)  # type: ignore[arg-type]  # keys are Settings fields


@pytest.fixture
async def settings(template_db: str) -> AsyncIterator[Settings]:
    namespace = f"pkgq_t_{uuid4().hex[:12]}"
    admin = await _admin()
    try:
        await admin.execute(f"CREATE DATABASE {namespace} TEMPLATE {template_db}")
    finally:
        await admin.close()
    settings = make_settings(namespace)
    yield settings
    admin = await _admin()
    try:
        await admin.execute(f"DROP DATABASE IF EXISTS {namespace} WITH (FORCE)")
    finally:
        await admin.close()
    conn = await connect(AMQP_URL, "pkgq-test-cleanup")
    try:
        channel = await conn.channel()
        await delete_all(channel, settings)
    finally:
        await conn.close()


@pytest.fixture
async def pool(settings: Settings) -> AsyncIterator[asyncpg.Pool]:
    pool = await create_pool(settings.postgres_dsn, min_size=1, max_size=5)
    yield pool
    await pool.close()


@pytest.fixture
async def amqp(settings: Settings) -> AsyncIterator[AbstractRobustConnection]:
    conn = await connect(settings.amqp_url, "pkgq-test")
    channel = await conn.channel()
    await declare_all(channel, settings)
    await channel.close()
    yield conn
    await conn.close()


@pytest.fixture
async def tap(settings: Settings, amqp: AbstractRobustConnection) -> AsyncIterator[Tap]:
    """Everything published to the test's exchange and dead-letter exchange."""
    tap = Tap()
    await tap.attach(amqp, settings.exchange, settings.dlx)
    yield tap
    await tap.close()
