"""Publishes begun together go to aiormq's writer as one frame (infra/rabbit/wire/coalesce.py), and
the broker's answer for each settles that publish alone: a return or a nack between two
confirmed messages fails only its own, a publish cancelled before the write is never sent, and
a connection the broker closes fails what waits for a confirm instead of leaving it waiting."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from uuid import uuid4

import pytest
from aio_pika.abc import AbstractQueue, AbstractRobustConnection

from infra.rabbit.connection import connect
from infra.rabbit.publisher import Publisher, PublishFailedError, build_properties
from infra.settings import Settings
from tests.support.broker_connections import close_connections_named, listed


@pytest.fixture
async def queues(
    settings: Settings, amqp: AbstractRobustConnection
) -> AsyncIterator[tuple[AbstractQueue, AbstractQueue]]:
    """On the test's exchange: key "ok" to a plain queue, key "full" to a queue that holds one
    message and nacks any more (x-overflow=reject-publish); any other key is unroutable."""
    channel = await amqp.channel()
    ok = await channel.declare_queue(f"{settings.queue_prefix}.coalesced.ok", auto_delete=True)
    full = await channel.declare_queue(
        f"{settings.queue_prefix}.coalesced.full",
        auto_delete=True,
        arguments={"x-max-length": 1, "x-overflow": "reject-publish"},
    )
    await ok.bind(settings.exchange, routing_key="ok")
    await full.bind(settings.exchange, routing_key="full")
    yield ok, full
    await channel.close()


@pytest.fixture
async def publisher(settings: Settings, amqp: AbstractRobustConnection) -> AsyncIterator[Publisher]:
    opened = await Publisher.open(amqp, settings.exchange)
    yield opened
    await opened.close()


async def _publish(publisher: Publisher, body: str, key: str) -> None:
    properties = build_properties(message_id=uuid4(), message_type="test", headers={})
    await publisher.publish_properties(body.encode(), properties, key)


async def _bodies(queue: AbstractQueue) -> list[str]:
    found = []
    while (message := await queue.get(no_ack=True, fail=False)) is not None:
        found.append(message.body.decode())
    return found


async def test_publishes_begun_together_go_to_the_writer_as_one_frame_in_order_each_confirmed(
    publisher: Publisher, queues: tuple[AbstractQueue, ...]
) -> None:
    ok, _ = queues
    await asyncio.gather(*(_publish(publisher, f"m{i}", "ok") for i in range(40)))
    coalescer = publisher._publishing._coalescer
    assert coalescer is not None
    assert coalescer.writes == 1
    await asyncio.gather(*(_publish(publisher, f"n{i}", "ok") for i in range(3)))
    assert coalescer.writes == 2
    assert await _bodies(ok) == [f"m{i}" for i in range(40)] + [f"n{i}" for i in range(3)]


async def test_a_return_and_a_nack_inside_one_frame_fail_only_their_own_publishes(
    publisher: Publisher, queues: tuple[AbstractQueue, ...]
) -> None:
    ok, full = queues
    plan = [("a", "ok"), ("b", "nowhere"), ("c", "full"), ("d", "full"), ("e", "ok")]
    outcomes = await asyncio.gather(
        *(_publish(publisher, body, key) for body, key in plan), return_exceptions=True
    )
    # The channel goes on: a later publish is confirmed.
    await _publish(publisher, "f", "ok")
    assert outcomes[0] is None
    assert outcomes[2] is None
    assert outcomes[4] is None
    returned, nacked = outcomes[1], outcomes[3]
    assert isinstance(returned, PublishFailedError)
    assert returned.returned
    assert isinstance(nacked, PublishFailedError)
    assert not nacked.returned
    assert await _bodies(ok) == ["a", "e", "f"]
    assert await _bodies(full) == ["c"]


async def test_a_publish_cancelled_before_the_write_is_never_sent_and_tags_stay_in_step(
    publisher: Publisher, queues: tuple[AbstractQueue, ...]
) -> None:
    ok, _ = queues
    first = asyncio.create_task(_publish(publisher, "cancelled", "ok"))
    second = asyncio.create_task(_publish(publisher, "sent", "ok"))
    await asyncio.sleep(0)  # both have begun; the write has not run yet
    first.cancel()
    await second
    with pytest.raises(asyncio.CancelledError):
        await first
    # Confirms still match their publishes: each of these is confirmed, none hangs.
    await asyncio.wait_for(
        asyncio.gather(*(_publish(publisher, f"later{i}", "ok") for i in range(5))), 10
    )
    assert await _bodies(ok) == ["sent"] + [f"later{i}" for i in range(5)]


async def test_a_connection_the_broker_closes_under_begun_publishes_fails_each_without_waiting(
    settings: Settings, queues: tuple[AbstractQueue, ...]
) -> None:
    """As a broker restart or an operator would, between the publishes' start and their write:
    each fails at once (the caller keeps its row and sends it again); none waits for the
    confirm timeout, and none is reported confirmed."""
    ok, _ = queues
    name = f"pkgq-test-coalesced-{uuid4().hex[:8]}"
    connection = await connect(settings.amqp_url, name)
    try:
        publisher = await Publisher.open(connection, settings.exchange, confirm_timeout=60)
        await listed(settings, name)
        publishing = asyncio.gather(
            *(_publish(publisher, f"m{i}", "ok") for i in range(50)), return_exceptions=True
        )
        # Closed before the loop runs the publishes (a blocking call on purpose: nothing of
        # them reaches the broker first).
        assert close_connections_named(settings, name) == 1
        outcomes = await asyncio.wait_for(publishing, timeout=20)  # not the 60 s timeout
    finally:
        await connection.close()
    assert all(isinstance(outcome, Exception) for outcome in outcomes), outcomes
    assert await _bodies(ok) == []
