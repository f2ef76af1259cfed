"""The outbox relay: only committed rows leave, in per-user order, after their confirm."""

from __future__ import annotations

import asyncio
import random
from collections import defaultdict
from datetime import UTC, datetime, timedelta
from uuid import UUID, uuid4

import asyncpg
import pytest
from aio_pika.abc import AbstractRobustConnection

from domain.model import ExpiryReason
from events.models import PackageExpiringEvent
from events.outgoing import Outgoing
from events.routes import PACKAGE_EXPIRING, PACKAGE_QUEUING, Route
from infra.outbox.relay import Relay
from infra.postgres import outbox, queue_repo
from infra.rabbit.tap import Tap
from infra.settings import Settings
from tests.support import eventually

NOWHERE = Route("telecom.nowhere", PackageExpiringEvent)


def _event(user: UUID, item: int, route: Route = PACKAGE_EXPIRING) -> Outgoing:
    body = PackageExpiringEvent(
        user_id=user, item_id=item, package_id=1, expired_at=0, reason=ExpiryReason.TIME
    )
    return Outgoing(route, body)


async def _emit(pool: asyncpg.Pool, user: UUID, events: list[Outgoing]) -> None:
    async with pool.acquire() as conn, conn.transaction():
        await queue_repo.lock_user(conn, user)
        await outbox.emit(conn, user, events)


async def _relay(settings: Settings, pool: asyncpg.Pool, amqp: AbstractRobustConnection) -> Relay:
    relay = Relay(settings, pool, amqp)
    await relay.open()
    return relay


async def _pending(pool: asyncpg.Pool) -> int:
    async with pool.acquire() as conn:
        n: int = await conn.fetchval(
            "SELECT count(*) FROM telecom.outbox WHERE published_at IS NULL"
        )
        return n


async def test_rows_of_a_rolled_back_transaction_are_never_published(
    settings: Settings, pool: asyncpg.Pool, amqp: AbstractRobustConnection, tap: Tap
) -> None:
    user = uuid4()

    async def failing_handler() -> None:
        async with pool.acquire() as conn, conn.transaction():
            await queue_repo.lock_user(conn, user)
            await outbox.emit(conn, user, [_event(user, 1)])
            raise RuntimeError("handler failed after writing")

    with pytest.raises(RuntimeError, match="handler failed after writing"):
        await failing_handler()
    relay = await _relay(settings, pool, amqp)
    assert await relay.relay_once() == 0
    await asyncio.sleep(0.3)
    assert tap.on(PACKAGE_EXPIRING.name) == []
    async with pool.acquire() as conn:
        assert await conn.fetchval("SELECT count(*) FROM telecom.outbox") == 0


async def test_committed_rows_are_published_and_marked_after_their_confirm(
    settings: Settings, pool: asyncpg.Pool, amqp: AbstractRobustConnection, tap: Tap
) -> None:
    user = uuid4()
    await _emit(pool, user, [_event(user, 1), _event(user, 2)])
    relay = await _relay(settings, pool, amqp)
    assert await relay.relay_once() == 2
    assert await _pending(pool) == 0
    await tap.wait_for(lambda seen: len(seen) == 2, within=5)
    assert [t.seq for t in tap.seen] == [1, 2]
    assert [t.json()["item_id"] for t in tap.seen] == [1, 2]


async def test_a_row_scheduled_in_the_future_is_not_published_before_it_is_due(
    settings: Settings, pool: asyncpg.Pool, amqp: AbstractRobustConnection, tap: Tap
) -> None:
    user = uuid4()
    later = datetime.now(UTC) + timedelta(hours=1)
    body = _event(user, 7).body
    await _emit(pool, user, [Outgoing(PACKAGE_EXPIRING, body, due_at=later, cancel_key="k")])
    relay = await _relay(settings, pool, amqp)
    assert await relay.relay_once() == 0
    assert await _pending(pool) == 1
    async with pool.acquire() as conn:
        assert await outbox.withdraw(conn, ["k"]) == 1
    assert await _pending(pool) == 0


async def test_an_unroutable_row_stays_pending_and_holds_back_that_users_later_rows(
    settings: Settings, pool: asyncpg.Pool, amqp: AbstractRobustConnection
) -> None:
    # No tap here: a tap binds "#" and would make every routing key routable.
    stuck, other = uuid4(), uuid4()
    await _emit(pool, stuck, [_event(stuck, 1, NOWHERE), _event(stuck, 2)])
    await _emit(pool, other, [_event(other, 3)])
    relay = await _relay(settings, pool, amqp)
    assert await relay.relay_once() == 1  # only the other user's row
    async with pool.acquire() as conn:
        rows = await conn.fetch(
            "SELECT route, publish_attempts, last_error FROM telecom.outbox "
            "WHERE published_at IS NULL ORDER BY id"
        )
    assert [r["route"] for r in rows] == [NOWHERE.name, PACKAGE_EXPIRING.name]
    assert rows[0]["publish_attempts"] == 1
    assert "not published" in rows[0]["last_error"]


async def test_two_relays_never_publish_one_users_events_out_of_order(
    settings: Settings, pool: asyncpg.Pool, amqp: AbstractRobustConnection, tap: Tap
) -> None:
    users = [uuid4() for _ in range(12)]
    expected: dict[str, int] = {}
    rng = random.Random(7)

    async def writer(user: UUID) -> None:
        n = 0
        for _ in range(6):
            batch = [_event(user, n + i + 1) for i in range(rng.randint(1, 4))]
            n += len(batch)
            await _emit(pool, user, batch)
            await asyncio.sleep(rng.random() / 50)
        expected[str(user)] = n

    fast = settings.model_copy(update={"relay_batch_size": 7, "relay_poll_interval": 0.05})
    relays = [Relay(fast, pool, amqp), Relay(fast, pool, amqp)]
    stop = asyncio.Event()
    running = [asyncio.create_task(r.run(stop)) for r in relays]
    await asyncio.gather(*(writer(u) for u in users))
    total = sum(expected.values())
    await tap.wait_for(lambda seen: len(seen) >= total, within=30)
    stop.set()
    await asyncio.gather(*running)

    per_user: dict[str, list[int]] = defaultdict(list)
    for t in tap.seen:
        per_user[t.json()["user_id"]].append(t.seq or 0)
    for user, seqs in per_user.items():
        assert seqs == list(range(1, expected[user] + 1)), f"user {user} saw {seqs}"
    assert await _pending(pool) == 0
    assert sum(r.published for r in relays) == total


async def test_relay_is_woken_by_notify_and_publishes_new_rows(
    settings: Settings, pool: asyncpg.Pool, amqp: AbstractRobustConnection, tap: Tap
) -> None:
    slow_poll = settings.model_copy(update={"relay_poll_interval": 30.0})
    stop = asyncio.Event()
    relay = Relay(slow_poll, pool, amqp)
    task = asyncio.create_task(relay.run(stop))
    await asyncio.sleep(0.5)  # idle, waiting on LISTEN
    user = uuid4()
    await _emit(pool, user, [_event(user, 1, PACKAGE_QUEUING)])

    async def published() -> bool:
        return await _pending(pool) == 0

    await eventually(published, within=5)  # far sooner than the 30 s poll
    stop.set()
    await task
