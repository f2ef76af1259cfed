"""Replay runs (`pkgq dlq replay` as a run: consumers/replay_runner.py) against real Postgres
and RabbitMQ: paced at a rate, each message sent once; stopped by itself when its messages fail
again or its route's circuit breaker trips, with the reason; resumed from where it stopped,
never taking in a letter filed after it started; its progress in structured log lines.

PKGQ_REPLAY_SCALE sets how many dead letters the paced run replays (500 by default; 5000 to
scale it up)."""

from __future__ import annotations

import asyncio
import json
import os
import re
import shlex
import subprocess
import sys
import time
from uuid import uuid4

import asyncpg
from aio_pika.abc import AbstractRobustConnection

from consumers.retry_policy import RetryPolicy
from events.envelope import H_SCHEMA_VERSION
from events.models import RecordUsage
from events.routes import USAGE_RECORD
from infra.postgres import consumer_pauses
from infra.settings import Settings
from tests.integration.failure_helpers import until, usage_pipeline
from tests.support.dead_letters import buried
from tests.support.in_process import InProcess
from tests.support.observing import eventually, fetch
from tests.support.processes import cli, settings_env

SCALE = int(os.environ.get("PKGQ_REPLAY_SCALE", "500"))


async def _bury_usage(pool: asyncpg.Pool, count: int, first_upload: int = 1) -> list[int]:
    """`count` buried usage records (one user each, uploads numbered from `first_upload`)."""
    ids = []
    for i in range(count):
        user = uuid4()
        body = RecordUsage(user_id=user, upload=first_upload + i, download=0)
        headers = {H_SCHEMA_VERSION: USAGE_RECORD.schema_version}
        raw = body.model_dump_json().encode()
        ids.append(await buried(pool, user_id=user, body=raw, headers=headers))
    return ids


async def _replay_rows(pool: asyncpg.Pool) -> list[str]:
    rows = await fetch(pool, "SELECT dedup_key FROM telecom.outbox WHERE dedup_key LIKE 'replay:%'")
    return [r["dedup_key"] for r in rows]


def _sent_ids(dedup_keys: list[str]) -> list[int]:
    return sorted(int(k.split(":")[1]) for k in dedup_keys)


async def test_a_paced_replay_of_many_dead_letters_sends_and_applies_each_exactly_once(
    fast: Settings, pool: asyncpg.Pool, amqp: AbstractRobustConnection, app: InProcess
) -> None:
    pipeline, applied = usage_pipeline(pool, RetryPolicy(max_attempts=1), lambda *_: False)
    await app.start_consumers([USAGE_RECORD], pipelines={USAGE_RECORD.name: pipeline})
    ids = await _bury_usage(pool, SCALE)
    rate = 250.0

    started = time.monotonic()
    done = await cli(fast, "dlq", "replay", "--rate", str(rate), "--json")
    elapsed = time.monotonic() - started
    assert done.returncode == 0, done.stdout + done.stderr
    outcome = json.loads(done.stdout)
    assert (outcome["state"], outcome["replayed"], outcome["progress"]["left"]) == (
        "done",
        SCALE,
        0,
    )
    (run,) = await fetch(pool, "SELECT * FROM telecom.replay_runs")
    achieved = outcome["progress"]["rate"]
    print(
        f"\nreplayed {SCALE} at --rate {rate:g}: {achieved} msg/s in the run, "
        f"{SCALE / elapsed:.0f} msg/s over the command's {elapsed:.1f} s"
    )

    assert _sent_ids(await _replay_rows(pool)) == sorted(ids)  # each sent once
    await eventually(until(lambda: len(applied) >= SCALE), within=60)
    assert sorted(up for _, up in applied) == list(range(1, SCALE + 1))  # each applied once
    assert (run["sent"], run["total"], run["state"]) == (SCALE, SCALE, "done")


async def test_a_replay_whose_messages_fail_again_stops_itself_and_resume_sends_the_rest(
    fast: Settings, pool: asyncpg.Pool, amqp: AbstractRobustConnection, app: InProcess
) -> None:
    broken = True
    pipeline, applied = usage_pipeline(pool, RetryPolicy(max_attempts=1), lambda *_: broken)
    await app.start_consumers([USAGE_RECORD], pipelines={USAGE_RECORD.name: pipeline})
    ids = await _bury_usage(pool, 60)
    limits = ("--check-first", "10", "--min-decided", "5", "--max-failed", "50")

    stopped = await cli(fast, "dlq", "replay", "--rate", "100", *limits, "--json")
    assert stopped.returncode == 1, stopped.stdout + stopped.stderr
    outcome = json.loads(stopped.stdout)
    assert outcome["state"] == "stopped_failing"
    assert "failed again" in outcome["reason"]
    assert outcome["replayed"] == 10  # it held back after its first 10 until they were decided
    run_id = outcome["run_id"]
    (run,) = await fetch(pool, "SELECT * FROM telecom.replay_runs WHERE id = $1", run_id)
    assert (run["state"], run["failed_again"], run["sent"]) == ("stopped_failing", 10, 10)
    # each failure again is a letter of its own, filed beside the replayed one
    again = await fetch(
        pool, "SELECT id FROM telecom.dead_letters WHERE status = 'buried' AND id <> ALL($1)", ids
    )
    assert len(again) == 10

    broken = False  # the cause is fixed
    resumed = await cli(fast, "dlq", "replay", "--resume", str(run_id), *limits, "--json")
    assert resumed.returncode == 0, resumed.stdout + resumed.stderr
    assert (json.loads(resumed.stdout)["state"], json.loads(resumed.stdout)["replayed"]) == (
        "done",
        50,
    )
    assert _sent_ids(await _replay_rows(pool)) == sorted(ids)  # the first 10 were not sent again
    await eventually(until(lambda: len(applied) == 50), within=30)
    assert sorted(up for _, up in applied) == list(range(11, 61))


async def test_a_tripped_breaker_stops_a_replay_and_its_resume_takes_in_no_letter_filed_since(
    fast: Settings, pool: asyncpg.Pool
) -> None:
    ids = await _bury_usage(pool, 20)
    async with pool.acquire() as conn:
        await consumer_pauses.pause(
            conn,
            USAGE_RECORD.name,
            "breaker@test",
            "circuit breaker: 9 of 10 failed",
            automatic=True,
        )
    stopped = await cli(fast, "dlq", "replay", "--route", "usage_record", "--json")
    assert stopped.returncode == 1, stopped.stdout + stopped.stderr
    outcome = json.loads(stopped.stdout)
    assert outcome["state"] == "stopped_breaker"
    assert "circuit breaker of telecom.usage_record tripped" in outcome["reason"]
    assert "9 of 10 failed" in outcome["reason"]
    (run,) = await fetch(pool, "SELECT * FROM telecom.replay_runs")
    assert (run["state"], run["sent"], run["total"]) == ("stopped_breaker", 0, 20)

    later = await _bury_usage(pool, 5, first_upload=100)  # filed after the run started
    async with pool.acquire() as conn:
        await consumer_pauses.resume(conn, USAGE_RECORD.name, "ops")
    resumed = await cli(fast, "dlq", "replay", "--resume", str(run["id"]), "--json")
    assert resumed.returncode == 0, resumed.stdout + resumed.stderr
    assert json.loads(resumed.stdout)["replayed"] == 20
    assert _sent_ids(await _replay_rows(pool)) == sorted(ids)
    statuses = await fetch(
        pool, "SELECT status::text AS s FROM telecom.dead_letters WHERE id = ANY($1)", later
    )
    assert [r["s"] for r in statuses] == ["buried"] * 5

    again = await cli(fast, "dlq", "replay", "--resume", str(run["id"]))
    assert again.returncode == 3  # a finished run is not resumed
    assert "done" in again.stderr


async def test_a_replay_without_a_terminal_logs_its_progress_fields_every_few_seconds(
    fast: Settings, pool: asyncpg.Pool
) -> None:
    await _bury_usage(pool, 30)
    done = await cli(
        fast, "dlq", "replay", "--rate", "20", "--progress-every", "0.2", "--check-first", "100"
    )
    assert done.returncode == 0, done.stdout + done.stderr
    lines = [json.loads(line) for line in done.stderr.splitlines() if line.startswith("{")]
    progress = [line for line in lines if line.get("event") == "replay_progress"]
    assert len(progress) >= 3, done.stderr
    for line in progress:
        assert {"run_id", "sent", "failed_again", "left", "rate", "eta_s"} <= set(line)
    assert progress[-1]["state"] == "done"
    assert (progress[-1]["sent"], progress[-1]["left"]) == (30, 0)
    assert any(0 < line["sent"] < 30 for line in progress)  # said while it ran


async def test_a_replay_on_a_terminal_shows_a_live_display_of_its_progress(
    fast: Settings, pool: asyncpg.Pool
) -> None:
    await _bury_usage(pool, 30)
    command = shlex.join(
        [sys.executable, "-m", "consumers", "dlq", "replay", "--rate", "30", "--check-first", "100"]
    )
    env = {**settings_env(fast), "COLUMNS": "160", "TERM": "xterm"}
    # `script` gives the command a terminal and keeps what it wrote to it
    shown = await asyncio.to_thread(
        subprocess.run,
        ["script", "-qefc", command, "/dev/null"],
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert shown.returncode == 0, shown.stdout + shown.stderr
    screen = shown.stdout
    assert "replay run 1" in screen
    assert "30/30 sent" in screen
    assert "0 failed again" in screen
    assert "0 left" in screen
    assert re.search(r"[0-9.]+/s", screen)
    assert "replayed 30 dead letter(s) through the outbox (replay run 1)" in screen
    assert '"replay_progress"' not in screen  # a display, not log lines
