"""A route's pause and resume meeting an outage: a pause written while this process cannot
reach Postgres is obeyed once it can; a resume while the broker is down waits for the broker,
however long, and consumption resumes once it is back; a batch that outlasts the drain timeout
of a pause goes back to the queue and is applied once (the inbox drops the redelivery)."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Awaitable, Callable, MutableMapping
from dataclasses import dataclass
from typing import Any
from uuid import UUID, uuid4

import asyncpg
import pytest
from aio_pika.abc import AbstractRobustConnection
from structlog.testing import capture_logs
from yarl import URL

from consumers import publishing
from domain.delivery import Fate
from events.routes import USAGE_RECORD
from infra.postgres import consumer_pauses
from infra.postgres.pool import create_pool
from infra.rabbit.connection import connect
from infra.rabbit.management import passive_figures
from infra.rabbit.topology import route_queues
from infra.settings import Settings
from tests.conformance.jobs_support import BLOCK, Recorder, recording_pipeline, usage
from tests.support.in_process import InProcess, StartApp
from tests.support.observing import eventually
from tests.support.proxy import FreezingProxy


@pytest.fixture
async def broker_proxy() -> AsyncIterator[FreezingProxy]:
    proxy = await FreezingProxy("127.0.0.1", 5672).start()
    yield proxy
    await proxy.close()


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


def _still_running(app: InProcess) -> bool:
    return not any(task.done() for task in app.tasks)


def _figures_are(
    amqp: AbstractRobustConnection, queue: str, ready: int, consumers: int
) -> Callable[[], Awaitable[bool]]:
    async def check() -> bool:
        return (await passive_figures(amqp, [queue]))[queue] == (ready, consumers)

    check.__qualname__ = f"{queue} has {ready} ready and {consumers} consumer(s)"
    return check


def _logged(logs: list[MutableMapping[str, Any]], event: str) -> Callable[[], Awaitable[bool]]:
    async def check() -> bool:
        return any(e["event"] == event for e in logs)

    check.__qualname__ = f"{event} logged"
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
            "SELECT count(*) FROM telecom.inbox WHERE sent_as = ANY($1::uuid[])", message_ids
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

        await eventually(_logged(logs, "pause_watch_failed"))
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


@dataclass
class PausedRun:
    app: InProcess
    connection: AbstractRobustConnection
    settings: Settings
    queue: str
    recorder: Recorder
    waiting: UUID
    """A message that waits on the broker for the route's resume."""


@pytest.fixture
async def paused_run(
    in_process: StartApp,
    settings: Settings,
    pool: asyncpg.Pool,
    amqp: AbstractRobustConnection,
    broker_proxy: FreezingProxy,
) -> AsyncIterator[PausedRun]:
    """`pkgq run` of usage_record reaching the broker through `broker_proxy`, started while the
    route is paused, with one message waiting. PKGQ_STARTUP_WAIT, which bounds the wait for the
    broker at start-up, is short: the tests' outages last several times longer."""
    tuned = settings.model_copy(update={"pause_poll": 0.2, "startup_wait": 0.5})
    queue = route_queues(tuned, USAGE_RECORD.name)[0][0]
    url = f"amqp://guest:guest@127.0.0.1:{broker_proxy.port}/"
    connection = await connect(url, "pkgq-test-resume-outage")
    recorder = Recorder()
    app = in_process(tuned, pool, connection)
    await _pause(pool, USAGE_RECORD.name)
    await app.start_consumers(
        [USAGE_RECORD], pipelines={USAGE_RECORD.name: recording_pipeline(pool, recorder)}
    )
    waiting = await publishing.publish(tuned, amqp, USAGE_RECORD, usage(uuid4(), 1))
    await eventually(_figures_are(amqp, queue, 1, 0))  # started paused: it waits
    yield PausedRun(app, connection, tuned, queue, recorder, waiting)
    await app.close()
    await connection.close()


async def _resume_while_the_broker_is_down(
    pool: asyncpg.Pool, broker_proxy: FreezingProxy, logs: list[MutableMapping[str, Any]]
) -> None:
    """Cut the broker off (refusing new connections), resume the route, and wait until the
    consumer says it waits for the broker."""
    broker_proxy.refusing = True
    broker_proxy.cut()
    await _resume(pool, USAGE_RECORD.name)
    await eventually(_logged(logs, "resume_waiting_for_broker"))


async def test_a_resume_while_the_broker_is_down_waits_for_it_however_long_and_consumption_resumes_once_it_is_back(  # noqa: E501
    pool: asyncpg.Pool,
    amqp: AbstractRobustConnection,
    broker_proxy: FreezingProxy,
    paused_run: PausedRun,
) -> None:
    run = paused_run
    with capture_logs() as logs:
        await _resume_while_the_broker_is_down(pool, broker_proxy, logs)
        await asyncio.sleep(3 * run.settings.startup_wait)  # the outage outlasts it
        assert _still_running(run.app)
        assert not any(e["event"] == "resume_failed" for e in logs)
        broker_proxy.refusing = False

        async def applied() -> bool:
            return run.recorder.applied == [run.waiting]

        await eventually(applied, within=30)
    await eventually(_figures_are(amqp, run.queue, 0, 1))
    await run.app.close()
    assert [task.result() for task in run.app.tasks] == [0]  # stopped on request, not failed


async def test_a_pause_written_while_a_resume_waits_for_the_broker_is_obeyed_and_the_route_stays_paused_once_the_broker_is_back(  # noqa: E501
    pool: asyncpg.Pool,
    amqp: AbstractRobustConnection,
    broker_proxy: FreezingProxy,
    paused_run: PausedRun,
) -> None:
    run = paused_run
    with capture_logs() as logs:
        await _resume_while_the_broker_is_down(pool, broker_proxy, logs)
        await _pause(pool, USAGE_RECORD.name)
        await eventually(_logged(logs, "consumer_paused"))  # the watch was not held up
        broker_proxy.refusing = False

        async def reconnected() -> bool:
            return run.connection.connected.is_set()

        await eventually(reconnected, within=30)
        await asyncio.sleep(1)  # time enough to subscribe, were it still wanted
        assert not any(e["event"] == "consumer_resumed" for e in logs)
    assert (await passive_figures(amqp, [run.queue]))[run.queue] == (1, 0)
    assert run.recorder.applied == []
    await _resume(pool, USAGE_RECORD.name)

    async def applied() -> bool:
        return run.recorder.applied == [run.waiting]

    await eventually(applied)
    await run.app.close()
    assert [task.result() for task in run.app.tasks] == [0]


@pytest.mark.parametrize("resumed", ["after_it_commits", "while_it_still_runs"])
async def test_a_batch_that_outlasts_the_drain_timeout_of_a_pause_goes_back_to_the_queue_and_each_message_is_applied_once(  # noqa: E501
    in_process: StartApp,
    settings: Settings,
    pool: asyncpg.Pool,
    amqp: AbstractRobustConnection,
    resumed: str,
) -> None:
    tuned = settings.model_copy(
        update={
            "pause_poll": 0.2,
            "drain_timeout": 0.5,
            "batch_size": 3,
            "batch_linger_ms": 1000,  # the three in one batch
        }
    )
    queue = route_queues(tuned, USAGE_RECORD.name)[0][0]
    recorder = Recorder()
    app = in_process(tuned, pool, amqp)
    await _pause(pool, USAGE_RECORD.name)
    await app.start_consumers(
        [USAGE_RECORD], pipelines={USAGE_RECORD.name: recording_pipeline(pool, recorder)}
    )
    user = uuid4()
    sent = [
        await publishing.publish(tuned, amqp, USAGE_RECORD, usage(user, upload))
        for upload in (1, BLOCK, 3)
    ]
    await eventually(_figures_are(amqp, queue, 3, 0))
    await _resume(pool, USAGE_RECORD.name)

    async def blocked() -> bool:
        return recorder.started == sent[:2]  # in one batch, in one transaction, held

    await eventually(blocked)
    with capture_logs() as logs:
        await _pause(pool, USAGE_RECORD.name)
        await eventually(_logged(logs, "consumer_paused"))  # the drain timeout ran out
        await eventually(_figures_are(amqp, queue, 3, 0))  # the batch is back on the broker
        assert await _inbox_count(pool, sent) == 0  # nothing committed yet
        if resumed == "while_it_still_runs":
            await _resume(pool, USAGE_RECORD.name)
            # taken again, on the new channel: it waits behind the batch still in hand
            await eventually(_figures_are(amqp, queue, 0, 1))
        recorder.gate.set()  # the first batch ends after all, and commits

        async def committed() -> bool:
            return recorder.applied == sent

        await eventually(committed)
        await eventually(_logged(logs, "ack_failed"))  # its channel was closed by the pause
        if resumed == "after_it_commits":
            await _resume(pool, USAGE_RECORD.name)
        await eventually(_figures_are(amqp, queue, 0, 1))

        def outcomes() -> dict[str, list[str]]:
            found: dict[str, list[str]] = {str(m): [] for m in sent}
            for event in logs:
                if event["event"] == "processed":
                    found[event["message_id"]].append(event["outcome"])
            return found

        async def settled_twice() -> bool:
            return all(len(seen) == 2 for seen in outcomes().values())

        await eventually(settled_twice)
    # each applied by the first batch, and dropped by the inbox when redelivered
    assert all(seen == [Fate.ACKED, Fate.DUPLICATE] for seen in outcomes().values())
    assert recorder.started == sent  # the handler never ran again
    assert recorder.applied == sent
    assert await _inbox_count(pool, sent) == 3
    await app.close()
    assert [task.result() for task in app.tasks] == [0]
