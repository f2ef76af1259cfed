"""A Redis-backed worker queue: its contract in its own words, checked on the real
services.

- "Retry delay time is calculated using an exponential backoff strategy: count^4 + 15 + random
  value" (the formula in full: count^4 + 15 + rand(10) * (count + 1) seconds).
- "Supports configuring a unique execution window for tasks through unique_for (e.g., executing
  the same task only once within 10 seconds). Generates a unique key by SHA-256 hashing the
  parameters."
- "Starts multiple worker threads in parallel to process tasks based on the configured
  num_workers", with queues configured "through configuration files".

In pkgq the retry schedule is the default retry policy, the window is `publish(unique_for=…)`,
and num_workers is a route's `concurrency` in the route configuration file.
"""

from __future__ import annotations

import asyncio
import zlib
from pathlib import Path
from uuid import UUID, uuid4

import asyncpg
import pytest
from aio_pika.abc import AbstractRobustConnection

from consumers.delivery import DeliveryPipeline
from consumers.retry_policy import policy_for, seed003_backoff
from consumers.unit_of_work import HandlerContext
from events.models import RecordUsage
from events.routes import USAGE_RECORD
from infra.jobs import Jobs
from infra.route_config import load_routes_file
from infra.settings import Settings
from tests.conformance.jobs_support import Recorder, recording_pipeline, usage
from tests.support.in_process import StartApp
from tests.support.observing import eventually
from tests.support.processes import cli


def test_the_backoff_is_count4_plus_15_plus_rand10_times_count_plus_1() -> None:
    for count in range(1, 26):
        assert seed003_backoff(count, rand=lambda _n: 0) == count**4 + 15
        assert seed003_backoff(count, rand=lambda _n: 9) == count**4 + 15 + 9 * (count + 1)
        drawn = seed003_backoff(count)
        assert count**4 + 15 <= drawn <= count**4 + 15 + 9 * (count + 1)
        assert (drawn - count**4 - 15) % (count + 1) == 0  # a whole rand(10) step


async def test_a_failed_message_is_scheduled_again_by_the_default_backoff_formula(
    in_process: StartApp, settings: Settings, pool: asyncpg.Pool, amqp: AbstractRobustConnection
) -> None:
    async def failing(ctx: HandlerContext, body: RecordUsage) -> None:
        raise RuntimeError("the rating engine is down")

    pipeline = DeliveryPipeline(
        pool,
        USAGE_RECORD,
        failing,
        policy_for(settings, USAGE_RECORD.name),  # the default policy: that formula
        max_body_bytes=2**20,
    )
    app = in_process(settings, pool, amqp)
    await app.start_consumers([USAGE_RECORD], pipelines={USAGE_RECORD.name: pipeline})
    await app.start_relay()
    put = await Jobs(pool).publish(USAGE_RECORD, usage(uuid4(), 1))

    async def retry_scheduled() -> bool:
        async with pool.acquire() as conn:
            return bool(
                await conn.fetchval(
                    "SELECT count(*) FROM telecom.outbox WHERE message_id = $1 "
                    "AND dedup_key LIKE 'retry:%'",
                    put.message_id,
                )
            )

    await eventually(retry_scheduled)
    await app.close()
    async with pool.acquire() as conn:
        row = await conn.fetchrow(
            "SELECT extract(epoch FROM available_at - created_at) AS wait, headers "
            "FROM telecom.outbox WHERE message_id = $1 AND dedup_key LIKE 'retry:%'",
            put.message_id,
        )
    assert row is not None
    # After the first attempt: 1 + 15 + rand(10) * 2, so 16 s to 34 s in steps of 2.
    assert 16 <= float(row["wait"]) <= 34 + 1
    assert row["headers"]["x-attempt"] == 2


async def test_a_repeat_within_the_unique_window_is_dropped_and_accepted_after_it(
    pool: asyncpg.Pool,
) -> None:
    jobs = Jobs(pool)
    user = uuid4()
    first = await jobs.publish(USAGE_RECORD, usage(user, 7), unique_for=1)
    repeat = await jobs.publish(USAGE_RECORD, usage(user, 7), unique_for=1)
    other = await jobs.publish(USAGE_RECORD, usage(user, 8), unique_for=1)
    assert first.queued
    assert not repeat.queued
    assert repeat.duplicate_of == first.message_id
    assert other.queued  # other arguments: another key
    await asyncio.sleep(1.2)
    after = await jobs.publish(USAGE_RECORD, usage(user, 7), unique_for=1)
    assert after.queued
    async with pool.acquire() as conn:
        ids = {
            r["message_id"]
            for r in await conn.fetch(
                "SELECT message_id FROM telecom.outbox WHERE route = $1", USAGE_RECORD.name
            )
        }
    assert ids == {first.message_id, other.message_id, after.message_id}


async def test_pkgq_publish_says_when_it_drops_a_repeat_within_the_unique_window(
    settings: Settings,
) -> None:
    body = usage(uuid4(), 9).model_dump_json()
    first = await cli(settings, "publish", "usage_record", body, "--unique-for", "1m")
    repeat = await cli(settings, "publish", "usage_record", body, "--unique-for", "1m")
    assert first.returncode == 0, first.stderr
    message_id = UUID(first.stdout.split()[0])
    assert repeat.returncode == 4
    assert "dropped" in repeat.stdout
    assert str(message_id) in repeat.stdout


def users_on_every_lane(lanes: int, per_lane: int) -> list[UUID]:
    chosen: dict[int, list[UUID]] = {k: [] for k in range(lanes)}
    while any(len(v) < per_lane for v in chosen.values()):
        user = uuid4()
        lane = zlib.crc32(str(user).encode()) % lanes
        if len(chosen[lane]) < per_lane:
            chosen[lane].append(user)
    return [u for v in chosen.values() for u in v]


@pytest.fixture
def routes_file(tmp_path: Path) -> Path:
    path = tmp_path / "routes.toml"
    path.write_text(
        "[routes.usage_record]\nconcurrency = 3\nbatch_size = 4\nttr = 30\n\n"
        "[routes.quota_adjust]\nconcurrency = 1\n"
    )
    return path


@pytest.fixture
def configured(settings: Settings, routes_file: Path) -> Settings:
    return settings.model_copy(update={"route_settings": load_routes_file(routes_file)})


async def test_a_routes_worker_count_from_the_configuration_file_is_honoured(
    in_process: StartApp, configured: Settings, pool: asyncpg.Pool, amqp: AbstractRobustConnection
) -> None:
    assert configured.concurrency_for(USAGE_RECORD.name) == 3
    recorder = Recorder(pause=0.3)
    app = in_process(configured, pool, amqp)
    users = users_on_every_lane(3, per_lane=3)
    await app.start_consumers(
        [USAGE_RECORD], pipelines={USAGE_RECORD.name: recording_pipeline(pool, recorder)}
    )
    await app.start_relay()
    jobs = Jobs(pool)
    for user in users:
        await jobs.publish(USAGE_RECORD, usage(user, 1))

    async def all_applied() -> bool:
        return len(recorder.applied) == len(users)

    await eventually(all_applied, within=30)
    await app.close()
    assert recorder.max_running == 3  # three lanes worked at once, never a fourth


async def test_a_route_configured_with_one_worker_runs_one_message_at_a_time(
    in_process: StartApp, settings: Settings, pool: asyncpg.Pool, amqp: AbstractRobustConnection
) -> None:
    recorder = Recorder(pause=0.1)
    app = in_process(settings, pool, amqp)
    await app.start_consumers(
        [USAGE_RECORD], pipelines={USAGE_RECORD.name: recording_pipeline(pool, recorder)}
    )
    await app.start_relay()
    for user in users_on_every_lane(3, per_lane=2):
        await Jobs(pool).publish(USAGE_RECORD, usage(user, 1))

    async def all_applied() -> bool:
        return len(recorder.applied) == 6

    await eventually(all_applied, within=30)
    await app.close()
    assert recorder.max_running == 1
