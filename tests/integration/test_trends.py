"""Trends: the per-minute snapshots the relays take and the buckets the overview's
charts draw from them (infra/postgres/trends.py): counts land in their minute and route, quiet
minutes are zeros, the day's window sums 5-minute buckets, retention keeps a day at least, and
with a million outbox rows (PKGQ_BIG_ROWS) every read goes through an index."""

from __future__ import annotations

import json
import os
from datetime import datetime, timedelta
from typing import Any

import asyncpg
from asyncpg.connection import LoggedQuery

from infra.postgres import retention, transitions, trends
from infra.postgres.pool import Conn, create_pool
from infra.settings import Settings
from tests.support.observing import fetch

USAGE, PURCHASE = "telecom.usage_record", "telecom.package_purchase"
ROUTES = ((USAGE, "usage_record"), (PURCHASE, "package_purchase"))


async def _snapshot_as_of(conn: Conn, minute: datetime | None) -> datetime:
    """Take this minute's snapshot, then file it under `minute` (None: leave it where it is),
    as if it had been taken then. Returns the minute it is filed under."""
    assert await trends.snapshot(conn, ROUTES)
    taken: datetime = await conn.fetchval("SELECT max(minute) FROM telecom.route_minutes")
    if minute is not None:
        await conn.execute(
            "UPDATE telecom.route_minutes SET minute = $1 WHERE minute = $2", minute, taken
        )
        return minute
    return taken


def _at(found: trends.Trends, minute: datetime) -> int:
    return found.buckets.index(minute)


async def test_counts_land_in_their_minute_per_route_and_quiet_minutes_are_zero(
    pool: asyncpg.Pool,
) -> None:
    async with pool.acquire() as conn:
        base: datetime = await conn.fetchval("SELECT date_trunc('minute', now())")
        first = await _snapshot_as_of(conn, base - timedelta(minutes=3))
        await transitions.count(
            conn,
            {
                (USAGE, "ack"): 5,
                (USAGE, "release"): 2,
                (PURCHASE, "ack"): 2,
                (PURCHASE, "bury"): 1,
                (PURCHASE, "take"): 3,
            },
        )
        second = await _snapshot_as_of(conn, base - timedelta(minutes=2))
        third = await _snapshot_as_of(conn, base - timedelta(minutes=1))  # a quiet minute
        await transitions.count(conn, {(USAGE, "ack"): 3, (USAGE, "ttl"): 1})
        last = await _snapshot_as_of(conn, None)  # this minute's: the live totals run on
        await transitions.count(conn, {(USAGE, "ack"): 1})
        await conn.execute(
            "INSERT INTO telecom.outbox (message_id, route, message_type, schema_version, body, "
            "available_at) VALUES (gen_random_uuid(), $1, 'X', 1, '{}', "
            "now() - interval '90 seconds')",
            PURCHASE,
        )
        await conn.execute(
            "INSERT INTO telecom.parked (consumer, user_id, message_id, route, message_type, "
            "body) SELECT 'usage_record', gen_random_uuid(), gen_random_uuid(), $1, 'X', '{}' "
            "FROM generate_series(1, 2)",
            USAGE,
        )
        found = await trends.read(conn, trends.WINDOWS["1h"], ROUTES)

    assert len(found.buckets) == 60
    assert [b - a for a, b in zip(found.buckets, found.buckets[1:], strict=False)] == [
        timedelta(minutes=1)
    ] * 59
    usage, purchase = found.routes[USAGE], found.routes[PURCHASE]
    assert usage.processed[_at(found, first)] == 5
    assert usage.failed[_at(found, first)] == 2  # release: a retry scheduled
    assert purchase.processed[_at(found, first)] == 2
    assert purchase.failed[_at(found, first)] == 1  # bury
    assert purchase.dead_lettered[_at(found, first)] == 1
    assert usage.processed[_at(found, second)] == 0  # a quiet minute
    assert usage.processed[_at(found, third)] == 3
    assert usage.dead_lettered[_at(found, third)] == 1  # ttl: expired into the store
    assert usage.failed[_at(found, third)] == 0
    assert usage.processed[_at(found, last)] == 1  # the current minute, live
    # Before the first snapshot: zeros, and no gauge (nobody looked).
    before = _at(found, first) - 1
    assert (usage.processed[before], usage.failed[before], usage.parked[before]) == (0, 0, None)
    assert sum(usage.processed) == 9
    assert sum(purchase.processed) == 2
    # The gauges of the last bucket are the live ones: the purchase's due row, 90 s old, and
    # the usage records parked.
    assert purchase.outbox_pending[-1] == 1
    assert (purchase.outbox_lag_s[-1] or 0) >= 89
    assert usage.outbox_pending[-1] == 0
    assert (usage.parked[-1], purchase.parked[-1]) == (2, 0)  # parked by its consumer


async def test_a_minute_is_snapshotted_once_whoever_asks(pool: asyncpg.Pool) -> None:
    async with pool.acquire() as conn:
        took = [await trends.snapshot(conn, ROUTES) for _ in range(3)]
    rows = await fetch(pool, "SELECT minute, route, acked FROM telecom.route_minutes")
    # Three tries within a minute write one snapshot; across a minute's turn, two.
    assert took[0] is True
    assert len(rows) == len(ROUTES) * sum(took)
    assert {r["route"] for r in rows} == {USAGE, PURCHASE}


async def test_the_day_window_sums_five_minute_buckets_and_keeps_the_largest_gauge(
    pool: asyncpg.Pool,
) -> None:
    async with pool.acquire() as conn:
        anchor: datetime = await conn.fetchval(
            "SELECT date_bin('5 minutes', now(), timestamptz 'epoch') - interval '15 minutes'"
        )
        for offset, acked, parked in ((0, 0, 1), (1, 10, 3), (4, 15, 2), (5, 40, 0), (6, 40, 0)):
            await conn.execute(
                "INSERT INTO telecom.route_minutes (minute, route, acked, failed, "
                "dead_lettered, parked, outbox_pending, outbox_lag_s) "
                "VALUES ($1, $2, $3, 0, 0, $4, 0, 0)",
                anchor + timedelta(minutes=offset),
                USAGE,
                acked,
                parked,
            )
        await transitions.count(conn, {(USAGE, "ack"): 42})
        day = await trends.read(conn, trends.WINDOWS["1d"], ROUTES)
        hour = await trends.read(conn, trends.WINDOWS["1h"], ROUTES)

    assert len(day.buckets) == 288
    assert day.buckets[1] - day.buckets[0] == timedelta(minutes=5)
    usage = day.routes[USAGE]
    assert usage.processed[_at(day, anchor)] == 10 + 5 + 25
    assert usage.parked[_at(day, anchor)] == 3  # the largest of the bucket's snapshots
    assert usage.processed[_at(day, anchor + timedelta(minutes=5))] == 2  # 42 live - 40
    assert sum(usage.processed) == 42
    assert sum(day.routes[PURCHASE].processed) == 0
    by_minute = hour.routes[USAGE].processed
    assert [by_minute[_at(hour, anchor + timedelta(minutes=m))] for m in range(7)] == [
        10,
        5,
        0,
        0,
        25,
        0,
        2,
    ]


async def test_retention_prunes_snapshots_but_keeps_the_last_day(pool: asyncpg.Pool) -> None:
    async with pool.acquire() as conn:
        for hours in (2, 24, 26, 200):
            await conn.execute(
                "INSERT INTO telecom.route_minutes (minute, route, acked, failed, "
                "dead_lettered, parked, outbox_pending, outbox_lag_s) "
                "VALUES (date_trunc('minute', now() - make_interval(hours => $1)), $2, "
                "0, 0, 0, 0, 0, 0)",
                hours,
                USAGE,
            )
    counts = await retention.prune(pool, 3600.0, batch_size=10)  # an hour's retention
    assert counts["route_minutes"] == 2
    kept = await fetch(
        pool,
        "SELECT round(extract(epoch FROM now() - minute) / 3600) AS hours "
        "FROM telecom.route_minutes ORDER BY minute DESC",
    )
    assert [int(r["hours"]) for r in kept] == [2, 24]


class _Logged:
    def __init__(self) -> None:
        self.seen: list[tuple[str, tuple[Any, ...]]] = []

    def __call__(self, record: LoggedQuery) -> None:
        if isinstance(record.args, tuple) and "route_minutes" in record.query:
            self.seen.append((record.query, record.args))


def _nodes(plan: dict[str, Any]) -> list[dict[str, Any]]:
    return [plan, *(n for child in plan.get("Plans", []) for n in _nodes(child))]


BIG_OUTBOX = int(os.environ.get("PKGQ_BIG_ROWS", "200000"))
"""Published outbox rows: 200,000 keeps the suite's time; PKGQ_BIG_ROWS=1000000 makes them a
million (the plans are the same: the unpublished rows' partial index does not grow with them)."""
SCANS = ("Seq Scan", "Parallel Seq Scan", "Bitmap Heap Scan")


async def test_with_a_big_outbox_the_trends_read_and_snapshot_use_indexes_only(
    settings: Settings, pool: asyncpg.Pool
) -> None:
    async with pool.acquire() as conn:
        await conn.execute("SET session_replication_role = replica")  # as a restore would
        await conn.execute(
            "INSERT INTO telecom.outbox (message_id, route, message_type, schema_version, "
            "user_id, body, available_at, published_at) "
            "SELECT gen_random_uuid(), ($2::text[])[1 + g % 9], 'Filled', 1, gen_random_uuid(), "
            "'{}', now() - interval '1 hour', now() - (g % 3600) * interval '1 second' "
            "FROM generate_series(1, $1) AS g",
            BIG_OUTBOX,
            [route for route, _ in trends.CHARTED],
        )
        await conn.execute(
            "INSERT INTO telecom.parked (consumer, user_id, message_id, route, message_type, "
            "body) SELECT ($2::text[])[1 + g % 9], gen_random_uuid(), gen_random_uuid(), "
            "'telecom.x', 'X', '{}' FROM generate_series(1, $1) AS g",
            50_000,
            [consumer for _, consumer in trends.CHARTED],
        )
        # A week of snapshots of every route (the default retention keeps that many).
        await conn.execute(
            "INSERT INTO telecom.route_minutes (minute, route, acked, failed, dead_lettered, "
            "parked, outbox_pending, outbox_lag_s) "
            "SELECT date_trunc('minute', now()) - m * interval '1 minute', r, m, 0, 0, 0, 0, 0 "
            "FROM generate_series(1, 7 * 1440) AS m, unnest($1::text[]) AS r",
            [route for route, _ in trends.CHARTED],
        )
        await conn.execute("RESET session_replication_role")
        await conn.execute("VACUUM ANALYZE telecom.outbox, telecom.parked, telecom.route_minutes")

    logged = _Logged()
    reader = await create_pool(settings.postgres_dsn, min_size=1, max_size=1, query_logger=logged)
    try:
        async with reader.acquire() as conn:
            for window in trends.WINDOWS.values():
                day = await trends.read(conn, window)
            assert await trends.snapshot(conn)
    finally:
        await reader.close()
    assert len(day.buckets) == 288
    assert len(logged.seen) == 3

    plans = []
    async with pool.acquire() as conn:
        for query, args in logged.seen:
            found = json.loads(await conn.fetchval("EXPLAIN (FORMAT JSON) " + query, *args))
            plans.append(found[0]["Plan"])
    nodes = [node for plan in plans for node in _nodes(plan)]
    # The big tables only through an index; the snapshots through their key's range of the
    # window (a bitmap of that range, or an index scan), never whole.
    scanned = [
        (node["Node Type"], node.get("Relation Name"))
        for node in nodes
        if node["Node Type"] in SCANS and node.get("Relation Name") in ("outbox", "parked")
    ]
    assert scanned == []
    snapshots = [
        n for n in nodes if n.get("Relation Name") == "route_minutes" and "Scan" in n["Node Type"]
    ]
    assert [n for n in snapshots if n["Node Type"] in ("Seq Scan", "Parallel Seq Scan")] == []
    # (the two windows' reads and the snapshot's "is this minute taken")
    ranged = [n.get("Recheck Cond", n.get("Index Cond", "")) for n in snapshots]
    assert len(ranged) == 3, ranged
    assert all("minute" in cond for cond in ranged), ranged
    read = {
        node.get("Relation Name")
        for plan in plans
        for node in _nodes(plan)
        if node["Node Type"] in ("Index Scan", "Index Only Scan", "Bitmap Index Scan")
    }
    assert {"outbox", "parked", "route_minutes"} <= read
