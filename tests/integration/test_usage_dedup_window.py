"""How long a billing record id is remembered: PKGQ_USAGE_DEDUP_DAYS from when it was billed,
then retention forgets it (and only then); a record that failed is not remembered. Against the
test's own database, through the usage route's pipeline."""

from __future__ import annotations

import json
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
from infra.postgres import retention
from tests.support.observing import fetch


def record(user: UUID, usage_id: str, upload: int) -> RawDelivery:
    body = {"user_id": str(user), "upload": upload, "download": 0, "usage_id": usage_id}
    return RawDelivery(
        body=json.dumps(body).encode(),
        message_id=str(uuid4()),
        message_type=USAGE_RECORD.message_type,
        content_type=CONTENT_TYPE,
        timestamp=None,
        headers={H_SCHEMA_VERSION: 2, H_USER_ID: str(user)},
    )


def pipeline(pool: asyncpg.Pool, days: int) -> DeliveryPipeline:
    return DeliveryPipeline(
        pool,
        USAGE_RECORD,
        usage_record.handle,
        RetryPolicy(),
        max_body_bytes=2**20,
        usage_dedup_days=days,
    )


async def test_a_record_id_is_kept_for_the_configured_days_and_pruned_only_after_them(
    pool: asyncpg.Pool,
) -> None:
    user = uuid4()
    process = pipeline(pool, days=3)
    assert await process(record(user, "cdr-7", 5)) == Fate.ACKED
    (row,) = await fetch(
        pool,
        "SELECT keep_until - billed_at AS window FROM telecom.usage_billed WHERE user_id = $1",
        user,
    )
    assert row["window"].days == 3

    # Retention of an hour leaves it: its own window decides, not the retention.
    counts = await retention.prune(pool, 3600.0, batch_size=10)
    assert counts["usage_billed"] == 0
    assert await process(record(user, "cdr-7", 5)) == Fate.DUPLICATE_USAGE

    # Past its window, it is pruned, and a resend after that bills again.
    await fetch(
        pool,
        "UPDATE telecom.usage_billed SET keep_until = now() - interval '1 second' "
        "WHERE user_id = $1 RETURNING 1",
        user,
    )
    counts = await retention.prune(pool, 3600.0, batch_size=10)
    assert counts["usage_billed"] == 1
    assert await process(record(user, "cdr-7", 5)) == Fate.ACKED
    (billed,) = await fetch(
        pool, "SELECT unbilled_upload FROM telecom.queue_users WHERE user_id = $1", user
    )
    assert billed["unbilled_upload"] == 10


async def test_a_record_that_failed_is_not_remembered_and_its_resend_waits_then_bills_nothing(
    pool: asyncpg.Pool,
) -> None:
    # [A fails, B resends A's record id under another message_id] in one batch: A's billing is
    # rolled back with it, B waits behind A; A's retry bills, then B is a duplicate_usage.
    user = uuid4()
    first, resend = record(user, "cdr-9", 5), record(user, "cdr-9", 5)
    failing = {first.message_id}

    async def handler(ctx: HandlerContext, body: RecordUsage) -> None:
        if str(ctx.envelope.message_id) in failing:
            failing.discard(str(ctx.envelope.message_id))
            await usage_record.handle(ctx, body)  # billed in memory, then the failure
            raise RuntimeError("the rating engine refused it once (injected)")
        await usage_record.handle(ctx, body)

    process = DeliveryPipeline(
        pool, USAGE_RECORD, handler, RetryPolicy(backoff=lambda _: 60.0), max_body_bytes=2**20
    )
    assert [r.fate for r in await process.process_batch([first, resend])] == [
        Fate.RETRIED,
        Fate.PARKED,
    ]
    assert await fetch(pool, "SELECT * FROM telecom.usage_billed") == []
    assert await process(first) == Fate.ACKED  # its retry
    process._polled_at = -1e9
    await process.drain_parked()
    (row,) = await fetch(pool, "SELECT message_id FROM telecom.usage_billed")
    assert str(row["message_id"]) == first.message_id
    (billed,) = await fetch(
        pool, "SELECT unbilled_upload FROM telecom.queue_users WHERE user_id = $1", user
    )
    assert billed["unbilled_upload"] == 5
    (state,) = await fetch(
        pool,
        "SELECT count(*) AS n FROM telecom.inbox WHERE consumer = 'usage_record'",
    )
    assert state["n"] == 2  # both recorded as done: the resend as a duplicate_usage
