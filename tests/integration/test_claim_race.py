"""A message two transactions apply at once (a redelivery racing its first delivery on another
consumer): the inbox claim is the arbiter. The batch that finds the message claimed meanwhile
is rolled back and run again, and is then a duplicate: applied once, by the other side."""

from __future__ import annotations

import asyncio
from uuid import UUID, uuid4

import asyncpg

from consumers.delivery import DeliveryPipeline
from consumers.handlers import usage_record
from consumers.retry_policy import RetryPolicy
from domain.delivery import Fate
from events.decoding import RawDelivery
from events.models import RecordUsage
from events.routes import USAGE_RECORD
from infra.postgres import inbox
from tests.support.deliveries import raw_for
from tests.support.keys import delivery_key
from tests.support.observing import eventually, fetch


def _record(user: UUID, upload: int) -> RawDelivery:
    return raw_for(USAGE_RECORD, RecordUsage(user_id=user, upload=upload, download=0))


async def test_a_message_claimed_by_another_transaction_meanwhile_runs_again_as_a_duplicate(
    pool: asyncpg.Pool,
) -> None:
    user = uuid4()
    raw = _record(user, upload=5)
    process = DeliveryPipeline(
        pool, USAGE_RECORD, usage_record.handle, RetryPolicy(), max_body_bytes=2**20
    )
    async with pool.acquire() as rival:
        claim = rival.transaction()
        await claim.start()
        # Claimed by the rival, not yet committed: the batch's snapshot does not see it.
        assert await inbox.claim(
            rival, USAGE_RECORD.short_name, delivery_key(raw, user), UUID(raw.message_id), user
        )
        running = asyncio.create_task(process(raw))

        async def claim_waits() -> bool:
            rows = await fetch(
                pool,
                "SELECT 1 FROM pg_stat_activity WHERE datname = current_database() "
                "AND wait_event_type = 'Lock' AND query LIKE '%INSERT INTO telecom.inbox%'",
            )
            return bool(rows)

        await eventually(claim_waits, within=20)  # the batch's claim waits for the rival's
        await claim.commit()
        fate = await asyncio.wait_for(running, 30)

    assert fate == Fate.DUPLICATE
    (row,) = await fetch(
        pool, "SELECT unbilled_upload FROM telecom.queue_users WHERE user_id = $1", user
    )
    assert row["unbilled_upload"] == 0  # the handler's billing was rolled back with the batch
    # the rival's claim only (the user has no other message)
    claims = await fetch(pool, "SELECT count(*) AS n FROM telecom.inbox WHERE user_id = $1", user)
    assert claims == [{"n": 1}]
