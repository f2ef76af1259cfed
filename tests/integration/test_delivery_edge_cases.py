"""The failure path at its edges, calling the route's processor directly against the test's own
Postgres database: input that names its user in a header only, or in no header; header values
Postgres cannot store; a batch that mixes users and a failure; a time-expiry timer scheduled and
withdrawn within one batch; a parked message the domain refuses when it is drained; and a lock
wait past the statement timeout.
"""

from __future__ import annotations

import json
from datetime import timedelta
from uuid import UUID, uuid4

import asyncpg

from consumers.delivery import DeliveryPipeline
from consumers.registry import HANDLERS
from consumers.retry_policy import RetryPolicy
from domain.delivery import Fate
from events.decoding import RawDelivery
from events.envelope import H_SCHEMA_VERSION
from events.models import PackageQueuePushEvent, PurchasePackage, RecordUsage
from events.routes import EXPIRY_DUE, PACKAGE_PURCHASE, PACKAGE_QUEUING, USAGE_RECORD, Route
from infra.postgres import dead_letters
from infra.postgres.pool import create_pool
from infra.settings import Settings
from tests.integration.usage_route import Switchable, delivery, outcomes_of, pipeline
from tests.support.deliveries import add_package, raw_for
from tests.support.observing import fetch


async def test_bad_input_claiming_a_held_user_is_buried_at_once_under_no_user_not_parked(
    pool: asyncpg.Pool,
) -> None:
    """Undecodable input names no user: its x-user-id header is only a claim, kept in its
    headers; it is filed under no user, neither parked behind the user's hold nor touching it."""
    user = uuid4()
    process = pipeline(pool, Switchable(1), RetryPolicy(max_attempts=5, backoff=lambda _: 60.0))
    first = delivery(user, 1)
    assert await process(first) == Fate.RETRIED
    bad = delivery(user, 2)
    broken = RawDelivery(
        body=b'{"user_id": ',
        message_id=bad.message_id,
        message_type=bad.message_type,
        content_type=bad.content_type,
        timestamp=None,
        headers=bad.headers,
    )
    assert await process(broken) == Fate.DEAD_LETTERED
    dead = await fetch(
        pool, "SELECT reason, user_id, headers->>'x-user-id' AS claim FROM telecom.dead_letters"
    )
    assert [(r["reason"], r["user_id"], r["claim"]) for r in dead] == [
        ("invalid_json", None, str(user))
    ]
    assert await fetch(pool, "SELECT * FROM telecom.parked") == []
    holds = await fetch(pool, "SELECT blocker, state FROM telecom.holds WHERE user_id = $1", user)
    assert [(r["blocker"], r["state"]) for r in holds] == [(UUID(first.message_id), "retrying")]


async def test_a_message_without_a_user_header_is_buried_under_its_bodys_user_and_discard_frees(
    pool: asyncpg.Pool,
) -> None:
    user = uuid4()
    handler = Switchable(1)
    process = pipeline(pool, handler, RetryPolicy(max_attempts=1))
    m1 = delivery(user, 1)
    headerless = RawDelivery(
        body=m1.body,
        message_id=str(m1.message_id).upper(),  # a producer's own spelling of the same UUID
        message_type=m1.message_type,
        content_type=m1.content_type,
        timestamp=None,
        headers={H_SCHEMA_VERSION: USAGE_RECORD.schema_version},
    )
    assert await process(headerless) == Fate.DEAD_LETTERED
    assert await process(delivery(user, 2)) == Fate.PARKED
    (dead,) = await fetch(pool, "SELECT id, user_id, message_id FROM telecom.dead_letters")
    assert (dead["user_id"], dead["message_id"]) == (user, m1.message_id)

    async with pool.acquire() as conn, conn.transaction():
        assert await dead_letters.discard(conn, [dead["id"]], "test") == 1
    assert await process.drain_parked() == 1
    assert handler.applied == [2]


async def test_header_values_postgres_cannot_hold_do_not_break_the_failure_path(
    pool: asyncpg.Pool,
) -> None:
    user = uuid4()
    process = pipeline(pool, Switchable(1), RetryPolicy(max_attempts=5, backoff=lambda _: 60.0))
    m1 = delivery(user, 1)
    odd = {**m1.headers, "x-note": "a\x00b", "x-ratio": float("nan")}
    first = RawDelivery(m1.body, m1.message_id, m1.message_type, m1.content_type, None, odd)
    assert await process(first) == Fate.RETRIED
    m2 = delivery(user, 2)
    second = RawDelivery(
        m2.body, m2.message_id, m2.message_type, m2.content_type, None, {**m2.headers, **odd}
    )
    assert await process(second) == Fate.PARKED
    (retry,) = await fetch(
        pool,
        "SELECT headers->>'x-note' AS note, headers->>'x-ratio' AS ratio FROM telecom.outbox",
    )
    assert (retry["note"], retry["ratio"]) == ("a\\0b", "nan")


async def test_a_batch_applies_each_users_messages_in_order_and_isolates_a_failure(
    pool: asyncpg.Pool,
) -> None:
    a, b = uuid4(), uuid4()
    handler = Switchable(3)
    process = pipeline(pool, handler, RetryPolicy(max_attempts=5, backoff=lambda _: 60.0))
    batch = [delivery(a, 1), delivery(b, 10), delivery(a, 2), delivery(b, 3), delivery(b, 20)]
    outcomes = outcomes_of(await process.process_batch(batch))
    assert outcomes == [
        Fate.ACKED,
        Fate.ACKED,
        Fate.ACKED,
        Fate.RETRIED,  # b's upload 3 fails ...
        Fate.PARKED,  # ... and b's next message waits behind it
    ]
    # (The handler's own log is not transactional: the batch ran once unguarded, was rolled
    # back at b's failure and ran again guarded. The committed state is what counts.)
    billed = await fetch(
        pool,
        "SELECT user_id, unbilled_upload FROM telecom.queue_users WHERE user_id = ANY($1)",
        [a, b],
    )
    assert {r["user_id"]: r["unbilled_upload"] for r in billed} == {a: 3, b: 10}
    parked = await fetch(pool, "SELECT user_id, body FROM telecom.parked")
    assert [(p["user_id"], json.loads(p["body"])["upload"]) for p in parked] == [(b, 20)]


async def test_a_timer_scheduled_and_withdrawn_within_one_batch_is_never_written(
    pool: asyncpg.Pool,
) -> None:
    # An unguarded batch writes its follow-up events at the end; a time-expiry timer that one
    # message schedules and a later one in the same batch withdraws must not survive that.
    package = await add_package(pool, 10, timedelta(hours=1))

    def run(route: Route) -> DeliveryPipeline:
        return DeliveryPipeline(
            pool, route, HANDLERS[route.name], RetryPolicy(), max_body_bytes=2**20
        )

    async def user_with_first_item_active() -> tuple[UUID, list[int]]:
        user = uuid4()
        purchase = PurchasePackage(user_id=user, package_id=package, amount=3)
        assert await run(PACKAGE_PURCHASE)(raw_for(PACKAGE_PURCHASE, purchase)) == Fate.ACKED
        items = [
            r["id"]
            for r in await fetch(
                pool, "SELECT id FROM telecom.package_queue WHERE user_id = $1 ORDER BY id", user
            )
        ]
        push = PackageQueuePushEvent(
            user_id=user, item_ids=items, package_id=package, pushed_at=1_795_000_000
        )
        assert await run(PACKAGE_QUEUING)(raw_for(PACKAGE_QUEUING, push)) == Fate.ACKED
        return user, items

    async def pending_timers(items: list[int]) -> list[str]:
        found = await fetch(
            pool,
            "SELECT cancel_key FROM telecom.outbox WHERE route = $1 AND cancel_key = ANY($2) "
            "ORDER BY id",
            EXPIRY_DUE.name,
            [f"expire:{i}" for i in items],
        )
        return [r["cancel_key"] for r in found]

    def usage(user: UUID, amount: int) -> RawDelivery:
        return raw_for(USAGE_RECORD, RecordUsage(user_id=user, upload=amount, download=0))

    # Uses up item 1 (its timer is deleted), then activates item 2 (its timer is scheduled).
    kept, kept_items = await user_with_first_item_active()
    batch = [usage(kept, 10), usage(kept, 5)]
    assert outcomes_of(await run(USAGE_RECORD).process_batch(batch)) == [
        Fate.ACKED,
        Fate.ACKED,
    ]
    assert await pending_timers(kept_items) == [f"expire:{kept_items[1]}"]

    # The same, then a third message uses item 2 up: its timer, still unwritten, must go.
    gone, gone_items = await user_with_first_item_active()
    batch = [usage(gone, 10), usage(gone, 5), usage(gone, 5)]
    assert outcomes_of(await run(USAGE_RECORD).process_batch(batch)) == [Fate.ACKED] * 3
    assert await pending_timers(gone_items) == []


async def test_a_parked_message_that_would_overflow_a_counter_is_buried_at_once_and_frees_its_user(
    pool: asyncpg.Pool,
) -> None:
    # Two usage records of 2**62 each would overflow the user's bigint unbilled traffic. The
    # second is refused by the domain as it is drained from the parking lot: buried at once
    # (it can never succeed), holding nothing, and the user's hold is gone.
    user = uuid4()
    handler = Switchable(1)
    process = pipeline(pool, handler, RetryPolicy(max_attempts=5, backoff=lambda _: 60.0))
    m1 = delivery(user, 1)
    assert await process(m1) == Fate.RETRIED
    big1, big2 = delivery(user, 2**62), delivery(user, 2**62)
    assert outcomes_of(await process.process_batch([big1, big2])) == [Fate.PARKED] * 2
    handler.failing.clear()
    retry = delivery(user, 1, message_id=UUID(m1.message_id), attempt=2)
    assert await process(retry) == Fate.ACKED  # lifts the hold and drains the lot

    assert handler.applied == [1, 2**62]
    (billed,) = await fetch(
        pool, "SELECT unbilled_upload FROM telecom.queue_users WHERE user_id = $1", user
    )
    assert billed["unbilled_upload"] == 1 + 2**62  # the first big one is applied, once
    assert await fetch(pool, "SELECT * FROM telecom.parked") == []
    assert await fetch(pool, "SELECT * FROM telecom.holds") == []
    (dead,) = await fetch(
        pool,
        "SELECT reason, attempts FROM telecom.dead_letters WHERE message_id = $1",
        big2.message_id,
    )
    assert (dead["reason"], dead["attempts"]) == ("domain_rule", 1)
    assert (
        await fetch(
            pool, "SELECT 1 FROM telecom.outbox WHERE message_id = $1", UUID(big2.message_id)
        )
        == []
    )


async def test_a_user_row_locked_elsewhere_past_the_statement_timeout_is_the_messages_failure(
    settings: Settings,
) -> None:
    # A lock wait that outlasts the statement timeout is a blip that persists: after a few
    # quick tries the message is retried later and holds its user, as a handler failure does,
    # rather than leave the pipeline for the consumer's last resort (which holds nothing).
    user = uuid4()
    impatient = await create_pool(settings.postgres_dsn, max_size=2, command_timeout=0.5)
    blocker = await asyncpg.connect(settings.postgres_dsn)
    try:
        await blocker.execute("INSERT INTO telecom.queue_users (user_id) VALUES ($1)", user)
        async with blocker.transaction():
            await blocker.execute(
                "SELECT 1 FROM telecom.queue_users WHERE user_id = $1 FOR UPDATE", user
            )
            process = pipeline(impatient, Switchable(), RetryPolicy(max_attempts=5))
            assert await process(delivery(user, 7)) == Fate.RETRIED
        holds = await fetch(impatient, "SELECT state FROM telecom.holds WHERE user_id = $1", user)
        assert [h["state"] for h in holds] == ["retrying"]
    finally:
        await blocker.close()
        await impatient.close()
