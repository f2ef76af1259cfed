"""Retention (the zombie delay): what is past retention is pruned in bounded batches,
what is recent stays, dead letters are never touched, and a dry run deletes nothing."""

from __future__ import annotations

import json
from typing import Any
from uuid import uuid4

import asyncpg

from infra.postgres import retention, transitions
from infra.settings import Settings
from tests.support.processes import cli

DAY = 86400.0
RETENTION = 7 * DAY
OLD = "now() - interval '8 days'"
RECENT = "now() - interval '1 day'"

EXPECTED = {
    "inbox": 28,
    "outbox": 12,
    "addresses": 2,
    "job_groups": 1,
    "unique_keys": 3,
    "ttr_strikes": 2,
    "attempts": 2,
    "workers": 1,
    "usage_billed": 2,
    "route_minutes": 2,
    "web_sessions": 0,  # expired console sessions: tests/web/test_console_sessions.py
}
"""What _populate leaves past retention, per table."""


async def _populate(pool: asyncpg.Pool) -> None:
    async with pool.acquire() as conn:
        # inbox: 25 + 3 old (two routes), 5 recent
        for consumer, n, when in (
            ("usage_record", 25, OLD),
            ("package_cancel", 3, OLD),
            ("usage_record", 5, RECENT),
        ):
            await conn.execute(
                "INSERT INTO telecom.inbox (consumer, message_id, processed_at) "
                f"SELECT $1, gen_random_uuid(), {when} FROM generate_series(1, $2)",
                consumer,
                n,
            )
        # outbox: 12 published long ago, 4 published recently, 3 old but never published
        for n, published, created in ((12, OLD, OLD), (4, RECENT, OLD), (3, "NULL", OLD)):
            await conn.execute(
                "INSERT INTO telecom.outbox (message_id, route, message_type, schema_version, "
                "body, created_at, published_at) "
                "SELECT gen_random_uuid(), 'telecom.usage_record', 'RecordUsage', 1, '{}', "
                f"{created}, {published} FROM generate_series(1, $1)",
                n,
            )
        # addresses: 2 finished long ago, 1 finished recently, 1 old still queued
        for address, state, finished in (
            ("a1", "done", OLD),
            ("a2", "failed", OLD),
            ("a3", "done", RECENT),
            ("a4", "queued", "NULL"),
        ):
            await conn.execute(
                "INSERT INTO telecom.addresses (address, route, message_id, state, created_at, "
                f"finished_at) VALUES ($1, 'telecom.usage_record', $2, $3, {OLD}, {finished})",
                address,
                uuid4(),
                state,
            )
        # groups: one finished long ago with members, one open since long ago with a member
        for state, finished in (("completed", OLD), ("open", "NULL")):
            group = uuid4()
            await conn.execute(
                "INSERT INTO telecom.job_groups (id, name, state, total, created_at, "
                f"finished_at) VALUES ($1, 'g', $2, 2, {OLD}, {finished})",
                group,
                state,
            )
            await conn.execute(
                "INSERT INTO telecom.group_members (message_id, group_id, route, state) "
                "SELECT gen_random_uuid(), $1, 'telecom.usage_record', 'done' "
                "FROM generate_series(1, 2)",
                group,
            )
        # unique keys: 3 whose window has passed (however recent), 2 still open
        for key, expires in (
            ("u1", "now() - interval '1 second'"),
            ("u2", "now() - interval '1 hour'"),
            ("u3", OLD),
            ("u4", "now() + interval '1 hour'"),
            ("u5", "now() + interval '30 days'"),
        ):
            await conn.execute(
                f"INSERT INTO telecom.unique_keys VALUES ($1, $2, {expires})", key, uuid4()
            )
        # Billed usage record ids: 2 past their own window, 1 within it (retention is not
        # theirs: one billed 8 days ago with a 35-day window stays).
        for keep_until in (
            "now() - interval '1 hour'",
            "now() - interval '1 second'",
            "now() + interval '27 days'",
        ):
            await conn.execute(
                "INSERT INTO telecom.usage_billed (user_id, usage_id, message_id, upload, "
                "download, billed_at, keep_until) "
                f"VALUES ($1, 'cdr', $2, 1, 0, {OLD}, {keep_until})",
                uuid4(),
                uuid4(),
            )
        # TTR strikes: 2 old, 1 recent
        for when in (OLD, OLD, RECENT):
            await conn.execute(
                "INSERT INTO telecom.ttr_strikes (consumer, message_id, last_at) "
                f"VALUES ('usage_record', $1, {when})",
                uuid4(),
            )
        # attempts: 2 last counted long ago, 1 recently
        for when in (OLD, OLD, RECENT):
            await conn.execute(
                "INSERT INTO telecom.attempts (consumer, message_id, attempts, last_claim, "
                f"last_at) VALUES ('usage_record', $1, 3, 3, {when})",
                uuid4(),
            )
        # workers: 1 stopped long ago, 1 stopped recently, 1 alive with an old heartbeat
        for name, stopped, heartbeat in (
            ("gone", OLD, OLD),
            ("just-stopped", RECENT, RECENT),
            ("alive", "NULL", OLD),
        ):
            await conn.execute(
                "INSERT INTO telecom.workers (id, name, role, host, pid, started_at, "
                f"heartbeat_at, stopped_at) VALUES ($1, $2, 'run', 'h', 1, {OLD}, {heartbeat}, "
                f"{stopped})",
                uuid4(),
                name,
            )
        # trend snapshots: 2 minutes of one route long ago, 1 recent
        for when in (OLD, f"{OLD} - interval '1 minute'", RECENT):
            await conn.execute(
                "INSERT INTO telecom.route_minutes (minute, route, acked, failed, dead_lettered, "
                "parked, outbox_pending, outbox_lag_s) "
                f"VALUES (date_trunc('minute', {when}), 'telecom.usage_record', 1, 0, 0, 0, 0, 0)"
            )
        # a dead letter buried long ago: never pruned here
        await conn.execute(
            "INSERT INTO telecom.dead_letters (dedup_key, source, route, consumer, body, reason, "
            "error_type, error_message, first_failed_at, last_failed_at) VALUES ('d1', "
            f"'consumer', 'telecom.usage_record', 'usage_record', '{{}}', 'r', 'E', 'm', {OLD}, "
            f"{OLD})"
        )


async def _table_counts(pool: asyncpg.Pool) -> dict[str, int]:
    tables = [*EXPECTED, "group_members", "dead_letters"]
    async with pool.acquire() as conn:
        return {t: int(await conn.fetchval(f"SELECT count(*) FROM telecom.{t}")) for t in tables}


async def _deletes(pool: asyncpg.Pool) -> dict[str, int]:
    async with pool.acquire() as conn:
        totals = await transitions.totals(conn)
    return {route: moves["delete"] for route, moves in totals.items() if moves["delete"]}


async def test_prune_deletes_only_what_is_past_retention_in_bounded_batches(
    pool: asyncpg.Pool,
) -> None:
    await _populate(pool)
    before = await _table_counts(pool)

    counts = await retention.prune(pool, RETENTION, batch_size=10)

    assert {k: v for k, v in counts.items() if k != retention.BATCHES} == EXPECTED
    # inbox 10+10+8, outbox 10+2, then one short batch for each of the nine other tables
    assert counts[retention.BATCHES] == 3 + 2 + 9
    after = await _table_counts(pool)
    for table, gone in EXPECTED.items():
        assert after[table] == before[table] - gone, table
    assert after["group_members"] == 2  # the finished group's members went with it
    assert after["dead_letters"] == 1
    async with pool.acquire() as conn:
        kept_workers = {r["name"] for r in await conn.fetch("SELECT name FROM telecom.workers")}
        kept_keys = {r["unique_key"] for r in await conn.fetch("SELECT * FROM telecom.unique_keys")}
        unpublished = await conn.fetchval(
            "SELECT count(*) FROM telecom.outbox WHERE published_at IS NULL"
        )
    assert kept_workers == {"just-stopped", "alive"}
    assert kept_keys == {"u4", "u5"}
    assert unpublished == 3  # old but never published: still owed to the broker

    again = await retention.prune(pool, RETENTION, batch_size=10)
    assert not any(v for k, v in again.items() if k != retention.BATCHES)


async def test_pruned_processed_messages_are_counted_as_delete_transitions_per_route(
    pool: asyncpg.Pool,
) -> None:
    await _populate(pool)
    async with pool.acquire() as conn:
        await retention.prune(conn, RETENTION, batch_size=7)
    assert await _deletes(pool) == {"telecom.usage_record": 25, "telecom.package_cancel": 3}


async def test_expired_unique_keys_are_pruned_even_with_a_long_retention(
    pool: asyncpg.Pool,
) -> None:
    await _populate(pool)
    counts = await retention.prune(pool, 365 * DAY, batch_size=100)
    assert counts["unique_keys"] == 3
    assert counts["inbox"] == counts["outbox"] == counts["workers"] == 0


async def test_a_dry_run_counts_what_would_be_pruned_and_deletes_nothing(
    pool: asyncpg.Pool,
) -> None:
    await _populate(pool)
    before = await _table_counts(pool)
    counts = await retention.prune(pool, RETENTION, batch_size=10, dry_run=True)
    assert {k: v for k, v in counts.items() if k != retention.BATCHES} == EXPECTED
    assert counts[retention.BATCHES] == 0
    assert await _table_counts(pool) == before
    assert await _deletes(pool) == {}


async def test_pkgq_prune_dry_run_then_prune_from_the_command_line(
    settings: Settings, pool: asyncpg.Pool
) -> None:
    """The child process runs with the default retention (PKGQ_RETENTION unset): 7 days."""
    await _populate(pool)
    before = await _table_counts(pool)

    dry = await cli(settings, "prune", "--dry-run", "--json")
    assert dry.returncode == 0, dry.stderr
    report: dict[str, Any] = json.loads(dry.stdout)
    assert report["dry_run"] is True
    assert {k: report[k] for k in EXPECTED} == EXPECTED
    assert await _table_counts(pool) == before

    done = await cli(settings, "prune", "--json")
    assert done.returncode == 0, done.stderr
    report = json.loads(done.stdout)
    assert {k: report[k] for k in EXPECTED} == EXPECTED
    assert (await _table_counts(pool))["inbox"] == before["inbox"] - EXPECTED["inbox"]
