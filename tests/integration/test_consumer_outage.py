"""A consumer that gives deliveries back (a TTR overrun) while its broker connection is down,
as during a node loss or a broker restart: it waits for the connection and subscribes again,
rather than failing the process, and the message given back is applied once it is back."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from uuid import uuid4

import asyncpg
import pytest
from aio_pika.abc import AbstractRobustConnection

from consumers import publishing
from events.routes import USAGE_RECORD
from infra.rabbit.connection import connect
from infra.settings import Settings
from tests.conformance.jobs_support import HANG_ONCE, Recorder, recording_pipeline, usage
from tests.support.in_process import StartApp
from tests.support.observing import eventually
from tests.support.proxy import FreezingProxy


@pytest.fixture
async def proxy() -> AsyncIterator[FreezingProxy]:
    proxy = await FreezingProxy("127.0.0.1", 5672).start()
    yield proxy
    await proxy.close()


async def test_a_delivery_given_back_while_the_broker_is_away_is_applied_once_it_is_back(
    in_process: StartApp,
    settings: Settings,
    pool: asyncpg.Pool,
    amqp: AbstractRobustConnection,
    proxy: FreezingProxy,
) -> None:
    one = settings.model_copy(update={"batch_size": 1})
    hung = await publishing.publish(one, amqp, USAGE_RECORD, usage(uuid4(), HANG_ONCE))
    connection = await connect(f"amqp://guest:guest@127.0.0.1:{proxy.port}/", "pkgq-test-outage")
    recorder = Recorder()
    app = in_process(one, pool, connection)
    try:
        await app.start_consumers(
            [USAGE_RECORD],
            pipelines={USAGE_RECORD.name: recording_pipeline(pool, recorder, ttr=1.0)},
        )

        async def started() -> bool:
            return hung in recorder.started

        await eventually(started, within=20)
        proxy.refusing = True
        proxy.cut()  # the broker goes while the handler hangs; the TTR gives it back meanwhile
        await asyncio.sleep(3)
        proxy.refusing = False

        async def applied() -> bool:
            return recorder.applied == [hung]

        await eventually(applied, within=30)
    finally:
        await app.close()
        await connection.close()
    assert recorder.started == [hung, hung]
