"""The failure path against real Postgres and RabbitMQ: retries with backoff, the dead-letter
store (what pkgq buries, what the broker dead-letters, the last-resort copy), and per-user order
that survives a failure. Replays: test_dead_letter_replay.py.

The retry policy is injected (short, fixed delays), so no test waits for the default backoff's
minutes. Operator commands run as real `pkgq dlq …` processes.
"""

from __future__ import annotations

import json
from datetime import timedelta
from uuid import uuid4

import aio_pika
import asyncpg
from aio_pika.abc import AbstractRobustConnection

from consumers.retry_policy import RetryPolicy
from consumers.unit_of_work import HandlerContext
from events.models import RecordUsage
from events.routes import USAGE_RECORD
from infra.rabbit.publisher import Publisher, build_message
from infra.settings import Settings
from tests.integration.failure_helpers import (
    billed,
    dead_letter_of,
    no_holds_left,
    rows_of,
    until,
    usage,
    usage_pipeline,
)
from tests.support.in_process import InProcess
from tests.support.observing import eventually, fetch
from tests.support.processes import cli


async def test_a_handler_that_fails_twice_then_succeeds_is_applied_once_after_retries_at_the_policy_delays(  # noqa: E501
    fast: Settings, pool: asyncpg.Pool, amqp: AbstractRobustConnection, app: InProcess
) -> None:
    attempts_seen: list[int] = []

    def fail_twice(ctx: HandlerContext, _: RecordUsage) -> bool:
        attempts_seen.append(ctx.envelope.attempt)
        return len(attempts_seen) <= 2

    policy = RetryPolicy(max_attempts=5, backoff=lambda attempt: 0.25 * attempt)
    pipeline, applied = usage_pipeline(pool, policy, fail_twice)
    await app.start_consumers([USAGE_RECORD], pipelines={USAGE_RECORD.name: pipeline})
    user = uuid4()
    sent = await usage(fast, amqp, user, 7)

    await eventually(until(lambda: applied == [(user, 7)]), within=20)
    await billed(pool, user, 7)
    assert attempts_seen == [1, 2, 3]  # the attempt count travelled in the x-attempt header
    retries = await fetch(
        pool,
        "SELECT headers->>'x-attempt' AS attempt, available_at - created_at AS delay, dedup_key "
        "FROM telecom.outbox WHERE message_id = $1 ORDER BY id",
        sent,
    )
    # Each retry is due the policy's backoff after its failure was decided: that moment is
    # the batch's clock, read under the user's lock, a little after the row's transaction began.
    assert [r["attempt"] for r in retries] == ["2", "3"]
    for row, backoff in zip(retries, (0.25, 0.5), strict=True):  # backoff(1), backoff(2)
        assert timedelta(seconds=backoff) <= row["delay"] < timedelta(seconds=backoff + 1)
    (user_row,) = await fetch(
        pool, "SELECT unbilled_upload FROM telecom.queue_users WHERE user_id = $1", user
    )
    assert user_row["unbilled_upload"] == 7  # applied exactly once
    assert await fetch(pool, "SELECT * FROM telecom.dead_letters") == []
    await no_holds_left(pool)


async def test_a_poison_message_is_buried_after_the_maximum_attempts_with_its_full_error(
    fast: Settings, pool: asyncpg.Pool, amqp: AbstractRobustConnection, app: InProcess
) -> None:
    poison_user = uuid4()
    policy = RetryPolicy(max_attempts=3, backoff=lambda _: 0.1)
    pipeline, applied = usage_pipeline(pool, policy, lambda _, b: b.user_id == poison_user)
    await app.start_consumers([USAGE_RECORD], pipelines={USAGE_RECORD.name: pipeline})
    sent = await usage(fast, amqp, poison_user, 3)

    dead = await dead_letter_of(pool, sent)
    assert dead["status"] == "buried"
    assert dead["reason"] == "max_attempts"
    assert dead["attempts"] == 3
    assert dead["error_type"] == "BillingRefusedError"
    assert dead["error_message"] == "rating plan for upload 3 is missing"
    assert dead["error_location"].startswith("tests/integration/failure_helpers.py:")
    assert dead["error_location"].endswith(" in refuse_billing")
    assert "refuse_billing" in dead["traceback"]
    assert "BillingRefusedError: rating plan for upload 3 is missing" in dead["traceback"]
    assert dead["first_failed_at"] < dead["last_failed_at"]  # first failure kept across retries
    assert dead["user_id"] == poison_user
    assert json.loads(bytes(dead["body"]))["upload"] == 3

    other = uuid4()
    await usage(fast, amqp, other, 4)
    await eventually(until(lambda: applied == [(other, 4)]))  # the route goes on

    listed = await cli(
        fast, "dlq", "list", "--json", "--route", USAGE_RECORD.name, "--error", "rating plan"
    )
    assert listed.returncode == 0, listed.stderr
    assert [r["message_id"] for r in json.loads(listed.stdout)] == [str(sent)]
    shown = await cli(fast, "dlq", "show", str(dead["id"]), "--json")
    assert shown.returncode == 0, shown.stderr
    detail = json.loads(shown.stdout)
    assert detail["body"]["upload"] == 3
    assert "refuse_billing" in detail["traceback"]
    grouped = await cli(fast, "dlq", "groups", "--json")
    assert grouped.returncode == 0, grouped.stderr
    (group,) = json.loads(grouped.stdout)
    assert (group["count"], group["error_type"]) == (1, "BillingRefusedError")
    assert group["error_location"] == dead["error_location"]


async def test_a_users_later_messages_wait_behind_a_buried_one_and_follow_it_in_order_after_dig(
    fast: Settings, pool: asyncpg.Pool, amqp: AbstractRobustConnection, app: InProcess
) -> None:
    a, b = uuid4(), uuid4()
    broken = True
    pipeline, applied = usage_pipeline(
        pool, RetryPolicy(max_attempts=1), lambda _, body: broken and body.upload == 1
    )
    await app.start_consumers([USAGE_RECORD], pipelines={USAGE_RECORD.name: pipeline})
    m1 = await usage(fast, amqp, a, 1)
    await usage(fast, amqp, b, 10)
    await usage(fast, amqp, a, 2)
    await usage(fast, amqp, b, 20)
    await usage(fast, amqp, a, 3)

    await eventually(until(lambda: [x for x in applied if x[0] == b] == [(b, 10), (b, 20)]))

    async def two_parked() -> bool:
        return len(await fetch(pool, "SELECT 1 FROM telecom.parked WHERE user_id = $1", a)) == 2

    await eventually(two_parked)
    assert [x for x in applied if x[0] == a] == []  # m2 and m3 did not overtake m1
    dead = await dead_letter_of(pool, m1)
    listed = await cli(fast, "dlq", "list", "--json")
    assert [(r["id"], r["held_back"]) for r in json.loads(listed.stdout)] == [(dead["id"], 2)]

    broken = False
    dug = await cli(fast, "dlq", "dig", str(dead["id"]))
    assert dug.returncode == 0, dug.stdout + dug.stderr
    await eventually(until(lambda: len([x for x in applied if x[0] == a]) == 3))
    assert [x for x in applied if x[0] == a] == [(a, 1), (a, 2), (a, 3)]
    await billed(pool, a, 6)
    await no_holds_left(pool)
    assert await fetch(pool, "SELECT * FROM telecom.parked") == []


async def test_a_users_later_messages_wait_for_a_retry_while_other_users_keep_flowing(
    fast: Settings, pool: asyncpg.Pool, amqp: AbstractRobustConnection, app: InProcess
) -> None:
    a, b = uuid4(), uuid4()
    failed: list[int] = []

    def first_try_of_m1_fails(ctx: HandlerContext, body: RecordUsage) -> bool:
        if body.upload == 1 and ctx.envelope.attempt == 1:
            failed.append(1)
            return True
        return False

    # 5 s: B's message must be applied before A's retry even when the machine is so busy
    # that one batch takes 2 s (seen once, 2026-11-27, with a 2 s backoff).
    policy = RetryPolicy(max_attempts=3, backoff=lambda _: 5.0)
    pipeline, applied = usage_pipeline(pool, policy, first_try_of_m1_fails)
    await app.start_consumers([USAGE_RECORD], pipelines={USAGE_RECORD.name: pipeline})
    await usage(fast, amqp, a, 1)
    await usage(fast, amqp, a, 2)
    await usage(fast, amqp, b, 10)
    await usage(fast, amqp, a, 3)

    await eventually(until(lambda: len(applied) == 4), within=20)
    assert failed == [1]
    assert applied.index((b, 10)) < applied.index((a, 1))  # B did not wait for A's retry
    assert [x for x in applied if x[0] == a] == [(a, 1), (a, 2), (a, 3)]
    await billed(pool, a, 6)
    await no_holds_left(pool)


async def test_discarding_a_buried_message_releases_the_ones_it_held_back_in_order(
    fast: Settings, pool: asyncpg.Pool, amqp: AbstractRobustConnection, app: InProcess
) -> None:
    a = uuid4()
    pipeline, applied = usage_pipeline(
        pool, RetryPolicy(max_attempts=1), lambda _, body: body.upload == 1
    )
    await app.start_consumers([USAGE_RECORD], pipelines={USAGE_RECORD.name: pipeline})
    m1 = await usage(fast, amqp, a, 1)
    await usage(fast, amqp, a, 2)
    await usage(fast, amqp, a, 3)
    dead = await dead_letter_of(pool, m1)

    async def two_parked() -> bool:
        return len(await fetch(pool, "SELECT 1 FROM telecom.parked")) == 2

    await eventually(two_parked)
    refused = await cli(fast, "dlq", "discard")
    assert refused.returncode != 0  # no ids and no filter: refuses to discard everything
    discarded = await cli(fast, "dlq", "discard", str(dead["id"]), "--by", "ops-bob", "--json")
    assert discarded.returncode == 0, discarded.stdout + discarded.stderr
    assert json.loads(discarded.stdout) == {"discarded": 1}

    await eventually(until(lambda: len(applied) == 2))
    assert applied == [(a, 2), (a, 3)]
    await billed(pool, a, 5)
    (row,) = await rows_of(pool, m1)
    assert (row["status"], row["discarded_by"]) == ("discarded", "ops-bob")

    purged = await cli(fast, "dlq", "purge", "--older-than", "0s", "--json", "--yes")
    assert purged.returncode == 0, purged.stderr
    assert json.loads(purged.stdout) == {"purged": 1}
    assert await rows_of(pool, m1) == []


async def test_a_message_the_broker_dead_letters_on_ttl_expiry_is_listed_with_the_brokers_reason_under_its_bodys_user(  # noqa: E501
    fast: Settings, pool: asyncpg.Pool, amqp: AbstractRobustConnection, app: InProcess
) -> None:
    """Filed under the user its body names, not the one its x-user-id header claims (anyone can
    set a header; the claim stays in its headers)."""
    await app.start_consumers([], ingest=True)
    channel = await amqp.channel()
    probe = f"{fast.queue_prefix}.ttl_probe"
    try:
        exchange = await channel.get_exchange(fast.exchange)
        queue = await channel.declare_queue(
            probe,
            durable=True,
            arguments={"x-message-ttl": 50, "x-dead-letter-exchange": fast.dlx},
        )
        await queue.bind(exchange, routing_key="telecom.ttl_probe")
        user, claimed = uuid4(), uuid4()
        await exchange.publish(
            aio_pika.Message(
                json.dumps({"user_id": str(user), "hello": "nobody reads me"}).encode(),
                message_id=str(uuid4()),
                headers={"x-user-id": str(claimed)},
            ),
            routing_key="telecom.ttl_probe",
        )

        async def stored() -> bool:
            return bool(await fetch(pool, "SELECT 1 FROM telecom.dead_letters"))

        await eventually(stored, within=15)
        listed = await cli(fast, "dlq", "list", "--json")
        assert listed.returncode == 0, listed.stderr
        (row,) = json.loads(listed.stdout)
        assert (row["source"], row["reason"], row["route"]) == (
            "broker",
            "expired",
            "telecom.ttl_probe",
        )
        assert probe in row["error_message"]
        assert row["user_id"] == str(user)
        (claim,) = await fetch(pool, "SELECT headers->>'x-user-id' AS u FROM telecom.dead_letters")
        assert claim["u"] == str(claimed)
    finally:
        await channel.queue_delete(probe)
        await channel.close()


async def test_a_last_resort_copy_on_the_dead_letter_exchange_is_filed_with_its_reason(
    fast: Settings, pool: asyncpg.Pool, amqp: AbstractRobustConnection, app: InProcess
) -> None:
    await app.start_consumers([], ingest=True)
    # As pkgq's last-resort path sends it: stamped with pkgq's AMQP user (broker-validated).
    publisher = await Publisher.open(amqp, fast.dlx, user_id=fast.amqp_user)
    message_id = uuid4()
    try:
        await publisher.publish(
            build_message(
                b'{"user_id": "x"}',
                message_id=message_id,
                message_type="RecordUsage",
                headers={
                    "x-pkgq-dead-reason": "handler_error",
                    "x-pkgq-dead-error": "KeyError: 'plan'",
                    "x-pkgq-dead-consumer": USAGE_RECORD.short_name,
                    "x-pkgq-dead-traceback": "Traceback ...\nKeyError: 'plan'",
                },
            ),
            USAGE_RECORD.name,
        )
    finally:
        await publisher.close()
    dead = await dead_letter_of(pool, message_id)
    assert (dead["source"], dead["reason"], dead["consumer"], dead["route"]) == (
        "consumer",
        "handler_error",
        USAGE_RECORD.short_name,
        USAGE_RECORD.name,
    )
    assert (dead["error_type"], dead["error_message"]) == ("KeyError", "'plan'")
