"""Deliveries are taken (trust-checked, stripped of an outsider's pkgq marks, decoded) as they
arrive, ahead of their batch (DeliveryPipeline.take_ahead, called by the consumer in the
channel's reader task): that work then fills the previous batch's waits on Postgres. What a
batch decides does not change with it (tests/integration/test_batch_equivalence.py runs its
batched side with every delivery taken ahead)."""

from __future__ import annotations

import asyncio
import dataclasses
from collections.abc import Sequence
from uuid import UUID, uuid4

import asyncpg
import pytest
from aio_pika.abc import AbstractRobustConnection

from consumers.delivery import DeliveryPipeline
from consumers.delivery.decode import Taken, decode_one
from consumers.registry import HANDLERS
from consumers.retry_policy import RetryPolicy
from domain.delivery import Fate
from events.decoding import Decoded, RawDelivery
from events.envelope import H_GROUP
from events.models import RecordUsage
from events.routes import USAGE_RECORD, Route
from infra.rabbit.connection import connect
from infra.rabbit.consumer import Decided
from infra.rabbit.publisher import Publisher
from infra.rabbit.route_consumer import route_consumer
from infra.settings import Settings
from tests.support.broker_connections import close_connection, listed
from tests.support.deliveries import raw_for, send
from tests.support.observing import eventually
from tests.support.queue_items import active_users, item_counters

LIMIT = 10**9


def _pipeline(
    pool: asyncpg.Pool, trusted: str | None = None, ahead_limit: int = 4096
) -> DeliveryPipeline:
    return DeliveryPipeline(
        pool,
        USAGE_RECORD,
        HANDLERS[USAGE_RECORD.name],
        RetryPolicy(),
        max_body_bytes=2**20,
        trusted_publisher=trusted,
        ahead_limit=ahead_limit,
    )


def _usage(user: UUID, upload: int, download: int = 0) -> RawDelivery:
    return raw_for(USAGE_RECORD, RecordUsage(user_id=user, upload=upload, download=download))


def _counting(
    monkeypatch: pytest.MonkeyPatch, fail_first: bool = False, taken: list[Taken] | None = None
) -> list[RawDelivery]:
    """Every delivery the pipeline decodes, in order (the first one raising, if asked); what
    each was taken as goes to `taken`, if given."""
    seen: list[RawDelivery] = []

    def counted(
        route: Route, raw: RawDelivery, *, max_body_bytes: int, trusted_publisher: str | None
    ) -> Taken:
        seen.append(raw)
        if fail_first and len(seen) == 1:
            raise RuntimeError("a bug in decoding")
        result = decode_one(
            route, raw, max_body_bytes=max_body_bytes, trusted_publisher=trusted_publisher
        )
        if taken is not None:
            taken.append(result)
        return result

    monkeypatch.setattr("consumers.delivery.pipeline.decode_one", counted)
    return seen


async def test_a_delivery_taken_ahead_is_applied_by_its_batch_without_being_decoded_again(
    pool: asyncpg.Pool, monkeypatch: pytest.MonkeyPatch
) -> None:
    (user,) = await active_users(pool, 1, limit=LIMIT, name="ahead")
    pipeline = _pipeline(pool)
    decoded = _counting(monkeypatch)
    raw = _usage(user, 7, 3)
    pipeline.take_ahead(raw)
    assert len(decoded) == 1
    results = await pipeline.process_batch([raw])
    assert [r.fate for r in results] == [Fate.ACKED]
    assert len(decoded) == 1
    assert await item_counters(pool, [user]) == {user: ("active", 7, 3)}


async def test_a_delivery_not_taken_ahead_or_an_equal_copy_of_one_is_decoded_in_its_batch(
    pool: asyncpg.Pool, monkeypatch: pytest.MonkeyPatch
) -> None:
    (user,) = await active_users(pool, 1, limit=LIMIT, name="ahead")
    pipeline = _pipeline(pool)
    decoded = _counting(monkeypatch)
    taken = _usage(user, 1)
    pipeline.take_ahead(taken)
    copy = dataclasses.replace(taken)  # equal, but another object
    other = _usage(user, 2)
    results = await pipeline.process_batch([copy, other])
    # Only the very object taken ahead is matched: the copy and the other are decoded again.
    assert [r is copy or r is other for r in decoded] == [False, True, True]
    assert [r.fate for r in results] == [Fate.ACKED, Fate.ACKED]
    assert await item_counters(pool, [user]) == {user: ("active", 3, 0)}


async def test_deliveries_dropped_unbatched_are_forgotten_oldest_first_and_the_rest_kept(
    pool: asyncpg.Pool, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Deliveries a consumer drops before their batch (a closed channel, a pause) are never
    looked up again: past the limit the oldest are forgotten, not the ones still to come."""
    (user,) = await active_users(pool, 1, limit=LIMIT, name="ahead")
    pipeline = _pipeline(pool, ahead_limit=3)
    decoded = _counting(monkeypatch)
    dropped = [_usage(user, 100) for _ in range(3)]
    kept = [_usage(user, 1) for _ in range(3)]
    for raw in [*dropped, *kept]:
        pipeline.take_ahead(raw)
    results = await pipeline.process_batch(kept)
    assert len(decoded) == 6  # the kept ones were not decoded again: the dropped ones went
    assert [r.fate for r in results] == [Fate.ACKED] * 3
    await pipeline.process_batch(dropped[:1])  # had it come back as the same object after all
    assert decoded[6:] == dropped[:1]  # it was forgotten: taken again, and applied correctly
    assert await item_counters(pool, [user]) == {user: ("active", 103, 0)}


async def test_taking_ahead_never_raises_and_its_batch_takes_the_delivery_again(
    pool: asyncpg.Pool, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A bug met while taking a delivery ahead (in the channel's reader task, where raising
    would close the channel and bring the delivery back forever) is left for its batch."""
    (user,) = await active_users(pool, 1, limit=LIMIT, name="ahead")
    pipeline = _pipeline(pool)
    decoded = _counting(monkeypatch, fail_first=True)
    raw = _usage(user, 5, 5)
    pipeline.take_ahead(raw)
    results = await pipeline.process_batch([raw])
    assert decoded == [raw, raw]
    assert [r.fate for r in results] == [Fate.ACKED]
    assert await item_counters(pool, [user]) == {user: ("active", 5, 5)}


async def test_bad_input_taken_ahead_is_buried_with_its_reason_and_an_outsiders_marks_dropped(
    pool: asyncpg.Pool, monkeypatch: pytest.MonkeyPatch
) -> None:
    (user,) = await active_users(pool, 1, limit=LIMIT, name="ahead")
    pipeline = _pipeline(pool, trusted="pkgq")
    taken: list[Taken] = []
    decoded = _counting(monkeypatch, taken=taken)
    good = _usage(user, 4)
    marked = dataclasses.replace(
        good,
        message_id=str(uuid4()),
        headers={**good.headers, H_GROUP: str(uuid4())},
        publisher="shop",
    )
    bad = dataclasses.replace(good, body=b"{")
    for raw in (marked, bad):
        pipeline.take_ahead(raw)
    # The outsider's group mark was taken off before anything read it.
    assert [H_GROUP in raw.headers for raw, _ in taken] == [False, False]
    assert isinstance(taken[0][1], Decoded)
    assert taken[0][1].envelope.group_id is None
    results = await pipeline.process_batch([marked, bad])
    assert [r.fate for r in results] == [Fate.ACKED, Fate.DEAD_LETTERED]
    async with pool.acquire() as conn:
        reason = await conn.fetchval(
            "SELECT reason FROM telecom.dead_letters WHERE message_uuid = $1",
            UUID(str(bad.message_id)),
        )
    assert reason == "invalid_json"
    assert len(decoded) == 2  # neither decoded again
    assert await item_counters(pool, [user]) == {user: ("active", 4, 0)}


async def test_a_redelivered_copy_of_a_delivery_taken_ahead_is_a_duplicate_and_bills_once(
    pool: asyncpg.Pool,
) -> None:
    """A consumer that dies after its batch committed, before the ack: the broker redelivers
    the message, as a new delivery that is taken ahead afresh (with the same message id), and
    the inbox makes it a duplicate, in the same batch as the original or a later one."""
    (user,) = await active_users(pool, 1, limit=LIMIT, name="ahead")
    pipeline = _pipeline(pool, trusted="pkgq")
    first = _usage(user, 6)
    again = dataclasses.replace(first)
    pipeline.take_ahead(first)
    assert [r.fate for r in await pipeline.process_batch([first])] == [Fate.ACKED]
    pipeline.take_ahead(again)
    twice = dataclasses.replace(first)
    pipeline.take_ahead(twice)
    results = await pipeline.process_batch([again, twice])
    assert [r.fate for r in results] == [Fate.DUPLICATE, Fate.DUPLICATE]
    assert await item_counters(pool, [user]) == {user: ("active", 6, 0)}


async def test_the_consumer_tells_ahead_of_each_delivery_before_handing_the_same_one_over(
    settings: Settings, amqp: AbstractRobustConnection
) -> None:
    told: list[RawDelivery] = []
    handed: list[tuple[RawDelivery, int]] = []

    async def processor(raws: Sequence[RawDelivery]) -> list[Decided]:
        handed.extend((raw, len(told)) for raw in raws)
        return [Decided.of(i, raw, Fate.ACKED) for i, raw in enumerate(raws)]

    connection = await connect(settings.amqp_url, f"pkgq-test-ahead-{uuid4().hex[:8]}")
    dead_letters = await Publisher.open(connection, settings.dlx)
    consumer = route_consumer(
        USAGE_RECORD, settings, connection, processor, dead_letters, ahead=told.append
    )
    await consumer.start()
    try:
        sent = [
            await send(
                settings, amqp, USAGE_RECORD, RecordUsage(user_id=uuid4(), upload=1, download=0)
            )
            for _ in range(3)
        ]

        async def all_processed() -> bool:
            return consumer.processed == 3

        await eventually(all_processed, within=15)
    finally:
        await consumer.stop()
        await connection.close()
    assert [UUID(str(raw.message_id)) for raw, _ in handed] == sent
    for position, (raw, told_by_then) in enumerate(handed):
        assert told_by_then > position  # told of it before it was handed over
        assert any(raw is t for t in told)  # the very object, so the work is not done twice


async def test_deliveries_taken_ahead_and_buffered_when_the_broker_closes_the_connection_bill_once(
    settings: Settings, pool: asyncpg.Pool, amqp: AbstractRobustConnection
) -> None:
    # Deliveries wait in the consumer's buffer, taken ahead, behind slow batches of two; the
    # broker closes the connection; they come back on the new one, are taken again (new
    # objects), and each user's usage is billed once.
    users = await active_users(pool, 30, limit=LIMIT, name="ahead")
    pipeline = _pipeline(pool)
    taken: list[RawDelivery] = []

    def ahead(raw: RawDelivery) -> None:
        taken.append(raw)
        pipeline.take_ahead(raw)

    async def slow(raws: Sequence[RawDelivery]) -> list[Decided]:
        await asyncio.sleep(0.05)
        return await pipeline.process_batch(raws)

    tuned = settings.model_copy(update={"prefetch": 30, "batch_size": 2, "batch_max": 2})
    name = f"pkgq-test-ahead-{uuid4().hex[:8]}"
    connection = await connect(settings.amqp_url, name)
    dead_letters = await Publisher.open(connection, settings.dlx)
    consumer = route_consumer(USAGE_RECORD, tuned, connection, slow, dead_letters, ahead=ahead)
    for user in users:  # all queued first, so that most wait in the consumer's buffer
        await send(settings, amqp, USAGE_RECORD, RecordUsage(user_id=user, upload=5, download=1))
    await listed(settings, name)  # so that it is closed as soon as a few are processed
    await consumer.start()
    try:

        async def some_processed() -> bool:
            return consumer.processed >= 4

        await eventually(some_processed, within=15)
        await close_connection(settings, name)

        async def all_billed() -> bool:
            counters = await item_counters(pool, users)
            return all(c == ("active", 5, 1) for c in counters.values())

        await eventually(all_billed, within=30)
        assert not consumer.failed.is_set()
    finally:
        await consumer.stop()
        await connection.close()
    ids = [raw.message_id for raw in taken]
    assert len(ids) > len(set(ids)) == len(users)  # some were taken twice: before and after
    assert await item_counters(pool, users) == {u: ("active", 5, 1) for u in users}
