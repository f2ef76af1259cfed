"""Replaying dead letters (infra/postgres/replay.py) against real Postgres and RabbitMQ:
dig and plow, a bulk replay interrupted and run again, and a replay that fails again.

The retry policy is injected (short, fixed delays); operator commands run as real `pkgq dlq …`
processes.
"""

from __future__ import annotations

import json
from uuid import uuid4

import asyncpg
from aio_pika.abc import AbstractRobustConnection

from consumers.retry_policy import RetryPolicy
from consumers.unit_of_work import HandlerContext
from events.models import RecordUsage
from events.routes import USAGE_RECORD
from infra.postgres import replay
from infra.settings import Settings
from tests.integration.failure_helpers import (
    billed,
    dead_letter_of,
    rows_of,
    until,
    usage,
    usage_pipeline,
)
from tests.support.in_process import InProcess
from tests.support.observing import eventually, fetch
from tests.support.processes import cli


async def test_a_fixed_dead_letter_is_replayed_once_by_dig_and_never_again_once_applied(
    fast: Settings, pool: asyncpg.Pool, amqp: AbstractRobustConnection, app: InProcess
) -> None:
    broken = True
    pipeline, applied = usage_pipeline(pool, RetryPolicy(max_attempts=1), lambda *_: broken)
    await app.start_consumers([USAGE_RECORD], pipelines={USAGE_RECORD.name: pipeline})
    user = uuid4()
    sent = await usage(fast, amqp, user, 5)
    dead = await dead_letter_of(pool, sent)
    assert dead["reason"] == "max_attempts"

    broken = False  # the cause is fixed
    dug = await cli(fast, "dlq", "dig", str(dead["id"]), "--by", "ops-alice")
    assert dug.returncode == 0, dug.stdout + dug.stderr
    await eventually(until(lambda: applied == [(user, 5)]))
    await billed(pool, user, 5)

    # Applied since: superseded (who replayed it is kept), so never sent again, even forced.
    async def superseded() -> bool:
        (row,) = await rows_of(pool, sent)
        return bool(row["status"] == "superseded")

    await eventually(superseded)
    (row,) = await rows_of(pool, sent)
    assert (row["replayed_by"], row["replay_count"]) == ("ops-alice", 1)
    again = await cli(fast, "dlq", "dig", str(dead["id"]))
    assert again.returncode == 1
    assert "superseded" in again.stdout
    forced = await cli(fast, "dlq", "dig", str(dead["id"]), "--force")
    assert forced.returncode == 1, forced.stdout + forced.stderr
    assert "never replayed" in forced.stdout
    await usage(fast, amqp, user, 1)
    await eventually(until(lambda: len(applied) == 2))
    assert applied == [(user, 5), (user, 1)]  # the message was applied once
    await billed(pool, user, 6)


async def test_an_interrupted_bulk_replay_run_again_finishes_without_duplicates(
    fast: Settings, pool: asyncpg.Pool, amqp: AbstractRobustConnection, app: InProcess
) -> None:
    broken = True
    pipeline, applied = usage_pipeline(pool, RetryPolicy(max_attempts=1), lambda *_: broken)
    await app.start_consumers([USAGE_RECORD], pipelines={USAGE_RECORD.name: pipeline})
    users = [uuid4() for _ in range(5)]
    sent = [await usage(fast, amqp, u, i + 1) for i, u in enumerate(users)]
    ids = [(await dead_letter_of(pool, m))["id"] for m in sent]

    dry = await cli(fast, "dlq", "replay", "--dry-run", "--json")
    assert dry.returncode == 0, dry.stderr
    assert sorted(r["id"] for r in json.loads(dry.stdout)) == sorted(ids)
    assert applied == []  # a dry run sends nothing

    broken = False
    # The first batch of a replay that was then killed: committed, marked, nothing more.
    async with pool.acquire() as conn, conn.transaction():
        first = await replay.replay(conn, ids[:2], "interrupted-run", pkgq_user=fast.amqp_user)
    assert [r.replayed for r in first] == [True, True]

    rerun = await cli(fast, "dlq", "replay", "--json")
    assert rerun.returncode == 0, rerun.stdout + rerun.stderr
    assert json.loads(rerun.stdout)["replayed"] == 3  # only what the first run had not done
    await eventually(until(lambda: len(applied) == 5))
    assert sorted(applied) == sorted((u, i + 1) for i, u in enumerate(users))

    third = await cli(fast, "dlq", "replay", "--json")
    assert json.loads(third.stdout)["replayed"] == 0
    replays = await fetch(pool, "SELECT 1 FROM telecom.outbox WHERE dedup_key LIKE 'replay:%'")
    assert len(replays) == 5


async def test_plow_replays_the_n_oldest_buried_dead_letters_and_leaves_the_rest(
    fast: Settings, pool: asyncpg.Pool, amqp: AbstractRobustConnection, app: InProcess
) -> None:
    broken = True
    pipeline, applied = usage_pipeline(pool, RetryPolicy(max_attempts=1), lambda *_: broken)
    await app.start_consumers([USAGE_RECORD], pipelines={USAGE_RECORD.name: pipeline})
    users = [uuid4() for _ in range(3)]
    sent = []
    for i, user in enumerate(users):  # one at a time, so their failure times are in this order
        sent.append(await usage(fast, amqp, user, i + 1))
        await dead_letter_of(pool, sent[-1])

    broken = False
    plowed = await cli(fast, "dlq", "plow", "2", "--json")
    assert plowed.returncode == 0, plowed.stdout + plowed.stderr
    assert json.loads(plowed.stdout)["replayed"] == 2
    await eventually(until(lambda: len(applied) == 2))
    assert sorted(applied) == sorted([(users[0], 1), (users[1], 2)])

    async def settled() -> bool:  # replayed, then superseded once applied
        statuses = [(await rows_of(pool, m))[0]["status"] for m in sent]
        return statuses == ["superseded", "superseded", "buried"]

    await eventually(settled)


async def test_a_replay_that_fails_again_gets_retries_of_its_own_and_is_filed_as_a_new_dead_letter(
    fast: Settings, pool: asyncpg.Pool, amqp: AbstractRobustConnection, app: InProcess
) -> None:
    """A filed dead letter is a record: the replayed one stays `replayed` (what the operator
    did), and the message's new failure is a buried letter of its own, which holds its user
    and is the one to replay next."""
    broken = True
    seen: list[tuple[int, object]] = []

    def fails(ctx: HandlerContext, _: RecordUsage) -> bool:
        seen.append((ctx.envelope.attempt, None))
        return broken

    policy = RetryPolicy(max_attempts=2, backoff=lambda _: 0.1)
    pipeline, applied = usage_pipeline(pool, policy, fails)
    await app.start_consumers([USAGE_RECORD], pipelines={USAGE_RECORD.name: pipeline})
    user = uuid4()
    sent = await usage(fast, amqp, user, 4)
    parked = await usage(fast, amqp, user, 5)
    dead = await dead_letter_of(pool, sent)
    assert dead["attempts"] == 2

    replayed = await cli(fast, "dlq", "dig", str(dead["id"]))  # too early: still broken
    assert replayed.returncode == 0, replayed.stdout + replayed.stderr

    async def buried_again() -> bool:
        rows = await rows_of(pool, sent)
        return sorted(r["status"] for r in rows) == ["buried", "replayed"]

    await eventually(buried_again, within=20)
    letters = {r["status"]: r for r in await rows_of(pool, sent)}
    assert (letters["replayed"]["id"], letters["replayed"]["replay_count"]) == (dead["id"], 1)
    anew = letters["buried"]
    assert anew["id"] != dead["id"]
    assert [a for a, _ in seen] == [1, 2, 1, 2]  # the replay had its own two attempts
    holds = await fetch(pool, "SELECT state, blocker FROM telecom.holds WHERE user_id = $1", user)
    assert [(h["state"], h["blocker"]) for h in holds] == [("buried", sent)]
    listed = await cli(fast, "dlq", "list", "--json")
    # the new letter holds the user's parked message back; the replayed record holds nothing
    assert {(r["id"], r["held_back"]) for r in json.loads(listed.stdout)} == {
        (dead["id"], 0),
        (anew["id"], 1),
    }

    broken = False
    again = await cli(fast, "dlq", "dig", str(anew["id"]))
    assert again.returncode == 0, again.stdout + again.stderr
    await eventually(until(lambda: applied == [(user, 4), (user, 5)]))
    await billed(pool, user, 9)
    assert parked not in {
        r["message_id"] for r in await fetch(pool, "SELECT * FROM telecom.parked")
    }
