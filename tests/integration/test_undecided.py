"""A delivery whose failure cannot even be recorded (here: a retry policy whose next attempt
lies beyond any date, so deciding its failure raises every time) is UNDECIDED: the consumer
files a confirmed copy through its last resort, and the rest of its batch keeps what was
decided and committed, never decided a second time. Against the real Postgres and RabbitMQ.
"""

from __future__ import annotations

from uuid import uuid4

import asyncpg
from aio_pika.abc import AbstractRobustConnection

from consumers.delivery import DeliveryPipeline
from consumers.handlers import usage_record
from consumers.retry_policy import RetryPolicy
from consumers.unit_of_work import HandlerContext
from domain.delivery import Fate
from events.models import RecordUsage
from events.routes import USAGE_RECORD
from infra.settings import Settings
from tests.support.deliveries import raw_for, send
from tests.support.in_process import InProcess
from tests.support.observing import eventually, fetch

BEYOND_ANY_DATE = RetryPolicy(max_attempts=5, backoff=lambda _: 1e15, max_delay_s=1e15)


async def _refuses_13(ctx: HandlerContext, body: RecordUsage) -> None:
    if body.upload == 13:
        raise RuntimeError("the rating engine is down")
    await usage_record.handle(ctx, body)


def pipeline(pool: asyncpg.Pool) -> DeliveryPipeline:
    return DeliveryPipeline(pool, USAGE_RECORD, _refuses_13, BEYOND_ANY_DATE, max_body_bytes=2**20)


async def test_an_undecided_delivery_leaves_its_batchs_committed_decisions_as_they_are(
    pool: asyncpg.Pool,
) -> None:
    users = [uuid4() for _ in range(3)]
    batch = [
        raw_for(USAGE_RECORD, RecordUsage(user_id=u, upload=up, download=0))
        for u, up in zip(users, (1, 13, 2), strict=True)
    ]
    results = await pipeline(pool).process_batch(batch)
    assert [r.fate for r in results] == [Fate.ACKED, Fate.UNDECIDED, Fate.ACKED]
    assert results[1].error is not None
    assert "OverflowError" in results[1].error
    billed = await fetch(
        pool,
        "SELECT user_id, unbilled_upload FROM telecom.queue_users WHERE user_id = ANY($1)",
        users,
    )
    assert {r["user_id"]: r["unbilled_upload"] for r in billed} == {users[0]: 1, users[2]: 2}
    # nothing of the undecided one was written: no attempt, no hold, no retry
    assert await fetch(pool, "SELECT * FROM telecom.attempts") == []
    assert await fetch(pool, "SELECT * FROM telecom.holds") == []


async def test_the_consumer_files_an_undecided_delivery_through_its_last_resort(
    settings: Settings,
    pool: asyncpg.Pool,
    amqp: AbstractRobustConnection,
    app: InProcess,
) -> None:
    await app.start_consumers(
        [USAGE_RECORD], pipelines={USAGE_RECORD.name: pipeline(pool)}, ingest=True
    )
    good, doomed = uuid4(), uuid4()
    await send(settings, amqp, USAGE_RECORD, RecordUsage(user_id=good, upload=1, download=0))
    mid = await send(
        settings, amqp, USAGE_RECORD, RecordUsage(user_id=doomed, upload=13, download=0)
    )
    await send(settings, amqp, USAGE_RECORD, RecordUsage(user_id=good, upload=2, download=0))

    async def filed() -> bool:
        rows = await fetch(
            pool, "SELECT reason FROM telecom.dead_letters WHERE message_id = $1", str(mid)
        )
        return [r["reason"] for r in rows] == ["handler_error"]

    async def applied() -> bool:
        rows = await fetch(
            pool, "SELECT unbilled_upload FROM telecom.queue_users WHERE user_id = $1", good
        )
        return bool(rows) and rows[0]["unbilled_upload"] == 3

    await eventually(filed, within=20)
    await eventually(applied, within=20)
