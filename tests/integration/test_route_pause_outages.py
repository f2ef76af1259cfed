"""A route's pause and resume meeting an outage: a pause written while this process cannot
reach Postgres is obeyed once it can."""

from __future__ import annotations

from collections.abc import AsyncIterator, Awaitable, Callable
from uuid import UUID, uuid4

import asyncpg
import pytest
from aio_pika.abc import AbstractRobustConnection
from structlog.testing import capture_logs
from yarl import URL

from consumers import publishing
from events.routes import USAGE_RECORD
from infra.postgres import consumer_pauses
from infra.postgres.pool import create_pool
from infra.rabbit.management import passive_figures
from infra.rabbit.topology import route_queues
from infra.settings import Settings
from tests.conformance.jobs_support import Recorder, recording_pipeline, usage
from tests.support.in_process import StartApp
from tests.support.observing import eventually
from tests.support.proxy import FreezingProxy


@pytest.fixture
async def postgres_proxy(settings: Settings) -> AsyncIterator[FreezingProxy]:
    server = URL(settings.postgres_dsn)
    proxy = await FreezingProxy(server.host or "127.0.0.1", server.port or 5432).start()
    yield proxy
    await proxy.close()


@pytest.fixture
async def cut_off_pool(
    settings: Settings, postgres_proxy: FreezingProxy
) -> AsyncIterator[asyncpg.Pool]:
    """A pool to the test's database through `postgres_proxy`: the consumer process's, which
    the test cuts off from Postgres while its own `pool` still reaches it."""
    dsn = str(URL(settings.postgres_dsn).with_host("127.0.0.1").with_port(postgres_proxy.port))
    pool = await create_pool(dsn, min_size=1, max_size=5)
    yield pool
    await pool.close()


def _figures_are(
    amqp: AbstractRobustConnection, queue: str, ready: int, consumers: int
) -> Callable[[], Awaitable[bool]]:
    async def check() -> bool:
        return (await passive_figures(amqp, [queue]))[queue] == (ready, consumers)

    check.__qualname__ = f"{queue} has {ready} ready and {consumers} consumer(s)"
    return check


async def _pause(pool: asyncpg.Pool, route: str) -> None:
    async with pool.acquire() as conn:
        assert await consumer_pauses.pause(conn, route, "olga", "test")


async def _resume(pool: asyncpg.Pool, route: str) -> None:
    async with pool.acquire() as conn:
        assert await consumer_pauses.resume(conn, route, "olga")


async def _inbox_count(pool: asyncpg.Pool, message_ids: list[UUID]) -> int:
    async with pool.acquire() as conn:
        found: int = await conn.fetchval(
            "SELECT count(*) FROM telecom.inbox WHERE message_id = ANY($1::uuid[])", message_ids
        )
    return found


async def test_a_pause_written_while_the_process_cannot_reach_postgres_is_obeyed_once_it_can_and_nothing_is_lost(  # noqa: E501
    in_process: StartApp,
    settings: Settings,
    pool: asyncpg.Pool,
    amqp: AbstractRobustConnection,
    postgres_proxy: FreezingProxy,
    cut_off_pool: asyncpg.Pool,
) -> None:
    tuned = settings.model_copy(update={"pause_poll": 0.2})
    queue = route_queues(tuned, USAGE_RECORD.name)[0][0]
    recorder = Recorder()
    app = in_process(tuned, cut_off_pool, amqp)
    await app.start_consumers(
        [USAGE_RECORD], pipelines={USAGE_RECORD.name: recording_pipeline(cut_off_pool, recorder)}
    )
    await eventually(_figures_are(amqp, queue, 0, 1))
    user = uuid4()
    with capture_logs() as logs:
        postgres_proxy.refusing = True
        postgres_proxy.cut()
        await _pause(pool, USAGE_RECORD.name)  # the operator's Postgres is there

        async def watch_failed() -> bool:
            return any(e["event"] == "pause_watch_failed" for e in logs)

        await eventually(watch_failed)
        failed = next(e for e in logs if e["event"] == "pause_watch_failed")
        assert failed["paused"] == []  # what it keeps: the state last read
        # The state last read holds: still subscribed, and a message sent now is taken (and
        # waits out the outage in its own transaction).
        during = await publishing.publish(tuned, amqp, USAGE_RECORD, usage(user, 1))
        await eventually(_figures_are(amqp, queue, 0, 1))
        assert recorder.applied == []
        postgres_proxy.refusing = False

        async def applied_once() -> bool:
            return recorder.applied == [during]

        await eventually(applied_once, within=30)
        await eventually(_figures_are(amqp, queue, 0, 0))  # the pause is obeyed
    after = [await publishing.publish(tuned, amqp, USAGE_RECORD, usage(user, k)) for k in (2, 3)]
    await eventually(_figures_are(amqp, queue, 2, 0))  # they wait on the broker
    assert recorder.applied == [during]
    await _resume(pool, USAGE_RECORD.name)

    async def all_applied() -> bool:
        return recorder.applied == [during, *after]

    await eventually(all_applied)
    await app.close()
    assert [task.result() for task in app.tasks] == [0]
    assert await _inbox_count(pool, [during, *after]) == 3  # each applied once
