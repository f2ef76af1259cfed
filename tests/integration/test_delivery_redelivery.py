"""The failure path under redelivery: the broker delivers again whatever was not acked, so every
step of consumers/delivery/ must be safe to run twice. These call the route's processor
directly with the same delivery twice, as a redelivery after a crash between commit and ack
would, against the test's own Postgres database.
"""

from __future__ import annotations

from uuid import UUID, uuid4

import asyncpg

from consumers.retry_policy import RetryPolicy
from domain.delivery import Fate
from infra.postgres import outbox
from tests.integration.usage_route import Switchable, delivery, outcomes_of, pipeline
from tests.support.keys import attempts_counted, delivery_key
from tests.support.observing import fetch


async def test_a_failure_delivered_again_after_its_commit_counts_twice_and_keeps_one_retry_pending(
    pool: asyncpg.Pool,
) -> None:
    """Attempts are counted in Postgres only: the redelivered copy (a crash between commit and
    ack) is one more failure, and its retry replaces the first one, never adds to it."""
    user = uuid4()
    process = pipeline(pool, Switchable(1), RetryPolicy(max_attempts=5, backoff=lambda _: 60.0))
    first = delivery(user, 1)
    assert await process(first) == Fate.RETRIED
    assert await process(first) == Fate.RETRIED  # the redelivery

    retries = await fetch(
        pool,
        "SELECT cancel_key, headers->'x-attempt' AS attempt FROM telecom.outbox "
        "WHERE message_id = $1",
        UUID(first.message_id),
    )
    key = outbox.retry_key("usage_record", delivery_key(first, user))
    assert [(r["cancel_key"], int(r["attempt"])) for r in retries] == [(key, 3)]
    assert await attempts_counted(pool, "usage_record", delivery_key(first, user)) == 2
    holds = await fetch(pool, "SELECT blocker, state FROM telecom.holds WHERE user_id = $1", user)
    assert [(r["blocker"], r["state"]) for r in holds] == [(UUID(first.message_id), "retrying")]


async def test_a_buried_message_delivered_again_updates_its_dead_letter_instead_of_adding_one(
    pool: asyncpg.Pool,
) -> None:
    process = pipeline(pool, Switchable(1), RetryPolicy(max_attempts=1))
    poison = delivery(uuid4(), 1)
    assert await process(poison) == Fate.DEAD_LETTERED
    assert await process(poison) == Fate.DEAD_LETTERED
    dead = await fetch(pool, "SELECT message_id, status::text FROM telecom.dead_letters")
    assert [(r["message_id"], r["status"]) for r in dead] == [(poison.message_id, "buried")]


async def test_a_parked_message_delivered_twice_is_parked_once_and_applied_once_in_order(
    pool: asyncpg.Pool,
) -> None:
    user = uuid4()
    handler = Switchable(1)
    process = pipeline(pool, handler, RetryPolicy(max_attempts=5, backoff=lambda _: 60.0))
    m1 = delivery(user, 1)
    m2 = delivery(user, 2)
    m3 = delivery(user, 3)
    assert await process(m1) == Fate.RETRIED
    assert await process(m2) == Fate.PARKED
    assert await process(m2) == Fate.PARKED  # redelivered: keeps its first place
    assert await process(m3) == Fate.PARKED
    parked = await fetch(pool, "SELECT body FROM telecom.parked ORDER BY id")
    assert [r["body"] for r in parked] == [m2.body, m3.body]

    handler.failing.clear()  # the cause goes away; the retry arrives
    retry = delivery(user, 1, message_id=UUID(m1.message_id), attempt=2)
    assert await process(retry) == Fate.ACKED
    assert handler.applied == [1, 2, 3]  # released in order, right after the blocker
    assert await process(m2) == Fate.DUPLICATE  # a late redelivery applies nothing
    assert await process(retry) == Fate.DUPLICATE
    assert handler.applied == [1, 2, 3]
    assert await fetch(pool, "SELECT * FROM telecom.holds") == []
    assert await fetch(pool, "SELECT * FROM telecom.parked") == []


async def test_a_stale_earlier_attempt_of_the_blocker_arriving_after_its_retry_applies_nothing(
    pool: asyncpg.Pool,
) -> None:
    user = uuid4()
    handler = Switchable(1)
    process = pipeline(pool, handler, RetryPolicy(max_attempts=5, backoff=lambda _: 60.0))
    m1 = delivery(user, 1)
    assert await process(m1) == Fate.RETRIED
    handler.failing.clear()
    retry = delivery(user, 1, message_id=UUID(m1.message_id), attempt=2)
    assert await process(retry) == Fate.ACKED
    assert await process(m1) == Fate.DUPLICATE  # attempt 1 redelivered late
    assert handler.applied == [1]


async def test_a_release_cut_short_by_a_crash_is_finished_by_the_release_poll(
    pool: asyncpg.Pool,
) -> None:
    user = uuid4()
    handler = Switchable(1)
    process = pipeline(pool, handler, RetryPolicy(max_attempts=1))
    m1 = delivery(user, 1)
    assert await process(m1) == Fate.DEAD_LETTERED
    assert await process(delivery(user, 2)) == Fate.PARKED
    assert await process(delivery(user, 3)) == Fate.PARKED
    # What `pkgq dlq discard` commits, with the consumer gone before it could apply anything.
    async with pool.acquire() as conn:
        await conn.execute("UPDATE telecom.holds SET blocker = NULL, state = 'releasing'")

    assert await process.drain_parked() == 2
    assert handler.applied == [2, 3]
    assert await fetch(pool, "SELECT * FROM telecom.holds") == []


async def test_two_copies_of_a_failing_message_in_one_batch_keep_the_user_held_behind_it(
    pool: asyncpg.Pool,
) -> None:
    # The relay re-published M (a crash after the confirm, before marking it): two copies sit
    # next to each other and land in one batch with the user's next message N.
    user = uuid4()
    handler = Switchable(1)
    process = pipeline(pool, handler, RetryPolicy(max_attempts=5, backoff=lambda _: 60.0))
    m, n = delivery(user, 1), delivery(user, 2)
    outcomes = outcomes_of(await process.process_batch([m, m, n]))
    assert outcomes == [Fate.RETRIED, Fate.RETRIED, Fate.PARKED]
    assert handler.applied == []  # N waits for M's retry
    holds = await fetch(pool, "SELECT blocker, state FROM telecom.holds WHERE user_id = $1", user)
    assert [(h["blocker"], h["state"]) for h in holds] == [(UUID(m.message_id), "retrying")]


async def test_a_redelivered_attempt_batched_with_its_own_retry_counts_each_and_keeps_one_retry(
    pool: asyncpg.Pool,
) -> None:
    # Attempt 1 failed and its retry was committed, but the ack was lost; by the time attempt 1
    # is redelivered, attempt 2 is queued right behind it: one batch [a1, a2, N].
    user = uuid4()
    handler = Switchable(1)
    process = pipeline(pool, handler, RetryPolicy(max_attempts=5, backoff=lambda _: 0.0))
    mid = uuid4()
    a1 = delivery(user, 1, message_id=mid, attempt=1)
    a2 = delivery(user, 1, message_id=mid, attempt=2)
    n = delivery(user, 2)
    assert outcomes_of(await process.process_batch([a1])) == [Fate.RETRIED]
    outcomes = outcomes_of(await process.process_batch([a1, a2, n]))
    assert outcomes == [Fate.RETRIED, Fate.RETRIED, Fate.PARKED]
    # Each copy's failure counts (3 in all); one retry is pending, the next attempt's.
    retries = await fetch(
        pool,
        "SELECT headers->'x-attempt' AS attempt FROM telecom.outbox WHERE message_id = $1",
        mid,
    )
    assert [int(r["attempt"]) for r in retries] == [4]
    assert await attempts_counted(pool, "usage_record", delivery_key(a1, user)) == 3
    assert handler.applied == []
