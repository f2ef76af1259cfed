"""xqueue (a Tarantool queue): its contract in its own words, checked on the real
services through `pkgq stats`.

- "R - ready - task is ready to be taken … deleted after ttl if ttl is enabled"
- "T - taken - task is taken by consumer. may not be taken by other … turned into R after ttr"
- "W - waiting - task is not ready to be taken. waiting for its delay"
- "B - buried - task was temporary discarded from queue by consumer … may be revived using kick
  by administrator … Without mandatory monitoring (stats.buried) usage of buried is useless"
- "Z - zombie - task was processed and ack'ed and temporary kept for delay"
- "D - done - task was processed and ack'ed"
- methods put, take, ack, release, bury, dig ("dig out task from buried state"), plow ("dig out
  N oldest tasks from buried state"), and the ttl and ttr timeouts.

Each message is in exactly one state, so for a route: put = R + T + W + B + expired + D; and
every delivery ends in one move, so take = ack + release + bury.
"""

from __future__ import annotations

import asyncio
import json
from typing import Any
from uuid import uuid4

import asyncpg
from aio_pika.abc import AbstractRobustConnection

from events.models import AdjustQuota
from events.routes import QUOTA_ADJUST, USAGE_RECORD
from infra.jobs import Jobs
from infra.settings import Settings
from tests.conformance.jobs_support import (
    BLOCK,
    BURY,
    BURY_ONCE,
    HANG_ONCE,
    RETRY_LATER,
    Recorder,
    recording_pipeline,
    usage,
)
from tests.support.dead_letters import buried_id
from tests.support.in_process import StartApp
from tests.support.observing import eventually
from tests.support.processes import cli


async def stats(settings: Settings) -> dict[str, Any]:
    done = await cli(settings, "stats", "--json")
    assert done.returncode == 0, done.stderr
    table: dict[str, Any] = json.loads(done.stdout)
    return table


async def test_every_state_and_transition_shows_in_pkgq_stats_and_the_counts_add_up(
    in_process: StartApp, settings: Settings, pool: asyncpg.Pool, amqp: AbstractRobustConnection
) -> None:
    jobs = Jobs(pool)
    recorder = Recorder()
    app = in_process(settings, pool, amqp)
    route = USAGE_RECORD.name
    # ttl: put while no relay runs, so it is not taken within its TTL.
    expiring = await jobs.publish(USAGE_RECORD, usage(uuid4(), 1), ttl=0.3)
    await asyncio.sleep(0.6)
    pipeline = recording_pipeline(pool, recorder, ttr=1.0)
    await app.start_consumers([USAGE_RECORD], pipelines={USAGE_RECORD.name: pipeline})
    await app.start_relay()
    plain = [(await jobs.publish(USAGE_RECORD, usage(uuid4(), 2))).message_id for _ in "abc"]
    delayed = await jobs.publish(USAGE_RECORD, usage(uuid4(), 3), delay=3600)
    buried = await jobs.publish(USAGE_RECORD, usage(uuid4(), BURY))
    released = await jobs.publish(USAGE_RECORD, usage(uuid4(), RETRY_LATER))
    hung = await jobs.publish(USAGE_RECORD, usage(uuid4(), HANG_ONCE))
    dug = await jobs.publish(USAGE_RECORD, usage(uuid4(), BURY_ONCE))
    # R on a route nobody consumes here: published, ready on the broker.
    ready = await jobs.publish(QUOTA_ADJUST, AdjustQuota(user_id=uuid4(), item_id=1, delta=1))

    async def settled() -> bool:
        return set(plain) | {hung.message_id} <= set(recorder.applied)

    await eventually(settled, within=30)
    dig = await cli(settings, "dlq", "dig", str(await buried_id(pool, dug.message_id)))
    assert dig.returncode == 0, dig.stdout + dig.stderr

    async def dug_applied() -> bool:
        return dug.message_id in recorder.applied

    await eventually(dug_applied)
    # The two oldest buried: the expired one (revived without its TTL, it is applied) and
    # `buried` (its handler buries it again).
    plow = await cli(settings, "dlq", "plow", "2")
    assert plow.returncode == 0, plow.stdout + plow.stderr

    async def plowed() -> bool:
        return (
            recorder.started.count(buried.message_id) == 2
            and expiring.message_id in recorder.applied
        )

    await eventually(plowed)
    await buried_id(pool, buried.message_id)

    # T: a message held by its handler is taken (the broker's unacked count). The TTR is
    # lifted first: the broker's figures take seconds to show it.
    pipeline.ttr = None
    taken = await jobs.publish(USAGE_RECORD, usage(uuid4(), BLOCK))
    seen_taken: dict[str, Any] = {}

    async def shows_taken() -> bool:
        seen_taken.update(await stats(settings))
        return bool(seen_taken[route]["taken"] == 1)

    await eventually(shows_taken, within=40, every=1.0)
    recorder.gate.set()

    async def taken_done() -> bool:
        return taken.message_id in recorder.applied

    await eventually(taken_done)
    final: dict[str, Any] = {}

    async def quiet() -> bool:
        final.update(await stats(settings))
        row = final[route]
        return bool(row["taken"] == 0 and row["ready"] == 0 and row["done"] == 7)

    await eventually(quiet, within=40, every=1.0)
    await app.close()
    row = final[route]
    moves = row["transitions"]
    assert seen_taken[route]["taken"] == 1
    assert row["waiting"] == 2  # the delayed one, and the released one's retry
    assert row["detail"]["scheduled"] == 2
    assert row["buried"] == 1
    assert row["expired"] == 0  # expired once, then plowed
    assert row["done"] == 7  # three plain, the hung one, the dug one, the plowed one, the taken
    assert row["zombie"] == 7  # their processed records, kept for retention
    assert moves == {
        "put": 10,
        "take": 11,
        "ack": 7,
        "release": 1,
        "bury": 3,
        "dig": 1,
        "plow": 2,
        "ttl": 1,
        "ttr": 1,
        "delete": 0,
    }
    in_states = row["ready"] + row["taken"] + row["waiting"] + row["buried"]
    assert moves["put"] == in_states + row["expired"] + row["done"]
    assert moves["take"] == moves["ack"] + moves["release"] + moves["bury"]
    assert final[QUOTA_ADJUST.name]["ready"] == 1
    assert final[QUOTA_ADJUST.name]["transitions"]["put"] == 1
    async with pool.acquire() as conn:
        reason = await conn.fetchval(
            "SELECT reason FROM telecom.dead_letters WHERE message_id = $1",
            str(expiring.message_id),
        )
        waiting = {
            r["message_id"]
            for r in await conn.fetch(
                "SELECT message_id FROM telecom.outbox WHERE published_at IS NULL AND route = $1",
                route,
            )
        }
    assert reason == "expired"  # the dead letter keeps why it was buried
    assert waiting == {delayed.message_id, released.message_id}
    assert ready.queued


async def test_a_message_left_on_the_broker_past_its_ttl_is_recorded_as_expired(
    in_process: StartApp, settings: Settings, pool: asyncpg.Pool, amqp: AbstractRobustConnection
) -> None:
    """The broker's half of the ttl: published in time, then nobody takes it. RabbitMQ
    dead-letters it (reason expired) and the ingester files it; its waiters hear it failed."""
    jobs = Jobs(pool)
    app = in_process(settings, pool, amqp)
    await app.start_consumers([], ingest=True)  # no consumer for usage_record
    await app.start_relay()
    # A TTL the relay's first round meets in time on a loaded machine (with 1 s it once came
    # too late under the whole suite, and the relay, not the broker, expired the message).
    put = await jobs.publish(USAGE_RECORD, usage(uuid4(), 1), ttl=3.0, address="unread")

    async def published() -> bool:
        async with pool.acquire() as conn:
            return bool(
                await conn.fetchval(
                    "SELECT published_at IS NOT NULL FROM telecom.outbox WHERE message_id = $1",
                    put.message_id,
                )
            )

    await eventually(published)
    state = await jobs.wait("unread", timeout=30)
    await app.close()
    assert state.state == "failed"
    assert state.error is not None
    assert "expired" in state.error
    async with pool.acquire() as conn:
        row = await conn.fetchrow(
            "SELECT source, reason FROM telecom.dead_letters WHERE message_id = $1",
            str(put.message_id),
        )
    assert row is not None
    assert (row["source"], row["reason"]) == ("broker", "expired")
    table = await stats(settings)
    assert table[USAGE_RECORD.name]["transitions"]["ttl"] == 1

    async def left_the_queue() -> bool:
        # The broker's ready count comes from the management API, which samples queues every
        # few seconds: it may still show the message for a moment after it expired.
        return bool((await stats(settings))[USAGE_RECORD.name]["ready"] == 0)

    await eventually(left_the_queue, within=15, every=1.0)
