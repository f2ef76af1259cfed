"""The parking lot: what waits behind a hold is drained in order once it is lifted, and a hold
never outlives what it holds back. Against the test's own Postgres database, calling the
route's processor and its release poll directly.
"""

from __future__ import annotations

from uuid import UUID, uuid4

import asyncpg

from consumers.delivery import DeliveryPipeline
from consumers.handlers import usage_record
from consumers.retry_policy import RetryPolicy
from consumers.unit_of_work import HandlerContext
from domain.delivery import Fate
from events.decoding import RawDelivery
from events.envelope import CONTENT_TYPE, H_SCHEMA_VERSION, H_USER_ID
from events.models import RecordUsage
from events.routes import USAGE_RECORD
from infra.postgres import holds, invariants
from tests.support.observing import fetch

NO_GRACE = invariants.Graces(outbox_s=0.0, attempts_s=0.0)


def usage(user: UUID, message_id: UUID, upload: int) -> RawDelivery:
    return RawDelivery(
        body=RecordUsage(user_id=user, upload=upload, download=0).model_dump_json().encode(),
        message_id=str(message_id),
        message_type=USAGE_RECORD.message_type,
        content_type=CONTENT_TYPE,
        timestamp=None,
        headers={H_SCHEMA_VERSION: USAGE_RECORD.schema_version, H_USER_ID: str(user)},
    )


def pipeline(
    pool: asyncpg.Pool, failing: set[UUID], outage: set[UUID] | None = None
) -> DeliveryPipeline:
    """The usage route; the messages in `failing` fail once each, those in `outage` meet a
    lost connection (an outage) every time."""

    async def handler(ctx: HandlerContext, body: RecordUsage) -> None:
        message_id = ctx.envelope.message_id
        if message_id in (outage or set()):
            raise ConnectionResetError("the rating engine's connection was reset (injected)")
        if message_id in failing:
            failing.discard(message_id)
            raise RuntimeError("refused once (injected)")
        await usage_record.handle(ctx, body)

    policy = RetryPolicy(max_attempts=5, backoff=lambda _: 60.0)
    return DeliveryPipeline(pool, USAGE_RECORD, handler, policy, max_body_bytes=2**20)


async def poll(process: DeliveryPipeline) -> int:
    process._polled_at = -1e9
    return await process.drain_parked()


async def broken(pool: asyncpg.Pool) -> dict[str, int]:
    async with pool.acquire() as conn:
        results = await invariants.run_all(conn, graces=NO_GRACE)
    return {r.check: r.violations for r in results if not r.ok}


async def test_a_blocker_that_comes_twice_in_one_batch_drains_what_it_held_back(
    pool: asyncpg.Pool,
) -> None:
    # [M1 fails, M2 waits behind it, M1 again (a resend) is applied]: M2 must not be left
    # parked behind a hold that no row records.
    user, m1, m2 = uuid4(), uuid4(), uuid4()
    process = pipeline(pool, {m1})
    batch = [usage(user, m1, 1), usage(user, m2, 2), usage(user, m1, 1)]
    fates = [r.fate for r in await process.process_batch(batch)]
    assert fates == [Fate.RETRIED, Fate.PARKED, Fate.ACKED]
    assert await fetch(pool, "SELECT * FROM telecom.parked") == []
    assert await fetch(pool, "SELECT * FROM telecom.holds") == []
    (billed,) = await fetch(
        pool, "SELECT unbilled_upload FROM telecom.queue_users WHERE user_id = $1", user
    )
    assert billed["unbilled_upload"] == 3
    assert await broken(pool) == {}


async def test_a_lifted_hold_with_nothing_behind_it_is_dropped_and_never_starves_the_poll(
    pool: asyncpg.Pool,
) -> None:
    # 120 holds lifted (a discard, a group cancel, an expired retry) with nothing parked, older
    # than a real release: the poll drops them and still reaches the real one.
    async with pool.acquire() as conn:
        stale = [holds.NewHold(uuid4(), None, "releasing") for _ in range(120)]
        await holds.hold_many(conn, USAGE_RECORD.short_name, stale)
        await conn.execute("UPDATE telecom.holds SET updated_at = now() - interval '1 hour'")
    user, m1, m2 = uuid4(), uuid4(), uuid4()
    process = pipeline(pool, {m1})
    assert await process(usage(user, m1, 1)) == Fate.RETRIED
    assert await process(usage(user, m2, 2)) == Fate.PARKED
    await fetch(
        pool,
        "UPDATE telecom.holds SET blocker = NULL, state = 'releasing' WHERE user_id = $1 "
        "RETURNING 1",
        user,
    )
    await poll(process)
    await poll(process)
    assert await fetch(pool, "SELECT * FROM telecom.parked") == []
    assert await fetch(pool, "SELECT * FROM telecom.holds") == []


async def test_a_drain_that_fails_for_one_user_still_drains_the_others(
    pool: asyncpg.Pool,
) -> None:
    u1, u2, a1, a2, p1, p2 = (uuid4() for _ in range(6))
    process = pipeline(pool, {a1, a2}, outage={p1})
    assert [r.fate for r in await process.process_batch([usage(u1, a1, 1), usage(u2, a2, 1)])] == [
        Fate.RETRIED,
        Fate.RETRIED,
    ]
    assert await process(usage(u1, p1, 2)) == Fate.PARKED
    assert await process(usage(u2, p2, 4)) == Fate.PARKED
    await fetch(pool, "UPDATE telecom.holds SET blocker = NULL, state = 'releasing' RETURNING 1")
    await poll(process)
    parked = await fetch(pool, "SELECT sent_as FROM telecom.parked")
    assert [r["sent_as"] for r in parked] == [p1]  # u1 waits for its outage; u2 went on
    held = await fetch(pool, "SELECT user_id FROM telecom.holds")
    assert [r["user_id"] for r in held] == [u1]
