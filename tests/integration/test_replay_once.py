"""A replay applies a message once, for ever: a dead letter whose message its consumer applied
since it was buried (a resend) is `superseded`, in the statement that records the message in the
inbox, and is never replayed again, by the CLI or in bulk, forced or not, however long after
the inbox's retention forgot the message. Against the test's own Postgres database.
"""

from __future__ import annotations

import dataclasses
from uuid import UUID, uuid4

import asyncpg

from consumers import operations
from consumers.cli import exit_codes
from consumers.delivery import DeliveryPipeline
from consumers.handlers import usage_record
from consumers.retry_policy import RetryPolicy
from consumers.unit_of_work import HandlerContext
from domain.delivery import Fate
from events.envelope import H_USER_ID
from events.models import RecordUsage
from events.routes import USAGE_RECORD
from infra.postgres import replay
from infra.settings import Settings
from tests.support.dead_letters import buried
from tests.support.deliveries import raw_for
from tests.support.keys import applied
from tests.support.observing import fetch
from tests.support.processes import cli


async def _buried_then_applied_by_a_resend(pool: asyncpg.Pool) -> tuple[UUID, int, int]:
    """A usage record buried after its one attempt, then applied when it is sent again with
    the same message_id. Returns (its user, its dead letter's id, its upload)."""
    refusing = {"on": True}

    async def handler(ctx: HandlerContext, body: RecordUsage) -> None:
        if refusing["on"]:
            raise RuntimeError("the rating engine is down")
        await usage_record.handle(ctx, body)

    policy = RetryPolicy(max_attempts=1)
    pipeline = DeliveryPipeline(pool, USAGE_RECORD, handler, policy, max_body_bytes=2**20)
    user = uuid4()
    raw = raw_for(USAGE_RECORD, RecordUsage(user_id=user, upload=7, download=0))
    assert await pipeline(raw) == Fate.DEAD_LETTERED
    refusing["on"] = False
    assert await pipeline(raw) == Fate.ACKED  # the resend: the blocker's own copy goes
    (dead,) = await fetch(
        pool, "SELECT id, status::text FROM telecom.dead_letters WHERE user_id = $1", user
    )
    assert dead["status"] == "superseded"
    return user, dead["id"], 7


async def _billed(pool: asyncpg.Pool, user: UUID) -> int:
    (row,) = await fetch(
        pool, "SELECT unbilled_upload FROM telecom.queue_users WHERE user_id = $1", user
    )
    return int(row["unbilled_upload"])


async def test_a_dead_letter_applied_since_by_a_resend_is_never_replayed_after_inbox_retention(
    pool: asyncpg.Pool,
) -> None:
    user, dead_id, upload = await _buried_then_applied_by_a_resend(pool)
    await fetch(pool, "DELETE FROM telecom.inbox RETURNING 1")  # retention forgot it
    async with pool.acquire() as conn:
        bulk = await operations.replay_ids(conn, [dead_id], "ops-alice", pkgq_user="pkgq")
        async with conn.transaction():
            forced = await replay.replay(conn, [dead_id], "ops-bob", pkgq_user="pkgq", force=True)
    assert bulk.done == 0
    assert [r.detail for r in bulk.skipped] == [replay.SUPERSEDED]
    assert [(r.replayed, r.detail) for r in forced] == [(False, replay.SUPERSEDED)]
    assert await fetch(pool, "SELECT * FROM telecom.outbox WHERE user_id = $1", user) == []
    assert await _billed(pool, user) == upload  # once


async def test_the_cli_refuses_to_replay_or_dig_a_superseded_dead_letter_and_says_why(
    settings: Settings, pool: asyncpg.Pool
) -> None:
    user, dead_id, _ = await _buried_then_applied_by_a_resend(pool)
    replayed = await cli(settings, "dlq", "replay", "--id", str(dead_id))
    dug = await cli(settings, "dlq", "dig", str(dead_id), "--force")
    assert dug.returncode == exit_codes.FAILED, dug.stdout + dug.stderr
    assert "superseded" in dug.stdout
    assert "never replayed" in dug.stdout
    assert replayed.returncode == exit_codes.OK  # a buried-only filter: nothing matched
    assert await fetch(pool, "SELECT * FROM telecom.outbox WHERE user_id = $1", user) == []


async def test_a_dead_letter_filed_for_a_message_its_consumer_applied_already_is_superseded(
    pool: asyncpg.Pool,
) -> None:
    message_id, user = uuid4(), uuid4()
    async with pool.acquire() as conn:
        await applied(conn, "usage_record", message_id, user)
    late = await buried(
        pool,
        source="broker",
        reason="expired",
        message_id=str(message_id),
        user_id=user,
        body=b'{"a": 1}',
    )
    other = await buried(pool, source="broker", reason="expired", body=b'{"b": 2}')
    rows = await fetch(
        pool, "SELECT id, status::text FROM telecom.dead_letters WHERE id = ANY($1)", [late, other]
    )
    assert {r["id"]: r["status"] for r in rows} == {late: "superseded", other: "buried"}


async def _refusing_pipeline(pool: asyncpg.Pool, refusing: dict[str, bool]) -> DeliveryPipeline:
    async def handler(ctx: HandlerContext, body: RecordUsage) -> None:
        if refusing["on"]:
            raise RuntimeError("the rating engine is down")
        await usage_record.handle(ctx, body)

    return DeliveryPipeline(
        pool, USAGE_RECORD, handler, RetryPolicy(max_attempts=1), max_body_bytes=2**20
    )


async def test_a_replayed_dead_letter_once_applied_is_never_forced_again_and_a_discard_stands(
    pool: asyncpg.Pool,
) -> None:
    """Replayed and applied: after the inbox's retention a forced replay would send it again,
    and bill it twice; it is refused. Discarded, then sent again: the operator's discard stands
    (the same message is a duplicate of its discarded letter), before and after the retention."""
    refusing = {"on": True}
    pipeline = await _refusing_pipeline(pool, refusing)
    replayed_user, discarded_user = uuid4(), uuid4()
    raws = {
        u: raw_for(USAGE_RECORD, RecordUsage(user_id=u, upload=7, download=0))
        for u in (replayed_user, discarded_user)
    }
    for raw in raws.values():
        assert await pipeline(raw) == Fate.DEAD_LETTERED
    ids = {
        r["user_id"]: r["id"]
        for r in await fetch(pool, "SELECT id, user_id FROM telecom.dead_letters")
    }
    async with pool.acquire() as conn, conn.transaction():
        (sent,) = await replay.replay(conn, [ids[replayed_user]], "ops", pkgq_user="pkgq")
        assert sent.replayed
        await operations.discard_batch(conn, [ids[discarded_user]], "ops")
    refusing["on"] = False
    assert await pipeline(raws[replayed_user]) == Fate.ACKED  # the replay's copy
    assert await pipeline(raws[discarded_user]) == Fate.DUPLICATE  # the discard stands
    statuses = await fetch(pool, "SELECT user_id, status::text FROM telecom.dead_letters")
    assert {r["user_id"]: r["status"] for r in statuses} == {
        replayed_user: "superseded",
        discarded_user: "discarded",
    }
    await fetch(pool, "DELETE FROM telecom.inbox RETURNING 1")  # retention forgot them
    async with pool.acquire() as conn, conn.transaction():
        forced = await replay.replay(
            conn, [ids[replayed_user]], "ops", pkgq_user="pkgq", force=True
        )
    assert [(r.replayed, r.detail) for r in forced] == [(False, replay.SUPERSEDED)]
    assert await pipeline(raws[discarded_user]) == Fate.DUPLICATE  # still, after retention
    assert await _billed(pool, replayed_user) == 7
    assert await _billed(pool, discarded_user) == 0


async def test_another_users_message_under_the_same_id_supersedes_nothing_of_this_user(
    pool: asyncpg.Pool,
) -> None:
    refusing = {"on": True}
    pipeline = await _refusing_pipeline(pool, refusing)
    mine, theirs = uuid4(), uuid4()
    raw = raw_for(USAGE_RECORD, RecordUsage(user_id=mine, upload=7, download=0))
    assert await pipeline(raw) == Fate.DEAD_LETTERED
    refusing["on"] = False
    body = RecordUsage(user_id=theirs, upload=1, download=0).model_dump_json().encode()
    copy = dataclasses.replace(raw, body=body, headers={**raw.headers, H_USER_ID: str(theirs)})
    assert await pipeline(copy) == Fate.ACKED
    (dead,) = await fetch(
        pool, "SELECT status::text FROM telecom.dead_letters WHERE user_id = $1", mine
    )
    assert dead["status"] == "buried"  # still this user's to replay or discard
