"""The outbox relay: only committed rows leave, in per-user order, after their confirm."""

from __future__ import annotations

import asyncio
import random
from collections import defaultdict
from collections.abc import Callable
from datetime import UTC, datetime, timedelta
from uuid import UUID, uuid4

import asyncpg
import pytest
from aio_pika.abc import AbstractRobustConnection

from domain.model import ExpiryReason
from events.models import PackageExpiringEvent
from events.outgoing import Outgoing
from events.routes import PACKAGE_EXPIRING, PACKAGE_QUEUING, Route
from infra.outbox.relay import ROUNDS_IN_FLIGHT, Relay, RoundResult
from infra.postgres import outbox, queue_repo
from infra.rabbit.tap import Tap
from infra.rabbit.topology import route_queues
from infra.settings import Settings
from tests.support.observing import eventually

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


async def _ids_by_message(pool: asyncpg.Pool) -> dict[str, tuple[str, int]]:
    """message_id -> (user_id, outbox id) of every row."""
    async with pool.acquire() as conn:
        rows = await conn.fetch("SELECT message_id, user_id, id FROM telecom.outbox")
    return {str(r["message_id"]): (str(r["user_id"]), r["id"]) for r in rows}


async def _on_broker(amqp: AbstractRobustConnection, settings: Settings, route: Route) -> list[int]:
    """The item ids of the messages waiting in the route's queue (taken off it)."""
    channel = await amqp.channel()
    try:
        ((name, _),) = route_queues(settings, route.name)
        queue = await channel.declare_queue(name, passive=True)
        items = []
        while (message := await queue.get(no_ack=True, fail=False)) is not None:
            items.append(PackageExpiringEvent.model_validate_json(message.body).item_id)
        return items
    finally:
        await channel.close()


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


async def test_two_hundred_rows_of_three_users_are_published_in_each_users_id_order(
    settings: Settings, pool: asyncpg.Pool, amqp: AbstractRobustConnection, tap: Tap
) -> None:
    users = [uuid4() for _ in range(3)]
    rng = random.Random(11)
    written = 0
    while written < 200:  # small transactions of random users, so the users' ids interleave
        user = rng.choice(users)
        batch = [
            _event(user, written + i + 1) for i in range(min(rng.randint(1, 5), 200 - written))
        ]
        await _emit(pool, user, batch)
        written += len(batch)
    several_rounds = settings.model_copy(update={"relay_batch_size": 40})
    stop = asyncio.Event()
    relay = Relay(several_rounds, pool, amqp)
    running = asyncio.create_task(relay.run(stop))
    await tap.wait_for(lambda seen: len(seen) >= 200, within=30)
    stop.set()
    await running

    where = await _ids_by_message(pool)
    arrived: dict[str, list[int]] = defaultdict(list)
    for t in tap.seen:
        owner, row_id = where[str(t.message_id)]
        arrived[owner].append(row_id)
    assert len(tap.seen) == 200
    assert set(arrived) == {str(u) for u in users}
    for owner, ids in arrived.items():
        assert ids == sorted(ids), f"user {owner}: rows arrived in the order {ids}"
    assert await _pending(pool) == 0


async def test_overlapping_rounds_of_one_relay_publish_each_users_rows_once_and_in_order(
    settings: Settings,
    pool: asyncpg.Pool,
    amqp: AbstractRobustConnection,
    tap: Tap,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    users = [uuid4() for _ in range(60)]  # enough to be spread over most of the partitions
    for n in range(1, 5):
        for user in users:
            await _emit(pool, user, [_event(user, n)])
    in_flight, peak = 0, 0
    whole_round = Relay._round

    async def counted(
        self: Relay, on_claimed: Callable[[bool], object] | None = None
    ) -> RoundResult:
        nonlocal in_flight, peak
        in_flight += 1
        peak = max(peak, in_flight)
        try:
            return await whole_round(self, on_claimed)
        finally:
            in_flight -= 1

    monkeypatch.setattr(Relay, "_round", counted)
    small = settings.model_copy(update={"relay_batch_size": 10})
    stop = asyncio.Event()
    relay = Relay(small, pool, amqp)
    running = asyncio.create_task(relay.run(stop))
    await tap.wait_for(lambda seen: len(seen) >= 4 * len(users), within=30)
    stop.set()
    await running

    assert 1 < peak <= ROUNDS_IN_FLIGHT  # the rounds did overlap, and no more than that
    per_user: dict[str, list[int]] = defaultdict(list)
    for t in tap.seen:
        per_user[t.json()["user_id"]].append(t.json()["item_id"])
    assert per_user == {str(u): [1, 2, 3, 4] for u in users}
    assert await _pending(pool) == 0
    assert relay.published == 4 * len(users)


async def test_an_unroutable_row_mid_chain_keeps_it_and_its_users_later_rows_off_the_broker(
    settings: Settings, pool: asyncpg.Pool, amqp: AbstractRobustConnection
) -> None:
    # No tap: a tap binds "#" and would make every routing key routable. The queues are read.
    stuck, other = uuid4(), uuid4()
    await _emit(
        pool,
        stuck,
        [
            _event(stuck, 1),
            _event(stuck, 2, NOWHERE),
            _event(stuck, 3),
            _event(stuck, 4, PACKAGE_QUEUING),
        ],
    )
    await _emit(pool, other, [_event(other, 5), _event(other, 6, PACKAGE_QUEUING)])
    relay = await _relay(settings, pool, amqp)
    assert await relay.relay_once() == 3  # the stuck user's first row and both of the other's

    # Sending row 3 before row 2 was confirmed would have put it in its queue ahead of row 2.
    assert sorted(await _on_broker(amqp, settings, PACKAGE_EXPIRING)) == [1, 5]
    assert await _on_broker(amqp, settings, PACKAGE_QUEUING) == [6]
    async with pool.acquire() as conn:
        rows = await conn.fetch(
            "SELECT route, publish_attempts FROM telecom.outbox "
            "WHERE published_at IS NULL ORDER BY id"
        )
    assert [r["route"] for r in rows] == [NOWHERE.name, PACKAGE_EXPIRING.name, PACKAGE_QUEUING.name]
    assert [r["publish_attempts"] for r in rows] == [1, 0, 0]  # the later rows were never sent
