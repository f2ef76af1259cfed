"""The relay never keeps publishing on a channel that stopped confirming: after a confirm
timeout it takes a new connection, after a nack a new channel, and a watchdog makes a relay
with no healthy round visible (and reconnects it). Real broker, behind a proxy that can freeze
a connection as a partition does."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator
from uuid import UUID, uuid4

import asyncpg
import pytest
from aio_pika.abc import AbstractRobustConnection

from domain.model import ExpiryReason
from events.models import PackageExpiringEvent
from events.outgoing import Outgoing
from events.routes import PACKAGE_EXPIRING
from infra.observability import RELAY_RENEWALS
from infra.outbox.relay import Relay
from infra.postgres import outbox, queue_repo
from infra.rabbit.connection import connect
from infra.rabbit.topology import route_queues
from infra.settings import Settings
from tests.support.observing import eventually
from tests.support.proxy import FreezingProxy


def _events(user: UUID, items: range) -> list[Outgoing]:
    return [
        Outgoing(
            PACKAGE_EXPIRING,
            PackageExpiringEvent(
                user_id=user, item_id=i + 1, package_id=1, expired_at=0, reason=ExpiryReason.TIME
            ),
        )
        for i in items
    ]


async def _emit(pool: asyncpg.Pool, user: UUID, events: list[Outgoing]) -> None:
    async with pool.acquire() as conn, conn.transaction():
        await queue_repo.lock_user(conn, user)
        await outbox.emit(conn, user, events)


async def _pending(pool: asyncpg.Pool) -> int:
    async with pool.acquire() as conn:
        n: int = await conn.fetchval(
            "SELECT count(*) FROM telecom.outbox WHERE published_at IS NULL"
        )
    return n


async def _queued(amqp: AbstractRobustConnection, settings: Settings) -> list[tuple[str, int]]:
    """(user, item) of every message in the route's queue, in queue order (taken off it)."""
    channel = await amqp.channel()
    try:
        ((name, _),) = route_queues(settings, PACKAGE_EXPIRING.name)
        queue = await channel.declare_queue(name, passive=True)
        found = []
        while (message := await queue.get(no_ack=True, fail=False)) is not None:
            event = PackageExpiringEvent.model_validate_json(message.body)
            found.append((str(event.user_id), event.item_id - 1))
        return found
    finally:
        await channel.close()


def _renewals(kind: str) -> float:
    value: float = RELAY_RENEWALS.labels(kind=kind)._value.get()
    return value


@pytest.fixture
async def proxy() -> AsyncIterator[FreezingProxy]:
    proxy = await FreezingProxy("127.0.0.1", 5672).start()
    yield proxy
    await proxy.close()


@contextlib.asynccontextmanager
async def _running(relay: Relay) -> AsyncIterator[None]:
    stop = asyncio.Event()
    task = asyncio.create_task(relay.run(stop))
    try:
        yield
    finally:
        stop.set()
        await asyncio.wait_for(task, timeout=30)


async def _relay_via(
    proxy: FreezingProxy, settings: Settings, pool: asyncpg.Pool
) -> tuple[Relay, AbstractRobustConnection]:
    connection = await connect(f"amqp://guest:guest@127.0.0.1:{proxy.port}/", "pkgq-test-relay")
    relay = Relay(settings, pool, connection)
    await relay.open()
    return relay, connection


def _in_user_order(found: list[tuple[str, int]], users: list[UUID], items: int) -> None:
    """Every row is on the broker, and each user's first copies are in item order."""
    for user in users:
        mine = [item for owner, item in found if owner == str(user)]
        first_copies = list(dict.fromkeys(mine))
        assert first_copies == list(range(items)), (user, mine)


async def test_a_relay_whose_connection_stops_confirming_reconnects_and_publishes_every_row(
    settings: Settings, pool: asyncpg.Pool, amqp: AbstractRobustConnection, proxy: FreezingProxy
) -> None:
    settings = settings.model_copy(update={"relay_confirm_timeout": 1.0})
    users = [uuid4() for _ in range(3)]
    relay, connection = await _relay_via(proxy, settings, pool)
    before = _renewals("connection")
    try:
        async with _running(relay):
            for user in users:
                await _emit(pool, user, _events(user, range(5)))
            await eventually(lambda: _none_pending(pool), within=20)
            assert proxy.freeze() >= 1  # the relay's connection now swallows everything
            for user in users:
                await _emit(pool, user, _events(user, range(5, 10)))
            await eventually(lambda: _none_pending(pool), within=30)
    finally:
        await connection.close()
    assert _renewals("connection") > before
    assert proxy.accepted >= 2  # it came back on a new connection
    found = await _queued(amqp, settings)
    _in_user_order(found, users, 10)
    assert len(found) == 30  # the frozen publishes never reached the broker: no copies


async def _none_pending(pool: asyncpg.Pool) -> bool:
    return await _pending(pool) == 0


async def test_a_nacked_publish_is_retried_on_a_new_channel_once_the_queue_has_room(
    settings: Settings, pool: asyncpg.Pool, amqp: AbstractRobustConnection, proxy: FreezingProxy
) -> None:
    # A second queue on the route's key that holds one message and refuses more: the broker
    # nacks every later publish to that key (x-overflow=reject-publish), as a quorum queue
    # with a length limit does.
    ((_, key),) = route_queues(settings, PACKAGE_EXPIRING.name)
    channel = await amqp.channel()
    full = await channel.declare_queue(
        f"{settings.queue_prefix}.full",
        arguments={"x-max-length": 1, "x-overflow": "reject-publish"},
    )
    await full.bind(settings.exchange, routing_key=key)
    user = uuid4()
    relay, connection = await _relay_via(proxy, settings, pool)
    before = _renewals("channel")
    try:
        async with _running(relay):
            await _emit(pool, user, _events(user, range(4)))
            await eventually(lambda: _renewed(before), within=20)
            assert await _pending(pool) == 3  # the first fitted; the rest wait, in order
            await full.delete(if_empty=False)
            await eventually(lambda: _none_pending(pool), within=20)
    finally:
        await connection.close()
        await channel.close()
    found = await _queued(amqp, settings)
    _in_user_order(found, [user], 4)


async def _renewed(before: float) -> bool:
    return _renewals("channel") > before


async def test_a_relay_without_a_healthy_round_is_stalled_not_ready_and_reconnects_itself(
    settings: Settings, pool: asyncpg.Pool, amqp: AbstractRobustConnection, proxy: FreezingProxy
) -> None:
    # The confirm timeout is far away: only the watchdog can notice the frozen connection.
    settings = settings.model_copy(
        update={"relay_confirm_timeout": 120.0, "relay_stall_after": 1.5}
    )
    user = uuid4()
    relay, connection = await _relay_via(proxy, settings, pool)
    try:
        async with _running(relay):
            await _emit(pool, user, _events(user, range(2)))
            await eventually(lambda: _none_pending(pool), within=20)
            assert relay.ready()
            proxy.freeze()
            await _emit(pool, user, _events(user, range(2, 4)))
            await eventually(lambda: _is(relay.stalled), within=20)
            assert not relay.ready()
            await eventually(lambda: _none_pending(pool), within=30)
            await eventually(lambda: _is(not relay.stalled), within=20)
            assert relay.ready()
    finally:
        await connection.close()
    _in_user_order(await _queued(amqp, settings), [user], 4)


async def _is(value: bool) -> bool:
    return value


async def test_a_relay_whose_broker_is_down_when_it_renews_its_channel_waits_and_loses_nothing(
    settings: Settings, pool: asyncpg.Pool, amqp: AbstractRobustConnection, proxy: FreezingProxy
) -> None:
    # A broker restart: the relay's connection drops, and for a while no new one is accepted,
    # so a failed publish asks for a new channel that cannot be had yet. The relay must wait
    # for the broker rather than die (it did: "Connection was not opened" ended `pkgq relay`).
    users = [uuid4() for _ in range(2)]
    relay, connection = await _relay_via(proxy, settings, pool)
    stop = asyncio.Event()
    task = asyncio.create_task(relay.run(stop))
    try:
        for user in users:
            await _emit(pool, user, _events(user, range(3)))
        await eventually(lambda: _none_pending(pool), within=20)
        proxy.refusing = True
        proxy.cut()
        for user in users:
            await _emit(pool, user, _events(user, range(3, 6)))
        await asyncio.sleep(3)  # publishes fail; renewals find the connection not open yet
        assert not task.done(), task.exception() if task.done() else None
        assert await _pending(pool) == 6
        proxy.refusing = False
        await eventually(lambda: _none_pending(pool), within=30)
        assert not task.done(), task.exception() if task.done() else None
    finally:
        stop.set()
        with contextlib.suppress(Exception):
            await asyncio.wait_for(task, timeout=30)
        await connection.close()
    found = await _queued(amqp, settings)
    _in_user_order(found, users, 6)
