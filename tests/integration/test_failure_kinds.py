"""Errors by kind, not by accident, against the real Postgres and RabbitMQ:

- a forged `x-attempt` (1, 2, 3) plays no part: a message whose first two attempts fail is
  applied on its third, once, with nothing left held;
- a data error Postgres refuses (the safety net behind the domain's own checks) is buried at
  once as `data_error`, holding its user as a buried message does, never retried through the
  backoff schedule, while its batch's neighbours commit;
- a blip that never clears is run again a bounded number of times (the pipeline's written worst
  case), then counts as the message's failure: retried later, the rest of the batch applied.
"""

from __future__ import annotations

import dataclasses
from uuid import UUID, uuid4

import asyncpg
import pytest
from aio_pika.abc import AbstractRobustConnection

from consumers.delivery import DeliveryPipeline
from consumers.delivery.pipeline import BLIP_RETRIES
from consumers.handlers import usage_record
from consumers.retry_policy import RetryPolicy
from consumers.unit_of_work import HandlerContext
from devtools.postgres.statements import StatementLog
from domain.delivery import Fate
from events.envelope import H_ATTEMPT, H_SCHEMA_VERSION, H_USER_ID
from events.models import RecordUsage
from events.routes import USAGE_RECORD
from infra.postgres.pool import create_pool
from infra.settings import Settings
from tests.support.deliveries import raw_for, send_raw
from tests.support.in_process import InProcess
from tests.support.observing import eventually, fetch


@pytest.mark.parametrize("forged", [1, 2, 3])
async def test_a_forged_x_attempt_neither_loses_nor_skips_the_retries_before_success(
    forged: int,
    settings: Settings,
    pool: asyncpg.Pool,
    amqp: AbstractRobustConnection,
    app: InProcess,
) -> None:
    calls: list[int] = []

    async def twice_refused(ctx: HandlerContext, body: RecordUsage) -> None:
        calls.append(body.upload)
        if len(calls) <= 2:
            raise RuntimeError("the rating engine is down")
        await usage_record.handle(ctx, body)

    policy = RetryPolicy(max_attempts=5, backoff=lambda _: 0.05)
    pipeline = DeliveryPipeline(pool, USAGE_RECORD, twice_refused, policy, max_body_bytes=2**20)
    await app.start_consumers([USAGE_RECORD], pipelines={USAGE_RECORD.name: pipeline})
    user = uuid4()
    body = RecordUsage(user_id=user, upload=7, download=0).model_dump_json().encode()
    headers = {
        H_SCHEMA_VERSION: USAGE_RECORD.schema_version,
        H_USER_ID: str(user),
        H_ATTEMPT: forged,
    }
    mid = await send_raw(settings, amqp, USAGE_RECORD, body, headers=headers)

    async def applied() -> bool:
        rows = await fetch(
            pool, "SELECT unbilled_upload FROM telecom.queue_users WHERE user_id = $1", user
        )
        return bool(rows) and rows[0]["unbilled_upload"] == 7

    await eventually(applied, within=20)
    assert calls == [7, 7, 7]  # two failures, then the success: nothing skipped, nothing lost
    (counted,) = await fetch(
        pool, "SELECT attempts FROM telecom.attempts WHERE sent_as = $1::uuid", mid
    )
    assert counted["attempts"] == 2
    assert await fetch(pool, "SELECT * FROM telecom.holds WHERE user_id = $1", user) == []
    assert await fetch(pool, "SELECT * FROM telecom.dead_letters") == []


async def _out_of_range(ctx: HandlerContext, body: RecordUsage) -> None:
    """A handler that slips a value past the domain's checks: the write-back is what fails
    (bigint out of range), as a bug in a handler or a domain rule missed would make it."""
    await usage_record.handle(ctx, body)
    if body.upload == 13:
        ctx.work.queue(body.user_id).queue.unbilled_upload = 2**63


async def test_a_data_error_postgres_refuses_is_buried_at_once_and_holds_its_user(
    pool: asyncpg.Pool,
) -> None:
    policy = RetryPolicy(max_attempts=25, backoff=lambda _: 60.0)
    pipeline = DeliveryPipeline(pool, USAGE_RECORD, _out_of_range, policy, max_body_bytes=2**20)
    good, doomed = uuid4(), uuid4()
    batch = [
        raw_for(USAGE_RECORD, RecordUsage(user_id=good, upload=1, download=0)),
        raw_for(USAGE_RECORD, RecordUsage(user_id=doomed, upload=13, download=0)),
        raw_for(USAGE_RECORD, RecordUsage(user_id=doomed, upload=2, download=0)),
        raw_for(USAGE_RECORD, RecordUsage(user_id=good, upload=4, download=0)),
    ]
    fates = [r.fate for r in await pipeline.process_batch(batch)]
    assert fates == [Fate.ACKED, Fate.DEAD_LETTERED, Fate.PARKED, Fate.ACKED]
    (dead,) = await fetch(
        pool,
        "SELECT reason, attempts, error_type FROM telecom.dead_letters WHERE user_id = $1",
        doomed,
    )
    assert (dead["reason"], dead["attempts"]) == ("data_error", 1)
    assert dead["error_type"] == "DataError"  # asyncpg refuses the value before sending it
    holds = await fetch(pool, "SELECT blocker, state FROM telecom.holds WHERE user_id = $1", doomed)
    assert [(h["blocker"], h["state"]) for h in holds] == [(UUID(batch[1].message_id), "buried")]
    # never scheduled again: no retry through the backoff schedule
    assert await fetch(pool, "SELECT * FROM telecom.outbox") == []
    (billed,) = await fetch(
        pool, "SELECT unbilled_upload FROM telecom.queue_users WHERE user_id = $1", good
    )
    assert billed["unbilled_upload"] == 5


async def test_a_blip_that_never_clears_is_tried_a_bounded_number_of_times_then_retried_later(
    settings: Settings,
) -> None:
    log = StatementLog()
    pool = await create_pool(settings.postgres_dsn, min_size=1, max_size=2, query_logger=log)
    runs: list[int] = []

    async def deadlocked(ctx: HandlerContext, body: RecordUsage) -> None:
        runs.append(body.upload)
        if body.upload == 13:
            raise asyncpg.exceptions.DeadlockDetectedError("deadlock detected (injected)")
        await usage_record.handle(ctx, body)

    try:
        policy = RetryPolicy(max_attempts=5, backoff=lambda _: 60.0)
        pipeline = DeliveryPipeline(pool, USAGE_RECORD, deadlocked, policy, max_body_bytes=2**20)
        size = 4
        batch = [
            raw_for(USAGE_RECORD, RecordUsage(user_id=uuid4(), upload=u, download=0))
            for u in (1, 13, 2, 3)
        ]
        await log.settled()
        log.clear()
        fates = [r.fate for r in await pipeline.process_batch(batch)]
        await log.settled()
        transactions = log.statements.count("BEGIN;")
    finally:
        await pool.close()
    assert fates == [Fate.ACKED, Fate.RETRIED, Fate.ACKED, Fate.ACKED]
    # The written worst case: (R + 1) * (1 + 2B) transactions for a batch of B.
    assert transactions <= (BLIP_RETRIES + 1) * (1 + 2 * size)
    # The blip was met (R + 1) times in the batch and (R + 1) times alone, then recorded.
    assert runs.count(13) == 2 * (BLIP_RETRIES + 1)


async def test_a_copy_of_its_message_id_for_another_user_never_withdraws_a_users_retry(
    pool: asyncpg.Pool,
) -> None:
    """A publisher who knows a message_id sends it again for another user, and that copy
    fails: the first user's pending retry stays, and so does its hold."""
    mine, theirs, mid = uuid4(), uuid4(), uuid4()

    async def refused(ctx: HandlerContext, body: RecordUsage) -> None:
        raise RuntimeError("the rating engine is down")

    policy = RetryPolicy(max_attempts=5, backoff=lambda _: 60.0)
    pipeline = DeliveryPipeline(pool, USAGE_RECORD, refused, policy, max_body_bytes=2**20)
    for user in (mine, theirs):
        raw = raw_for(USAGE_RECORD, RecordUsage(user_id=user, upload=1, download=0))
        assert await pipeline(dataclasses.replace(raw, message_id=str(mid))) == Fate.RETRIED
    pending = await fetch(
        pool,
        "SELECT user_id FROM telecom.outbox WHERE message_id = $1 AND published_at IS NULL",
        mid,
    )
    assert sorted(r["user_id"] for r in pending) == sorted([mine, theirs])
    held = await fetch(pool, "SELECT user_id, blocker FROM telecom.holds WHERE user_id = $1", mine)
    assert [(r["user_id"], r["blocker"]) for r in held] == [(mine, mid)]


async def test_a_handler_error_whose_text_postgres_cannot_store_is_still_retried(
    pool: asyncpg.Pool,
) -> None:
    async def refused(ctx: HandlerContext, body: RecordUsage) -> None:
        raise RuntimeError("the backend said a\x00b \ud800")

    policy = RetryPolicy(max_attempts=5, backoff=lambda _: 60.0)
    pipeline = DeliveryPipeline(pool, USAGE_RECORD, refused, policy, max_body_bytes=2**20)
    user = uuid4()
    assert (
        await pipeline(raw_for(USAGE_RECORD, RecordUsage(user_id=user, upload=1, download=0)))
        == Fate.RETRIED
    )
    (retry,) = await fetch(pool, "SELECT headers FROM telecom.outbox WHERE user_id = $1", user)
    assert "a\\0b" in retry["headers"]["x-pkgq-last-error"]
    (hold,) = await fetch(pool, "SELECT last_error FROM telecom.holds WHERE user_id = $1", user)
    assert "a\\0b" in hold["last_error"]
