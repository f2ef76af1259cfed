"""`pkgq route pause --wait` says what the broker shows once the pause is recorded: no replica
consumes the route (0), one still does after the wait (5), or the broker has no queue of the
route, which tells nothing and is never reported as obeyed (6). Real `pkgq` processes against
the test's own database and broker names."""

from __future__ import annotations

import json
from collections.abc import AsyncIterator

import asyncpg
import pytest
from aio_pika.abc import AbstractIncomingMessage, AbstractRobustConnection

from consumers.cli import exit_codes
from events.routes import USAGE_RECORD
from infra.postgres import consumer_pauses
from infra.rabbit.topology import route_queues
from infra.settings import Settings
from tests.support.processes import cli

pytestmark = pytest.mark.e2e


async def _paused(pool: asyncpg.Pool) -> set[str]:
    async with pool.acquire() as conn:
        return set(await consumer_pauses.paused(conn))


async def test_pause_wait_on_a_route_whose_queue_does_not_exist_says_so_and_exits_6(
    settings: Settings, pool: asyncpg.Pool
) -> None:
    # No `amqp` fixture: nothing has declared the test's queues.
    queue = route_queues(settings, USAGE_RECORD.name)[0][0]
    done = await cli(settings, "route", "pause", "usage_record", "--wait", "5", "--json")
    assert done.returncode == exit_codes.MISMATCH, done.stdout + done.stderr
    data = json.loads(done.stdout)
    assert (data["paused"], data["consumers_left"], data["missing_queues"]) == (True, None, [queue])
    assert f"the broker has no queue {queue}" in done.stderr
    assert USAGE_RECORD.name in await _paused(pool)  # recorded all the same

    text = await cli(settings, "route", "pause", "usage_record", "--wait", "5")
    assert text.returncode == exit_codes.MISMATCH
    assert f"not confirmed: the broker has no queue {queue}" in text.stdout
    assert "no replica consumes it" not in text.stdout


async def test_pause_wait_on_a_declared_queue_nobody_consumes_reports_it_obeyed_and_exits_0(
    settings: Settings, pool: asyncpg.Pool, amqp: AbstractRobustConnection
) -> None:
    done = await cli(settings, "route", "pause", "usage_record", "--wait", "5", "--json")
    assert done.returncode == exit_codes.OK, done.stdout + done.stderr
    data = json.loads(done.stdout)
    assert (data["consumers_left"], data["missing_queues"]) == (0, [])
    assert USAGE_RECORD.name in await _paused(pool)


@pytest.fixture
async def subscribed(settings: Settings, amqp: AbstractRobustConnection) -> AsyncIterator[None]:
    """A consumer on the route's queue that knows no pauses (as a release before 0.3.0)."""
    channel = await amqp.channel()
    queue = await channel.get_queue(route_queues(settings, USAGE_RECORD.name)[0][0])

    async def take(message: AbstractIncomingMessage) -> None:
        await message.ack()

    tag = await queue.consume(take)
    yield
    await queue.cancel(tag)
    await channel.close()


async def test_pause_wait_while_a_consumer_stays_subscribed_exits_5(
    settings: Settings, subscribed: None
) -> None:
    done = await cli(settings, "route", "pause", "usage_record", "--wait", "1", "--json")
    assert done.returncode == exit_codes.TIMEOUT, done.stdout + done.stderr
    assert json.loads(done.stdout)["consumers_left"] == 1
