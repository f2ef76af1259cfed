"""Headers are data, not trust: hostile headers on an inbound route and as broker dead letters,
and forged attempt counts, against the real Postgres and RabbitMQ.

Whatever a publisher puts in its headers (tables 600 deep, 100 KiB strings, numbers or tables
where text is expected, forged x-pkgq-dead-* next to a known message_id, forged x-attempt), every
message is filed or applied, every consumer keeps consuming, and no stored body changes.
"""

from __future__ import annotations

import hashlib
from datetime import UTC, datetime, timedelta
from uuid import UUID, uuid4

import aio_pika
import asyncpg
import pytest
from aio_pika.abc import AbstractRobustConnection

from consumers import ingest
from consumers.delivery import DeliveryPipeline
from consumers.handlers import usage_record
from consumers.retry_policy import RetryPolicy
from consumers.unit_of_work import HandlerContext
from events.decoding import RawDelivery
from events.envelope import (
    H_ATTEMPT,
    H_PUBLISHER,
    H_SCHEMA_VERSION,
    H_USER_ID,
)
from events.models import RecordUsage
from events.routes import USAGE_RECORD
from infra.postgres import dead_letters, outbox, replay
from infra.settings import Settings
from tests.support.deliveries import send_raw
from tests.support.hostile import hostile_variants
from tests.support.in_process import InProcess
from tests.support.keys import attempts_counted, hold
from tests.support.observing import eventually, fetch
from tests.support.processes import cli


async def stored_bodies(pool: asyncpg.Pool) -> dict[int, bytes]:
    rows = await fetch(pool, "SELECT id, body FROM telecom.dead_letters")
    return {r["id"]: bytes(r["body"]) for r in rows}


def usage_body(user: UUID, upload: int) -> bytes:
    return RecordUsage(user_id=user, upload=upload, download=0).model_dump_json().encode()


def recording_pipeline(
    pool: asyncpg.Pool, policy: RetryPolicy, *, always_fail: bool = False
) -> tuple[DeliveryPipeline, list[UUID]]:
    """The usage_record route with the real handler (or one that always fails), and a log of
    the users each call was for."""
    calls: list[UUID] = []

    async def handler(ctx: HandlerContext, body: RecordUsage) -> None:
        calls.append(body.user_id)
        if always_fail:
            raise RuntimeError("the rating engine is down")
        await usage_record.handle(ctx, body)

    return DeliveryPipeline(pool, USAGE_RECORD, handler, policy, max_body_bytes=2**20), calls


async def bury_one_first(
    settings: Settings, amqp: AbstractRobustConnection, pool: asyncpg.Pool
) -> tuple[str, bytes]:
    """A dead letter in the store, whose message_id the attacker knows."""
    original = b'{"not": "json'
    known = await send_raw(settings, amqp, USAGE_RECORD, original)
    assert known is not None

    async def filed() -> bool:
        return bool(
            await fetch(pool, "SELECT 1 FROM telecom.dead_letters WHERE message_id = $1", known)
        )

    await eventually(filed, within=10)
    return known, original


async def test_hostile_headers_on_an_inbound_route_are_filed_or_applied_and_overwrite_no_letter(
    settings: Settings, pool: asyncpg.Pool, amqp: AbstractRobustConnection, app: InProcess
) -> None:
    pipeline, calls = recording_pipeline(pool, RetryPolicy(max_attempts=2, backoff=lambda _: 0.1))
    await app.start_consumers([USAGE_RECORD], pipelines={USAGE_RECORD.name: pipeline}, ingest=True)
    known, original = await bury_one_first(settings, amqp, pool)
    before = await stored_bodies(pool)

    users: list[UUID] = []
    forged: set[bytes] = set()
    for k, variant in enumerate(hostile_variants()):
        headers = {H_SCHEMA_VERSION: USAGE_RECORD.schema_version, **variant}
        # The known message_id with another body (bad input: buried again under its key) ...
        forged.add(b"forged body %d" % k)
        await send_raw(
            settings, amqp, USAGE_RECORD, b"forged body %d" % k, message_id=known, headers=headers
        )
        # ... and a fresh message with a valid body, each for a user of its own.
        users.append(uuid4())
        mid = await send_raw(
            settings, amqp, USAGE_RECORD, usage_body(users[-1], k + 1), headers=headers
        )
        assert mid is not None
    honest = uuid4()
    await send_raw(settings, amqp, USAGE_RECORD, usage_body(honest, 99))

    async def honest_applied() -> bool:
        return honest in calls

    await eventually(honest_applied, within=10)  # the consumer goes on

    async def all_accounted_for() -> bool:  # each fresh message applied or filed, by its user
        rows = await fetch(
            pool,
            """
            SELECT user_id FROM telecom.inbox WHERE user_id = ANY($1::uuid[])
            UNION SELECT user_id FROM telecom.dead_letters WHERE user_id = ANY($1::uuid[])
            """,
            users,
        )
        return len(rows) == len(users)

    await eventually(all_accounted_for, within=10)
    after = await stored_bodies(pool)
    assert {i: after[i] for i in before} == before  # no stored body changed
    first, *others = await fetch(
        pool, "SELECT body FROM telecom.dead_letters WHERE message_id = $1 ORDER BY id", known
    )
    assert bytes(first["body"]) == original
    # the forged bodies under its message_id are letters of their own, not stored over it
    assert {bytes(r["body"]) for r in others} == forged
    assert app.tasks
    assert not any(t.done() for t in app.tasks)


async def test_hostile_broker_dead_letters_are_all_filed_with_an_honest_one_behind_them(
    settings: Settings, pool: asyncpg.Pool, amqp: AbstractRobustConnection, app: InProcess
) -> None:
    await app.start_consumers([USAGE_RECORD], ingest=True)
    known, original = await bury_one_first(settings, amqp, pool)
    before = await stored_bodies(pool)
    channel = await amqp.channel()
    probe = f"{settings.queue_prefix}.expiring_usage"
    try:
        # Usage records nobody takes in time: the broker dead-letters them, headers and all.
        await channel.declare_queue(
            probe,
            durable=True,
            arguments={
                "x-message-ttl": 20,
                "x-dead-letter-exchange": settings.dlx,
                "x-dead-letter-routing-key": USAGE_RECORD.name,
            },
        )
        variants = hostile_variants(inbound=False)
        hostile = [variants[k % len(variants)] for k in range(40)]
        for k, variant in enumerate(hostile):
            await channel.default_exchange.publish(
                aio_pika.Message(
                    b"forged body %d" % k,
                    message_id=known,
                    type=USAGE_RECORD.message_type,
                    headers={
                        H_SCHEMA_VERSION: USAGE_RECORD.schema_version,
                        "x-index": k,
                        **variant,
                    },
                ),
                routing_key=probe,
            )
        honest_id = str(uuid4())
        honest_body = usage_body(uuid4(), 7)
        await channel.default_exchange.publish(
            aio_pika.Message(
                honest_body,
                message_id=honest_id,
                type=USAGE_RECORD.message_type,
                content_type="application/json",
                headers={H_SCHEMA_VERSION: USAGE_RECORD.schema_version},
            ),
            routing_key=probe,
        )

        async def all_filed() -> bool:
            rows = await fetch(
                pool,
                "SELECT count(*) AS n FROM telecom.dead_letters WHERE error_location = $1",
                f"queue {probe}",
            )
            return int(rows[0]["n"]) == 41

        await eventually(all_filed, within=10)
        (honest,) = await fetch(
            pool,
            "SELECT *, status::text AS status FROM telecom.dead_letters WHERE message_id = $1",
            honest_id,
        )
        assert (honest["source"], honest["reason"]) == ("broker", "expired")
        assert bytes(honest["body"]) == honest_body
        after = await stored_bodies(pool)
        assert {i: after[i] for i in before} == before  # the known one kept its body
        assert after[next(iter(before))] == original
        forged = await fetch(
            pool,
            "SELECT source FROM telecom.dead_letters WHERE message_id = $1 AND id <> $2",
            known,
            next(iter(before)),
        )
        assert {r["source"] for r in forged} == {"broker"}  # no forged x-pkgq-dead-* believed
        # Every consumer keeps consuming: a usage record after all of it is still applied.
        user = uuid4()
        await send_raw(settings, amqp, USAGE_RECORD, usage_body(user, 3))

        async def applied() -> bool:
            rows = await fetch(
                pool, "SELECT unbilled_upload FROM telecom.queue_users WHERE user_id = $1", user
            )
            return bool(rows) and rows[0]["unbilled_upload"] == 3

        await eventually(applied, within=10)
    finally:
        await channel.queue_delete(probe)
        await channel.close()


@pytest.mark.parametrize("forged", [-(10**6), 0, 1, 2, 3, 25, 10**12])
async def test_a_forged_x_attempt_neither_skips_nor_multiplies_retries(
    forged: int,
    settings: Settings,
    pool: asyncpg.Pool,
    amqp: AbstractRobustConnection,
    app: InProcess,
) -> None:
    policy = RetryPolicy(max_attempts=3, backoff=lambda _: 0.05)
    pipeline, calls = recording_pipeline(pool, policy, always_fail=True)
    await app.start_consumers([USAGE_RECORD], pipelines={USAGE_RECORD.name: pipeline})
    user = uuid4()
    mid = await send_raw(
        settings,
        amqp,
        USAGE_RECORD,
        usage_body(user, 1),
        headers={
            H_SCHEMA_VERSION: USAGE_RECORD.schema_version,
            H_USER_ID: str(user),
            H_ATTEMPT: forged,
        },
    )

    async def buried() -> bool:
        return bool(
            await fetch(
                pool,
                "SELECT 1 FROM telecom.dead_letters WHERE message_id = $1 AND status = 'buried'",
                mid,
            )
        )

    await eventually(buried, within=20)
    (dead,) = await fetch(pool, "SELECT * FROM telecom.dead_letters WHERE message_id = $1", mid)
    assert (dead["reason"], dead["attempts"]) == ("max_attempts", policy.max_attempts)
    assert calls.count(user) == policy.max_attempts
    counted = await attempts_counted(pool, USAGE_RECORD.short_name, dead["message_key"])
    assert counted == policy.max_attempts


async def test_a_dead_letter_body_over_64_kib_keeps_its_head_size_and_sha256(
    settings: Settings, pool: asyncpg.Pool
) -> None:
    body = bytes(range(256)) * 1024  # 256 KiB
    async with pool.acquire() as conn:
        dead_id = await dead_letters.bury(
            conn,
            dead_letters.NewDeadLetter(
                source="broker",
                route=USAGE_RECORD.name,
                consumer="usage_record",
                message_id=str(uuid4()),
                user_id=None,
                message_type=None,
                content_type=None,
                body=body,
                headers={},
                reason="expired",
                error_type="BrokerDeadLetter",
                error_message="expired",
            ),
        )
        row = await conn.fetchrow(
            "SELECT body, body_size, body_sha256 FROM telecom.dead_letters WHERE id = $1", dead_id
        )
        assert row is not None
        assert bytes(row["body"]) == body[: 64 * 1024]
        assert row["body_size"] == len(body)
        assert row["body_sha256"] == hashlib.sha256(body).hexdigest()
        async with conn.transaction():
            (result,) = await replay.replay(conn, [dead_id], "test", pkgq_user=settings.amqp_user)
        assert not result.replayed  # a cut body is never sent on as if it were whole
        assert "first 65536 of its 262144 bytes" in result.detail
    shown = await cli(settings, "dlq", "show", str(dead_id))
    assert shown.returncode == 0, shown.stderr
    assert "262144" in shown.stdout
    assert hashlib.sha256(body).hexdigest() in shown.stdout


def expired_on_the_broker(message_id: UUID, marker: str) -> RawDelivery:
    return RawDelivery(
        body=marker.encode(),
        message_id=str(message_id),
        message_type=USAGE_RECORD.message_type,
        content_type="application/json",
        timestamp=None,
        headers={"x-death": [{"reason": "expired", "queue": "q", "count": 1}]},
        routing_key=USAGE_RECORD.name,
    )


async def test_only_pkgqs_own_expired_retry_releases_the_hold_its_message_id_blocks(
    pool: asyncpg.Pool,
) -> None:
    user, blocker = uuid4(), uuid4()
    publisher = "guest"  # who first published the message the hold waits on
    key = await hold(pool, "usage_record", user, blocker, "retrying", publisher=publisher)
    ingester = ingest.make_ingester(pool)
    # Anyone can publish a message with the blocker's id that expires on the broker.
    await ingester([expired_on_the_broker(blocker, "forged")])
    held = await fetch(pool, "SELECT blocker FROM telecom.holds WHERE user_id = $1", user)
    assert held == [{"blocker": blocker}]
    # pkgq's own retry of it, sent with a TTL that ran out: it will never come.
    async with pool.acquire() as conn:
        await outbox.enqueue(
            conn,
            [
                outbox.OutboxMessage(
                    route=USAGE_RECORD.name,
                    message_type=USAGE_RECORD.message_type,
                    schema_version=1,
                    body=usage_body(user, 1),
                    user_id=user,
                    message_id=blocker,
                    headers={H_ATTEMPT: 2, H_PUBLISHER: publisher},
                    expires_at=datetime.now(UTC) - timedelta(seconds=1),
                    cancel_key=outbox.retry_key("usage_record", key),
                    dedup_key=f"retry:usage_record:{blocker}:0:2",
                )
            ],
        )
    await ingester([expired_on_the_broker(blocker, "honest")])
    held = await fetch(pool, "SELECT blocker, state FROM telecom.holds WHERE user_id = $1", user)
    assert held == [{"blocker": None, "state": "releasing"}]
