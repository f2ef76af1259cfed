"""Fixtures shared by the integration tests (tests/conftest.py has the per-test database,
broker names and connections)."""

from __future__ import annotations

from collections.abc import AsyncIterator

import asyncpg
import pytest
from aio_pika.abc import AbstractRobustConnection

from devtools.postgres.statements import StatementLog
from infra.postgres.pool import create_pool
from infra.settings import Settings
from tests.support.in_process import InProcess, StartApp


@pytest.fixture
def fast(settings: Settings) -> Settings:
    """The test's settings with a fast release poll: a released hold is drained within 0.2 s."""
    return settings.model_copy(update={"release_poll_interval": 0.2})


@pytest.fixture
async def app(
    in_process: StartApp, fast: Settings, pool: asyncpg.Pool, amqp: AbstractRobustConnection
) -> InProcess:
    """The relay running in the test's loop, on `fast` settings (consumers: start them)."""
    app = in_process(fast, pool, amqp)
    await app.start_relay()
    return app


@pytest.fixture
async def running_app(
    in_process: StartApp, settings: Settings, pool: asyncpg.Pool, amqp: AbstractRobustConnection
) -> InProcess:
    """Every consumer and the relay running in the test's loop, on the test's settings."""
    app = in_process(settings, pool, amqp)
    await app.start_consumers()
    await app.start_relay()
    return app


@pytest.fixture
async def counted(settings: Settings) -> AsyncIterator[tuple[asyncpg.Pool, StatementLog]]:
    """A pool made as the consumers' is (consumers/runtime.services: no reset on release) whose
    statements are logged: the set-based hot path's proof."""
    log = StatementLog()
    pool = await create_pool(
        settings.postgres_dsn, min_size=1, max_size=2, query_logger=log, reset_session=False
    )
    yield pool, log
    await pool.close()
