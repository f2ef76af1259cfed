"""The hand-off (infra/outbox/handoff.py): a batch's follow-ups published by the process that
committed them, the relay leaving them (and their users' later rows) alone meanwhile and taking
whatever the process gives back, fails to send in time, or leaves behind when it dies."""

from __future__ import annotations

import asyncio
import time
from typing import cast
from uuid import UUID, uuid4

import asyncpg
from aio_pika.abc import AbstractRobustConnection

from domain.model import ExpiryReason
from events.models import PackageExpiringEvent, PurchasePackage
from events.outgoing import Outgoing
from events.routes import PACKAGE_EXPIRING, PACKAGE_PURCHASE, Route
from infra.outbox.handoff import Handoff
from infra.outbox.relay import Relay
from infra.postgres import outbox, queue_repo
from infra.postgres.compound import run
from infra.postgres.outbox import HandedRow
from infra.postgres.pool import clock
from infra.rabbit.tap import Tap
from infra.settings import Settings
from tests.support.deliveries import add_package, send
from tests.support.in_process import StartApp
from tests.support.observing import eventually

NOWHERE = Route("telecom.nowhere", PackageExpiringEvent)


def _event(user: UUID, item: int, route: Route = PACKAGE_EXPIRING) -> Outgoing:
    body = PackageExpiringEvent(
        user_id=user, item_id=item + 1, package_id=1, expired_at=0, reason=ExpiryReason.TIME
    )
    return Outgoing(route, body)


PROCESS = uuid4()
"""The process the tests' batches hand rows off to, unless they say otherwise."""


async def _write(
    pool: asyncpg.Pool,
    user: UUID,
    events: list[Outgoing],
    handoff_s: float,
    room: int = 100,
    by: UUID = PROCESS,
) -> list[HandedRow]:
    """What a batch does: lock the user (holding the hand-off barrier), insert the rows asking
    for a hand-off of `handoff_s` seconds (0: none) to process `by`, with room for `room`
    rows. Returns the rows handed off."""
    async with pool.acquire() as conn, conn.transaction():
        await queue_repo.lock_users(conn, [user], handing_off=True)
        now = await clock(conn)
        messages = [outbox.from_outgoing(e, seq=None) for e in events]
        added = await run(
            conn,
            outbox.enqueue_part(
                messages, handoff_s=handoff_s, now=now, handoff_room=room, handoff_by=by
            ),
        )
    assert added is not None
    by_message = {m.message_id: m for m in messages}
    return [HandedRow(i, by_message[m]) for i, m in added.handed]


async def _rows(pool: asyncpg.Pool, user: UUID) -> list[asyncpg.Record]:
    async with pool.acquire() as conn:
        return await conn.fetch(
            "SELECT id, published_at, handed_until, publish_attempts, last_error "
            "FROM telecom.outbox WHERE user_id = $1 ORDER BY id",
            user,
        )


def _items(tap: Tap, user: UUID) -> list[int]:
    """Item ids of the user's events seen on the exchange, in arrival order, copies kept."""
    return [int(t.json()["item_id"]) - 1 for t in tap.seen if t.json().get("user_id") == str(user)]


async def _relay(settings: Settings, pool: asyncpg.Pool, amqp: AbstractRobustConnection) -> Relay:
    relay = Relay(settings, pool, amqp)
    await relay.open()
    return relay


async def test_handed_off_rows_are_published_by_the_writing_process_in_order_and_marked(
    settings: Settings, pool: asyncpg.Pool, amqp: AbstractRobustConnection, tap: Tap
) -> None:
    user = uuid4()
    handed = await _write(pool, user, [_event(user, i) for i in range(3)], handoff_s=30)
    assert [r.message.user_id for r in handed] == [user] * 3
    handoff = Handoff(settings, pool, amqp)
    try:
        published = await handoff.publish(handed, time.monotonic() + 10)
    finally:
        await handoff.close()
    assert published == [r.id for r in handed]
    await tap.wait_for(lambda _: len(_items(tap, user)) == 3, within=10)
    assert _items(tap, user) == [0, 1, 2]
    rows = await _rows(pool, user)
    assert all(r["published_at"] is not None and r["handed_until"] is not None for r in rows)


async def test_a_users_rows_are_not_handed_off_while_an_earlier_row_of_theirs_waits(
    pool: asyncpg.Pool,
) -> None:
    user, other = uuid4(), uuid4()
    await _write(pool, user, [_event(user, 0)], handoff_s=0)  # the relay's, unpublished
    assert await _write(pool, user, [_event(user, 1), _event(user, 2)], handoff_s=30) == []
    assert len(await _write(pool, other, [_event(other, 0)], handoff_s=30)) == 1
    assert [r["handed_until"] for r in await _rows(pool, user)] == [None, None, None]


async def test_a_users_next_rows_are_handed_off_behind_its_rows_under_way_in_the_same_process(
    settings: Settings, pool: asyncpg.Pool, amqp: AbstractRobustConnection, tap: Tap
) -> None:
    handoff = Handoff(settings, pool, amqp)
    user = uuid4()
    first = await _write(pool, user, [_event(user, 0), _event(user, 1)], 30, by=handoff.identity)
    second = await _write(pool, user, [_event(user, 2)], 30, by=handoff.identity)
    assert len(first) == 2
    assert len(second) == 1  # behind rows under way in the process it is handed off to
    assert await _write(pool, user, [_event(user, 3)], 30, by=uuid4()) == []  # not another's
    try:
        places = handoff.reserve(first), handoff.reserve(second)  # in their commits' order
        handoff.hand(places[1], time.monotonic() + 10)  # even handed over first, it goes after
        await asyncio.sleep(0.2)
        assert _items(tap, user) == []  # it waits for the rows before it
        handoff.hand(places[0], time.monotonic() + 10)
        await tap.wait_for(lambda _: len(_items(tap, user)) == 3, within=10)
    finally:
        await handoff.close()
    assert _items(tap, user) == [0, 1, 2]
    published = [r["published_at"] is not None for r in await _rows(pool, user)]
    assert published == [True, True, True, False]  # row 3 is the relay's


async def test_rows_handed_off_behind_rows_that_were_not_published_are_given_back_unsent(
    settings: Settings, pool: asyncpg.Pool, amqp: AbstractRobustConnection
) -> None:
    # No tap here: it would route the first row (its queue takes every key).
    handoff = Handoff(settings, pool, amqp)
    user = uuid4()
    first = await _write(pool, user, [_event(user, 0, NOWHERE)], 30, by=handoff.identity)
    second = await _write(pool, user, [_event(user, 1)], 30, by=handoff.identity)
    try:
        places = handoff.reserve(first), handoff.reserve(second)
        handoff.hand(places[0], time.monotonic() + 10)
        handoff.hand(places[1], time.monotonic() + 10)
    finally:
        await handoff.close()
    rows = await _rows(pool, user)
    assert [r["handed_until"] for r in rows] == [None, None]  # both the relay's again
    assert [r["publish_attempts"] for r in rows] == [1, 0]  # the second was never sent
    assert [r["published_at"] for r in rows] == [None, None]
    assert handoff.in_flight == 0


async def test_a_place_whose_batch_did_not_commit_passes_on_what_came_before_it(
    settings: Settings, pool: asyncpg.Pool, amqp: AbstractRobustConnection
) -> None:
    handoff = Handoff(settings, pool, amqp)
    user = uuid4()
    rows = await _write(pool, user, [_event(user, 0)], 30, by=handoff.identity)
    first = handoff.reserve(rows)
    rolled_back = handoff.reserve(rows)  # a batch of the same user whose commit failed
    last = handoff.reserve(rows)
    handoff.drop(rolled_back)
    assert last.before[user] is rolled_back.after[user]
    first.after[user].set_result(False)  # the first was not published
    await asyncio.sleep(0)
    assert rolled_back.after[user].result() is False  # so the last waits on nothing it may pass
    handoff.drop(first)  # (settled already: nothing changes)
    handoff.drop(last)
    await asyncio.sleep(0)
    assert last.after[user].result() is False
    assert handoff._tails == {}  # nothing left behind


async def test_a_batch_with_more_follow_ups_than_the_process_has_room_for_hands_none_off(
    pool: asyncpg.Pool,
) -> None:
    user, other = uuid4(), uuid4()
    assert await _write(pool, user, [_event(user, i) for i in range(3)], 30, room=2) == []
    assert len(await _write(pool, other, [_event(other, i) for i in range(2)], 30, room=2)) == 2


async def test_a_process_with_rows_under_way_has_that_much_less_room() -> None:
    settings = Settings(handoff_max_rows=5)
    handoff = Handoff(settings, cast(asyncpg.Pool, None))
    assert handoff.room() == 5
    handoff.in_flight = 4
    assert handoff.room() == 1
    handoff.in_flight = 9
    assert handoff.room() == 0


async def test_a_user_with_a_row_that_may_not_be_handed_off_has_none_of_its_rows_handed_off(
    pool: asyncpg.Pool,
) -> None:
    user = uuid4()
    events = [_event(user, 0), Outgoing(PACKAGE_EXPIRING, _event(user, 1).body, cancel_key="k")]
    assert await _write(pool, user, events, handoff_s=30) == []


async def test_the_relay_leaves_a_handed_off_row_and_its_users_later_rows_until_it_is_published(
    settings: Settings, pool: asyncpg.Pool, amqp: AbstractRobustConnection, tap: Tap
) -> None:
    user, other = uuid4(), uuid4()
    handed = await _write(pool, user, [_event(user, 0)], handoff_s=60)
    # Written by another process: not handed off, behind row 0 (which is this one's).
    assert await _write(pool, user, [_event(user, 1)], handoff_s=60, by=uuid4()) == []
    await _write(pool, other, [_event(other, 7)], handoff_s=0)
    relay = await _relay(settings, pool, amqp)
    assert await relay.relay_once() == 1  # the other user's row only
    await tap.wait_for(lambda _: _items(tap, other) == [7], within=10)
    assert _items(tap, user) == []
    handoff = Handoff(settings, pool, amqp)
    try:
        assert await handoff.publish(handed, time.monotonic() + 10) == [handed[0].id]
    finally:
        await handoff.close()
    assert await relay.relay_once() == 1  # row 1, now that row 0 is published
    await tap.wait_for(lambda _: len(_items(tap, user)) == 2, within=10)
    assert _items(tap, user) == [0, 1]


async def test_the_relay_takes_a_handed_off_row_and_the_rows_behind_it_once_its_time_ran_out(
    settings: Settings, pool: asyncpg.Pool, amqp: AbstractRobustConnection, tap: Tap
) -> None:
    user = uuid4()
    assert len(await _write(pool, user, [_event(user, 0)], handoff_s=0.3)) == 1
    await _write(pool, user, [_event(user, 1)], handoff_s=0.3)
    relay = await _relay(settings, pool, amqp)
    await asyncio.sleep(0.4)  # the process that wrote row 0 died: nobody publishes it
    assert await relay.relay_once() == 2
    await tap.wait_for(lambda _: len(_items(tap, user)) == 2, within=10)
    assert _items(tap, user) == [0, 1]


async def test_a_returned_hand_off_gives_its_row_and_the_rest_of_its_chain_back_at_once(
    settings: Settings, pool: asyncpg.Pool, amqp: AbstractRobustConnection
) -> None:
    user = uuid4()
    handed = await _write(pool, user, [_event(user, 0, NOWHERE), _event(user, 1)], handoff_s=60)
    assert len(handed) == 2
    async with pool.acquire() as listener:
        woken = asyncio.Event()

        def wake(*_: object) -> None:
            woken.set()

        await listener.add_listener("pkgq_outbox", wake)
        handoff = Handoff(settings, pool, amqp)
        try:
            assert await handoff.publish(handed, time.monotonic() + 10) == []
        finally:
            await handoff.close()
        await asyncio.wait_for(woken.wait(), timeout=5)  # the relays are woken for them
        await listener.remove_listener("pkgq_outbox", wake)
    first, second = await _rows(pool, user)
    assert first["handed_until"] is None
    assert second["handed_until"] is None
    assert first["published_at"] is None
    assert second["published_at"] is None
    assert first["publish_attempts"] == 1
    assert "NO_ROUTE" in first["last_error"] or "returned" in first["last_error"].lower()


async def test_a_handed_off_row_past_its_deadline_is_not_sent_but_given_back(
    settings: Settings, pool: asyncpg.Pool, amqp: AbstractRobustConnection, tap: Tap
) -> None:
    user = uuid4()
    handed = await _write(pool, user, [_event(user, 0)], handoff_s=60)
    handoff = Handoff(settings, pool, amqp)
    try:
        assert await handoff.publish(handed, time.monotonic() - 1) == []
    finally:
        await handoff.close()
    (row,) = await _rows(pool, user)
    assert row["handed_until"] is None
    assert row["published_at"] is None
    assert row["publish_attempts"] == 0  # nothing failed: it was not sent
    relay = await _relay(settings, pool, amqp)
    assert await relay.relay_once() == 1
    await tap.wait_for(lambda _: _items(tap, user) == [0], within=10)


async def test_pausing_a_route_waits_for_the_batches_under_way_that_may_hand_its_rows_off(
    pool: asyncpg.Pool,
) -> None:
    async with pool.acquire() as batch:
        under_way = batch.transaction()
        await under_way.start()
        await queue_repo.lock_users(batch, [uuid4()], handing_off=True)
        async with pool.acquire() as operator:
            pausing = asyncio.create_task(
                outbox.pause_route(operator, PACKAGE_EXPIRING.name, "test")
            )
            await asyncio.sleep(0.3)
            assert not pausing.done()  # the batch may still hand a row of the route off
            await under_way.commit()
            assert await asyncio.wait_for(pausing, timeout=10)
    user = uuid4()  # a batch after the pause hands none of the route's rows off
    assert await _write(pool, user, [_event(user, 1)], handoff_s=30) == []


async def test_pausing_a_route_returns_once_rows_handed_off_before_it_are_the_relays_again(
    pool: asyncpg.Pool,
) -> None:
    user = uuid4()
    assert len(await _write(pool, user, [_event(user, 0)], handoff_s=1.0)) == 1
    async with pool.acquire() as operator:
        assert await outbox.pause_route(operator, PACKAGE_EXPIRING.name, "test")
        expired = await operator.fetchval(
            "SELECT bool_and(handed_until <= now()) FROM telecom.outbox WHERE user_id = $1", user
        )
    assert expired  # nobody published it: it returned when its time ran out


async def test_a_consumers_follow_ups_are_handed_off_and_published_by_its_process(
    in_process: StartApp, settings: Settings, pool: asyncpg.Pool, amqp: AbstractRobustConnection
) -> None:
    app = in_process(settings.model_copy(update={"handoff_s": 5.0}), pool, amqp)
    await app.start_consumers([PACKAGE_PURCHASE])  # no relay runs: only the hand-off publishes
    package = await add_package(pool, 1000)
    user = uuid4()
    await send(settings, amqp, PACKAGE_PURCHASE, PurchasePackage(user_id=user, package_id=package))

    async def published() -> bool:
        rows = await _rows(pool, user)
        return bool(rows) and all(r["published_at"] is not None for r in rows)

    await eventually(published, within=20)
    assert all(r["handed_until"] is not None for r in await _rows(pool, user))
