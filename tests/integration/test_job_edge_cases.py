"""Where job-queue options meet the failure path: holds behind cancelled or expired messages,
TTLs that run out while a message waits, revived messages, paused routes."""

from __future__ import annotations

from typing import Any
from uuid import UUID, uuid4

import asyncpg
import pytest
from aio_pika.abc import AbstractRobustConnection

from events.envelope import H_ADDRESS, H_CLAIMED
from events.identity import message_key
from events.models import AdjustQuota
from events.routes import QUOTA_ADJUST, USAGE_RECORD
from infra.jobs import Jobs, end_message
from infra.postgres import dead_letters, outbox, replay
from infra.rabbit.publisher import Publisher, build_message
from infra.rabbit.tap import Tap
from infra.rabbit.topology import routing_key_for
from infra.settings import Settings
from tests.conformance.jobs_support import (
    FAIL_ALWAYS,
    FAIL_FIRST,
    Recorder,
    recording_pipeline,
    usage,
)
from tests.support.dead_letters import buried, consumer_dead_letter
from tests.support.in_process import InProcess, StartApp
from tests.support.observing import eventually, fetch


async def hold_of(pool: asyncpg.Pool, user: UUID) -> list[dict[str, Any]]:
    return await fetch(pool, "SELECT blocker, state FROM telecom.holds WHERE user_id = $1", user)


async def reason_of(pool: asyncpg.Pool, message_id: UUID) -> str | None:
    rows = await fetch(
        pool, "SELECT reason FROM telecom.dead_letters WHERE message_id = $1", str(message_id)
    )
    return rows[0]["reason"] if rows else None


@pytest.fixture
async def running(
    in_process: StartApp, fast: Settings, pool: asyncpg.Pool, amqp: AbstractRobustConnection
) -> tuple[InProcess, Recorder]:
    recorder = Recorder()
    app = in_process(fast, pool, amqp)
    await app.start_consumers(
        [USAGE_RECORD],
        pipelines={USAGE_RECORD.name: recording_pipeline(pool, recorder, retry_after=3600)},
    )
    await app.start_relay()
    return app, recorder


async def test_cancelling_a_group_frees_the_user_held_behind_a_member_waiting_for_its_retry(
    pool: asyncpg.Pool, running: tuple[InProcess, Recorder]
) -> None:
    _, recorder = running
    jobs = Jobs(pool)
    user = uuid4()
    group = await jobs.publish_group(USAGE_RECORD, [usage(user, FAIL_FIRST)], name="g")
    (member,) = group.message_ids

    async def held() -> bool:
        return [h["blocker"] for h in await hold_of(pool, user)] == [member]

    await eventually(held)  # the member failed once; its retry is an hour away
    later = await jobs.publish(USAGE_RECORD, usage(user, 5))

    async def parked() -> bool:
        rows = await fetch(pool, "SELECT sent_as FROM telecom.parked WHERE user_id = $1", user)
        return [r["sent_as"] for r in rows] == [later.message_id]

    await eventually(parked)
    result = await jobs.cancel_group(group.group_id, "test")
    assert result is not None
    assert result.withdrawn == 1  # the scheduled retry

    async def later_applied_and_committed() -> bool:
        # The recorder hears of a message inside its transaction; the hold goes with the commit.
        return later.message_id in recorder.applied and await hold_of(pool, user) == []

    await eventually(later_applied_and_committed)
    assert member not in recorder.applied


async def test_an_expired_retry_frees_its_user_instead_of_holding_it_for_ever(
    in_process: StartApp, settings: Settings, pool: asyncpg.Pool, amqp: AbstractRobustConnection
) -> None:
    user, blocker = uuid4(), uuid4()
    async with pool.acquire() as conn, conn.transaction():
        # A retry of `blocker` scheduled while its TTL ran out, and the hold it left.
        await conn.execute(
            "INSERT INTO telecom.holds (consumer, user_id, blocker, state) "
            "VALUES ('usage_record', $1, $2, 'retrying')",
            user,
            blocker,
        )
        await outbox.enqueue(
            conn,
            [
                outbox.OutboxMessage(
                    route=USAGE_RECORD.name,
                    message_type=USAGE_RECORD.message_type,
                    schema_version=1,
                    body=usage(user, 1).model_dump_json().encode(),
                    user_id=user,
                    message_id=blocker,
                    headers={"x-attempt": 2},
                    dedup_key=f"retry:usage_record:{blocker}:0:2",
                )
            ],
        )
        await conn.execute(
            "UPDATE telecom.outbox SET expires_at = now() - interval '1 second' "
            "WHERE message_id = $1",
            blocker,
        )
    app = in_process(settings, pool, amqp)
    relay = await app.start_relay()

    async def released() -> bool:
        holds = await hold_of(pool, user)
        return holds == [{"blocker": None, "state": "releasing"}]

    await eventually(released)
    await app.close()
    assert relay.published == 0
    assert await reason_of(pool, blocker) == "expired"


async def test_a_retry_that_would_come_after_the_ttl_is_buried_as_expired_at_once(
    pool: asyncpg.Pool, running: tuple[InProcess, Recorder]
) -> None:
    jobs = Jobs(pool)
    user = uuid4()
    doomed = await jobs.publish(USAGE_RECORD, usage(user, FAIL_ALWAYS), ttl=60, address="doomed")
    later = await jobs.publish(USAGE_RECORD, usage(user, 7))
    _, recorder = running

    async def later_applied_and_doomed_buried() -> bool:
        # The recorder hears of `later` inside the batch's transaction, before the commit that
        # buries `doomed` with it: wait for the dead letter too.
        applied = later.message_id in recorder.applied
        return applied and await reason_of(pool, doomed.message_id) is not None

    # Nothing held `later` back: the retry would be an hour away.
    await eventually(later_applied_and_doomed_buried)
    assert await reason_of(pool, doomed.message_id) == "expired"
    assert (await jobs.wait("doomed", timeout=5)).state == "failed"


async def test_a_parked_message_whose_ttl_runs_out_is_buried_as_expired_when_released(
    in_process: StartApp, fast: Settings, pool: asyncpg.Pool, amqp: AbstractRobustConnection
) -> None:
    recorder = Recorder()
    app = in_process(fast, pool, amqp)
    jobs = Jobs(pool)
    user = uuid4()
    await app.start_consumers(
        [USAGE_RECORD],
        pipelines={USAGE_RECORD.name: recording_pipeline(pool, recorder, retry_after=1.5)},
    )
    await app.start_relay()
    first = await jobs.publish(USAGE_RECORD, usage(user, FAIL_FIRST))

    async def held() -> bool:
        return len(await hold_of(pool, user)) == 1

    await eventually(held)
    short = await jobs.publish(USAGE_RECORD, usage(user, 8), ttl=1.0, address="short")

    async def all_done() -> bool:
        return first.message_id in recorder.applied and await hold_of(pool, user) == []

    await eventually(all_done)
    state = await jobs.wait("short", timeout=5)
    await app.close()
    assert short.message_id not in recorder.applied
    assert await reason_of(pool, short.message_id) == "expired"
    assert state.state == "failed"


async def test_reviving_a_dead_letter_clears_its_ttr_strikes(pool: asyncpg.Pool) -> None:
    message_id = uuid4()
    async with pool.acquire() as conn, conn.transaction():
        dead_id = await dead_letters.bury(
            conn,
            consumer_dead_letter(
                message_id=str(message_id),
                user_id=None,
                body=usage(uuid4(), 1).model_dump_json().encode(),
                headers={"x-schema-version": 1},
                reason="ttr",
                error_type="TTRExceededError",
                error_message="too slow",
            ),
        )
        await conn.execute(  # kept under the message's key (events/identity.py)
            "INSERT INTO telecom.ttr_strikes (consumer, message_id, strikes) "
            "VALUES ('usage_record', $1, 5)",
            message_key(message_id, None, None),
        )
        (result,) = await replay.replay(conn, [dead_id], "test", pkgq_user="pkgq")
    assert result.replayed
    assert await fetch(pool, "SELECT * FROM telecom.ttr_strikes") == []


async def test_a_paused_routes_messages_still_expire_when_their_ttl_runs_out(
    in_process: StartApp, settings: Settings, pool: asyncpg.Pool, amqp: AbstractRobustConnection
) -> None:
    jobs = Jobs(pool)
    async with pool.acquire() as conn:
        await outbox.pause_route(conn, USAGE_RECORD.name, "test")
    put = await jobs.publish(USAGE_RECORD, usage(uuid4(), 1), ttl=0.5, address="paused")
    kept = await jobs.publish(USAGE_RECORD, usage(uuid4(), 2))
    app = in_process(settings, pool, amqp)
    await app.start_relay()
    state = await jobs.wait("paused", timeout=15)
    await app.close()
    assert state.state == "failed"
    assert await reason_of(pool, put.message_id) == "expired"
    pending = await fetch(pool, "SELECT message_id FROM telecom.outbox WHERE published_at IS NULL")
    assert pending == [{"message_id": kept.message_id}]  # the rest stays paused


async def test_duplicate_deliveries_of_group_members_and_addressed_messages_count_once(
    in_process: StartApp,
    settings: Settings,
    pool: asyncpg.Pool,
    amqp: AbstractRobustConnection,
    tap: Tap,
) -> None:
    """A relay re-publish or a redelivery after a crash brings a second copy: the inbox drops
    it, so a group still completes once with its true counts, and an address stays done."""
    jobs = Jobs(pool)
    ops = uuid4()
    group = await jobs.publish_group(
        USAGE_RECORD,
        [usage(uuid4(), 1), usage(uuid4(), 2)],
        name="dups",
        on_complete=end_message(QUOTA_ADJUST, AdjustQuota(user_id=ops, item_id=1, delta=1)),
    )
    addressed = await jobs.publish(USAGE_RECORD, usage(uuid4(), 3), address="dup")
    # Second copies of a member and of the addressed message reach the broker first, sent by
    # pkgq as the relay sends them (its own AMQP user: the same messages, not an outsider's).
    publisher = await Publisher.open(amqp, settings.exchange, user_id=settings.amqp_user)
    try:
        for message_id in (group.message_ids[0], addressed.message_id):
            (row,) = await fetch(
                pool,
                "SELECT body, headers, message_type, user_id FROM telecom.outbox "
                "WHERE message_id = $1",
                message_id,
            )
            await publisher.publish(
                build_message(
                    bytes(row["body"]),
                    message_id=message_id,
                    message_type=row["message_type"],
                    headers=row["headers"],
                ),
                routing_key_for(settings, USAGE_RECORD.name, row["user_id"]),
            )
    finally:
        await publisher.close()
    recorder = Recorder()
    app = in_process(settings, pool, amqp)
    await app.start_consumers(
        [USAGE_RECORD], pipelines={USAGE_RECORD.name: recording_pipeline(pool, recorder)}
    )
    await app.start_relay()

    async def completed_and_sent() -> bool:
        summary = await jobs.group(group.group_id)
        return bool(summary and summary["state"] == "completed" and tap.on(QUOTA_ADJUST.name))

    await eventually(completed_and_sent)
    state = await jobs.wait("dup", timeout=10)

    async def copies_taken() -> bool:  # both copies of each were delivered
        rows = await fetch(
            pool,
            "SELECT sum(count) AS n FROM telecom.transition_counts "
            "WHERE route = $1 AND transition = 'take'",
            USAGE_RECORD.name,
        )
        return int(rows[0]["n"] or 0) == 5

    await eventually(copies_taken)
    await app.close()
    summary = await jobs.group(group.group_id)
    assert summary is not None
    assert (summary["total"], summary["done"], summary["failed"]) == (2, 2, 0)
    assert sorted(recorder.applied) == sorted([*group.message_ids, addressed.message_id])
    assert len(tap.on(QUOTA_ADJUST.name)) == 1  # the end message, once
    assert state.state == "done"


async def test_replaying_an_outsiders_letter_under_a_jobs_id_requeues_no_address(
    pool: asyncpg.Pool,
) -> None:
    """A job's address failed with its message M. Another publisher's letter under M's id
    (its address mark kept only as a claim) is replayed: the job's address stays failed, so
    `pkgq wait` is not left waiting on something nothing will finish. Replaying the job's own
    letter queues the address again."""
    m, user = uuid4(), uuid4()
    async with pool.acquire() as conn:
        await conn.execute(
            "INSERT INTO telecom.addresses (address, route, message_id, state, error) "
            "VALUES ('bill:7', $1, $2, 'failed', 'boom')",
            USAGE_RECORD.name,
            m,
        )
    body = usage(user, 1).model_dump_json().encode()
    outsiders = await buried(
        pool,
        message_id=str(m),
        user_id=user,
        body=body,
        publisher="mallory",
        headers={"x-schema-version": 1, H_CLAIMED: {H_ADDRESS: "bill:7"}},
    )
    own = await buried(
        pool,
        message_id=str(m),
        user_id=user,
        body=body + b" ",  # other bytes: a letter of its own
        publisher="pkgq",
        headers={"x-schema-version": 1, H_ADDRESS: "bill:7"},
    )
    async with pool.acquire() as conn, conn.transaction():
        (result,) = await replay.replay(conn, [outsiders], "olga", pkgq_user="pkgq")
    assert result.replayed
    (state,) = await fetch(pool, "SELECT state FROM telecom.addresses")
    assert state["state"] == "failed"
    async with pool.acquire() as conn, conn.transaction():
        (result,) = await replay.replay(conn, [own], "olga", pkgq_user="pkgq")
    assert result.replayed
    (state,) = await fetch(pool, "SELECT state FROM telecom.addresses")
    assert state["state"] == "queued"
