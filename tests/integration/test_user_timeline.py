"""A user's timeline (infra/postgres/timeline.py) and the message search
(infra/postgres/message_search.py) over rows in every table they read: one order across the
sources, a keyset cursor that pages through all of it once, nothing of another user's, every
place a message_id is kept found, and plans that read the big tables through indexes."""

from __future__ import annotations

from datetime import datetime
from uuid import uuid4

import asyncpg

from consumers import timeline_view
from infra.postgres import message_search, timeline
from infra.settings import Settings
from tests.support.deliveries import add_package
from tests.support.timeline_story import story

SOURCES = set(timeline.RANKS)


async def test_a_users_timeline_has_every_source_newest_first_and_pages_through_all_of_it_once(
    pool: asyncpg.Pool,
) -> None:
    package = await add_package(pool, 1000, name="1 kB")
    user, other = uuid4(), uuid4()
    t0 = datetime.fromisoformat("2026-01-02T03:04:05.123456+00:00")
    async with pool.acquire() as conn:
        await story(conn, user, package, t0)
        await story(conn, other, package, t0)  # interleaved in time with the user's own
        whole = await timeline.page(conn, user, None, 100)
        pages: list[timeline.Entry] = []
        after = None
        while True:
            found = await timeline.page(conn, user, after, 3)
            pages += found.entries
            if not found.more:
                break
            after = timeline.position_of(found.entries[-1].position.cursor())
    assert not whole.more
    assert {e.source for e in whole.entries} == SOURCES
    assert [(e.source, e.kind) for e in whole.entries] == [
        ("audit", "cancel"),
        ("parked", "parked"),
        ("hold", "held_retrying"),
        # one instant, cause before effect: the operator's replay, its dead letter marked, the
        # outbox row that sends it again (newest first, so in reverse)
        ("outbox", "replay"),
        ("dead_letter", "replayed"),
        ("operator", "replay"),
        ("dead_letter", "dead_lettered"),
        ("usage", "billed"),
        ("activation", "activated"),
        ("item", "created"),
        ("inbox", "received"),
    ]
    assert [e.at for e in whole.entries] == sorted((e.at for e in whole.entries), reverse=True)
    assert [e.position for e in pages] == [e.position for e in whole.entries]
    rows = timeline_view.rows(whole.entries)
    replay = next(r for r in rows if r["kind"] == "replay")
    assert replay["dead_letter_id"] == next(
        r["dead_letter_id"] for r in rows if r["kind"] == "dead_lettered"
    )
    assert replay["body"] == '{"package_id": 7}'


async def test_a_message_id_is_found_in_every_place_it_is_kept_and_only_there(
    pool: asyncpg.Pool,
) -> None:
    package = await add_package(pool, 1000, name="1 kB")
    user = uuid4()
    async with pool.acquire() as conn:
        m = await story(conn, user, package, datetime.fromisoformat("2026-01-02T03:04:05+00:00"))
        await story(conn, uuid4(), package, datetime.fromisoformat("2026-01-02T03:04:05+00:00"))
        found = await message_search.find(conn, m)
        nowhere = await message_search.find(conn, uuid4())
    assert sorted(p.place for p in found) == sorted(
        [
            "inbox",
            "outbox",
            "parked",
            "hold",
            "attempts",
            "dead_letter",
            "audit",
            "operator",
            "usage",
        ]
    )
    assert {p.user_id for p in found if p.user_id} == {user}
    dead = next(p for p in found if p.place == "dead_letter")
    assert dead.state == "replayed"
    assert next(p for p in found if p.place == "outbox").dead_letter_id == dead.dead_letter_id
    assert nowhere == []


async def test_the_timeline_and_the_search_read_big_tables_through_indexes(
    settings: Settings, pool: asyncpg.Pool
) -> None:
    package = await add_package(pool, 1000, name="1 kB")
    owner = await asyncpg.connect(settings.owner_dsn())
    try:
        # 2,000 users with 20 outbox and inbox rows each and a few rows in every other table:
        # enough for the planner to prefer a scan of everything if an index were missing.
        await owner.execute(
            """
            WITH u AS (SELECT gen_random_uuid() AS user_id FROM generate_series(1, 2000)),
            o AS (
                INSERT INTO telecom.outbox (message_id, route, message_type, schema_version,
                                            user_id, body, published_at)
                SELECT gen_random_uuid(), 'telecom.package_activate', 'PackageActivateEvent', 1,
                       user_id, '\\x7b7d', now() FROM u, generate_series(1, 20)
            ), i AS (
                INSERT INTO telecom.inbox (consumer, message_id, user_id, processed_at)
                SELECT 'package_activate', gen_random_uuid(), user_id,
                       now() - g * interval '1 minute' FROM u, generate_series(1, 20) AS g
            ), q AS (
                INSERT INTO telecom.package_queue (user_id, package_id, status, activated_at)
                SELECT user_id, $1, 'consumed', now() FROM u, generate_series(1, 3)
                RETURNING id, user_id
            ), a AS (
                INSERT INTO telecom.item_audit (item_id, user_id, action, message_id)
                SELECT id, user_id, 'cancel', gen_random_uuid() FROM q
            ), b AS (
                INSERT INTO telecom.usage_billed (user_id, usage_id, message_id, item_id, upload,
                                                  download, keep_until)
                SELECT user_id, 'u' || id, gen_random_uuid(), id, 1, 1, now() + interval '1 day'
                FROM q
            ), d AS (
                INSERT INTO telecom.dead_letters (dedup_key, source, route, consumer, message_id,
                    message_uuid, user_id, body, reason, error_type, error_message)
                SELECT 'big:' || id, 'consumer', 'telecom.usage_record', 'usage_record',
                       gen_random_uuid()::text, gen_random_uuid(), user_id, '\\x7b7d',
                       'handler_error', 'E', 'e' FROM q
            ), h AS (
                INSERT INTO telecom.holds (consumer, user_id, blocker, state)
                SELECT 'usage_record', user_id, gen_random_uuid(), 'retrying' FROM u
            ), t AS (
                INSERT INTO telecom.attempts (consumer, message_id, attempts, last_claim)
                SELECT 'usage_record', gen_random_uuid(), 1, 0 FROM u
            ), p AS (
                INSERT INTO telecom.parked (consumer, user_id, message_id, route, message_type,
                                            body)
                SELECT 'usage_record', user_id, gen_random_uuid(), 'telecom.usage_record',
                       'RecordUsage', '\\x7b7d' FROM u
            )
            INSERT INTO telecom.operator_actions (actor, action, user_id, message_id)
            SELECT 'cli:bench', 'replay', user_id, gen_random_uuid() FROM u
            """,
            package,
        )
        await owner.execute(
            "ANALYZE telecom.outbox, telecom.inbox, telecom.package_queue, telecom.item_audit, "
            "telecom.usage_billed, telecom.dead_letters, telecom.holds, telecom.attempts, "
            "telecom.parked, telecom.operator_actions"
        )
        user = await owner.fetchval("SELECT user_id FROM telecom.outbox LIMIT 1")
        message = await owner.fetchval("SELECT message_id FROM telecom.outbox LIMIT 1")
        plans = {
            "timeline": await timeline.explain(owner, user, 50),
            "search": await message_search.explain(owner, message),
        }
    finally:
        await owner.close()
    for name, plan in plans.items():
        assert "Seq Scan" not in plan, f"{name}:\n{plan}"
    # the two tables that grow by millions: a backward range of the user's own index
    for index in ("outbox_user", "inbox_user"):
        assert index in plans["timeline"], plans["timeline"]
    for index in ("outbox_message_id", "inbox_pkey", "dead_letters_message"):
        assert index in plans["search"], plans["search"]
