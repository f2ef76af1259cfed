"""The invariants checked in production (infra/postgres/invariants.py), each against a
violation made by hand in the real database and against the look-alikes that are fine; and the
relay's periodic run of them (infra/outbox/invariant_watch.py): stored, and exported as
pkgq_invariant_violations."""

from __future__ import annotations

import asyncio
from typing import Any
from uuid import UUID, uuid4

import asyncpg
from prometheus_client import REGISTRY

from infra.outbox import invariant_watch
from infra.outbox.housekeeping import housekeeping_forever
from infra.postgres import invariants
from infra.settings import Settings
from tests.support.dead_letters import buried
from tests.support.observing import eventually


async def found(pool: asyncpg.Pool, name: str) -> invariants.Result:
    async with pool.acquire() as conn:
        return await invariants.run(conn, invariants.BY_NAME[name])


async def orphaned_hold(
    pool: asyncpg.Pool, consumer: str = "usage_record", blocker: UUID | None = None
) -> tuple[UUID, UUID]:
    """A hold made by hand on a random blocker (no outbox row, no dead letter): (user, blocker)."""
    user, blocker = uuid4(), blocker or uuid4()
    async with pool.acquire() as conn:
        await conn.execute(
            "INSERT INTO telecom.holds (consumer, user_id, blocker, state, attempts) "
            "VALUES ($1, $2, $3, 'retrying', 2)",
            consumer,
            user,
            blocker,
        )
    return user, blocker


async def outbox_row(
    pool: asyncpg.Pool, message_id: UUID, published_ago_s: float | None, user: UUID
) -> None:
    """An outbox row of `message_id` for `user` on the usage route: pending (None), or
    published that many seconds ago."""
    async with pool.acquire() as conn:
        await conn.execute(
            "INSERT INTO telecom.outbox (message_id, route, message_type, schema_version, body, "
            "published_at, user_id) VALUES ($1, 'telecom.usage_record', 'RecordUsage', 1, '{}', "
            "CASE WHEN $2::float8 IS NULL THEN NULL "
            "ELSE now() - make_interval(secs => $2::float8) END, $3)",
            message_id,
            published_ago_s,
            user,
        )


async def execute(pool: asyncpg.Pool, sql: str, *args: Any) -> None:
    async with pool.acquire() as conn:
        await conn.execute(sql, *args)


async def test_every_invariant_holds_on_a_fresh_database(pool: asyncpg.Pool) -> None:
    async with pool.acquire() as conn:
        results = await invariants.run_all(conn)
    assert [r.check for r in results] == [c.name for c in invariants.CHECKS]
    assert all(r.ok and r.sample == [] for r in results), results


async def test_a_hold_on_a_blocker_with_no_retry_and_no_dead_letter_has_no_way_out(
    pool: asyncpg.Pool,
) -> None:
    user, blocker = await orphaned_hold(pool)
    result = await found(pool, "hold_without_way_out")
    assert result.violations == 1
    (row,) = result.sample
    assert (row["consumer"], row["user_id"], row["blocker"]) == (
        "usage_record",
        str(user),
        str(blocker),
    )
    assert row["state"] == "retrying"


async def test_a_hold_with_a_pending_or_fresh_retry_or_a_buried_dead_letter_has_a_way_out(
    pool: asyncpg.Pool,
) -> None:
    user, pending = await orphaned_hold(pool)
    await outbox_row(pool, pending, None, user)
    user, fresh = await orphaned_hold(pool)
    await outbox_row(pool, fresh, 60, user)  # on the broker, waiting for its consumer
    user, dead = await orphaned_hold(pool)
    await buried(pool, message_id=str(dead).upper(), user_id=user)  # matched as its UUID
    await execute(
        pool,
        "INSERT INTO telecom.holds (consumer, user_id, blocker, state) "
        "VALUES ('usage_record', $1, NULL, 'releasing')",
        uuid4(),
    )
    assert (await found(pool, "hold_without_way_out")).ok


async def test_a_retry_published_long_ago_or_a_dead_letter_elsewhere_is_no_way_out(
    pool: asyncpg.Pool,
) -> None:
    user, stale = await orphaned_hold(pool)
    await outbox_row(pool, stale, invariants.OUTBOX_GRACE_S + 60, user)
    user, elsewhere = await orphaned_hold(pool)
    await buried(pool, "telecom.package_cancel", message_id=str(elsewhere), user_id=user)
    user, discarded = await orphaned_hold(pool)
    dead_id = await buried(pool, message_id=str(discarded), user_id=user)
    await execute(
        pool, "UPDATE telecom.dead_letters SET status = 'discarded' WHERE id = $1", dead_id
    )
    # Another user's message of the same id would release nothing: no way out either.
    _, theirs_buried = await orphaned_hold(pool)
    await buried(pool, message_id=str(theirs_buried), user_id=uuid4())
    _, theirs_pending = await orphaned_hold(pool)
    await outbox_row(pool, theirs_pending, None, uuid4())
    result = await found(pool, "hold_without_way_out")
    assert {row["blocker"] for row in result.sample} == {
        str(stale),
        str(elsewhere),
        str(discarded),
        str(theirs_buried),
        str(theirs_pending),
    }


async def test_the_sample_is_capped_but_the_count_is_of_every_violation(
    pool: asyncpg.Pool,
) -> None:
    for _ in range(invariants.SAMPLE + 5):
        await orphaned_hold(pool)
    result = await found(pool, "hold_without_way_out")
    assert result.violations == invariants.SAMPLE + 5
    assert len(result.sample) == invariants.SAMPLE


async def park(pool: asyncpg.Pool, consumer: str, user: UUID, message_id: UUID) -> None:
    await execute(
        pool,
        "INSERT INTO telecom.parked (consumer, user_id, message_id, route, message_type, body) "
        "VALUES ($1, $2, $3, 'telecom.usage_record', 'RecordUsage', '{}')",
        consumer,
        user,
        message_id,
    )


async def test_a_parked_message_without_a_hold_on_its_consumer_and_user_is_found(
    pool: asyncpg.Pool,
) -> None:
    held_user, _ = await orphaned_hold(pool, "usage_record")
    await park(pool, "usage_record", held_user, uuid4())  # behind its hold: fine
    lost = uuid4()
    await park(pool, "package_cancel", held_user, lost)  # no hold on that consumer
    result = await found(pool, "parked_without_hold")
    assert result.violations == 1
    assert result.sample[0]["message_id"] == str(lost)
    assert result.sample[0]["consumer"] == "package_cancel"


async def failed(pool: asyncpg.Pool, message_id: UUID, ago_s: float = 300) -> None:
    """An attempts row: the message failed once on usage_record, `ago_s` seconds ago."""
    await execute(
        pool,
        "INSERT INTO telecom.attempts (consumer, message_id, attempts, last_claim, last_at) "
        "VALUES ('usage_record', $1, 1, 1, now() - make_interval(secs => $2::float8))",
        message_id,
        ago_s,
    )


async def test_a_failed_message_that_is_nowhere_now_is_unaccounted(pool: asyncpg.Pool) -> None:
    lost = uuid4()
    await failed(pool, lost)
    await failed(pool, uuid4(), ago_s=1)  # a batch may still be on it: not yet
    applied = uuid4()
    await failed(pool, applied)
    await execute(
        pool,
        "INSERT INTO telecom.inbox (consumer, message_id) VALUES ('usage_record', $1)",
        applied,
    )
    retrying = uuid4()
    await failed(pool, retrying)
    await outbox_row(pool, retrying, None, uuid4())
    dead = uuid4()
    await failed(pool, dead)
    dead_id = await buried(pool, message_id=str(dead))
    await execute(
        pool, "UPDATE telecom.dead_letters SET status = 'replayed' WHERE id = $1", dead_id
    )
    parked = uuid4()
    await failed(pool, parked)
    user, _ = await orphaned_hold(pool)
    await park(pool, "usage_record", user, parked)
    result = await found(pool, "failed_message_unaccounted")
    assert [row["message_id"] for row in result.sample] == [str(lost)]
    assert result.sample[0]["consumer"] == "usage_record"


async def item(pool: asyncpg.Pool, user: UUID, status: str, upload: int = 0) -> int:
    async with pool.acquire() as conn:
        package = await conn.fetchval(
            "INSERT INTO telecom.packages (name, traffic_limit) VALUES ('p', 1000) RETURNING id"
        )
        activated = "now()" if status != "in_queue" else "NULL"
        return int(
            await conn.fetchval(
                "INSERT INTO telecom.package_queue (user_id, package_id, status, upload, "
                f"activated_at) VALUES ($1, $2, $3::telecom.package_status, $4, {activated}) "
                "RETURNING id",
                user,
                package,
                status,
                upload,
            )
        )


async def test_two_active_items_of_one_user_are_found_once_the_unique_index_is_gone(
    pool: asyncpg.Pool,
) -> None:
    await execute(pool, "DROP INDEX telecom.package_queue_one_active")  # the test's own database
    user = uuid4()
    first, second = await item(pool, user, "active"), await item(pool, user, "active")
    await item(pool, uuid4(), "active")
    result = await found(pool, "more_than_one_active_item")
    assert result.violations == 1
    assert result.sample == [{"user_id": str(user), "active_items": 2, "item_ids": [first, second]}]


async def test_traffic_in_two_places_or_on_an_item_never_activated_breaks_conservation(
    pool: asyncpg.Pool,
) -> None:
    fine = uuid4()  # unbilled traffic with nothing to bill it to; an active item's own traffic
    await execute(
        pool,
        "INSERT INTO telecom.queue_users (user_id, unbilled_upload) VALUES ($1, 7)",
        fine,
    )
    await item(pool, uuid4(), "active", upload=500)
    twice = uuid4()
    await execute(
        pool,
        "INSERT INTO telecom.queue_users (user_id, unbilled_download) VALUES ($1, 3)",
        twice,
    )
    active = await item(pool, twice, "active", upload=10)
    queued_user = uuid4()
    queued = await item(pool, queued_user, "in_queue", upload=5)
    result = await found(pool, "traffic_conservation")
    assert result.violations == 2
    assert {(r["user_id"], r["item_id"], r["rule"]) for r in result.sample} == {
        (str(twice), active, "unbilled traffic while an item is active"),
        (str(queued_user), queued, "traffic on an item never activated"),
    }


async def test_a_usage_record_billed_to_another_users_item_is_found(pool: asyncpg.Pool) -> None:
    owner, other = uuid4(), uuid4()
    mine = await item(pool, owner, "active", upload=5)
    theirs = await item(pool, other, "active", upload=5)
    for user_id, usage_id, item_id in (
        (owner, "right", mine),
        (owner, "unbilled", None),
        (owner, "wrong", theirs),
    ):
        await execute(
            pool,
            "INSERT INTO telecom.usage_billed (user_id, usage_id, message_id, item_id, upload, "
            "download, keep_until) VALUES ($1, $2, $3, $4, 5, 0, now() + interval '1 day')",
            user_id,
            usage_id,
            uuid4(),
            item_id,
        )
    result = await found(pool, "usage_billed_elsewhere")
    assert result.violations == 1
    assert [(r["usage_id"], r["item_id"]) for r in result.sample] == [("wrong", theirs)]


def gauge(check: str) -> float | None:
    return REGISTRY.get_sample_value("pkgq_invariant_violations", {"check": check})


async def test_the_relays_check_stores_the_results_and_sets_the_gauge_per_check(
    pool: asyncpg.Pool,
) -> None:
    user, blocker = await orphaned_hold(pool)
    results = await invariant_watch.check_and_export(pool)
    assert {r.check: r.violations for r in results}["hold_without_way_out"] == 1
    assert gauge("hold_without_way_out") == 1
    assert all(gauge(c.name) == 0 for c in invariants.CHECKS[1:])
    async with pool.acquire() as conn:
        stored = {r.check: r for r in await invariants.stored(conn)}
    assert set(stored) == {c.name for c in invariants.CHECKS}
    hold = stored["hold_without_way_out"]
    assert hold.violations == 1
    assert hold.checked_at is not None
    assert (hold.sample[0]["user_id"], hold.sample[0]["blocker"]) == (str(user), str(blocker))

    # A relay without the lease exports what the holder stored, without checking again.
    await execute(pool, "DELETE FROM telecom.holds")
    invariant_watch.export([invariants.Result("hold_without_way_out", 0)])
    await invariant_watch.export_stored(pool)
    assert gauge("hold_without_way_out") == 1


async def test_the_relays_housekeeping_runs_the_checks_under_their_lease_at_once(
    settings: Settings, pool: asyncpg.Pool
) -> None:
    await orphaned_hold(pool)
    me = uuid4()
    slow = settings.model_copy(
        update={"housekeeping_interval": 3600.0, "invariant_check_interval": 3600.0}
    )
    stop = asyncio.Event()
    task = asyncio.create_task(housekeeping_forever(slow, pool, me, stop))

    async def stored() -> bool:
        async with pool.acquire() as conn:
            return any(not r.ok for r in await invariants.stored(conn))

    try:
        await eventually(stored)  # the first round runs at once; the next in an hour
        async with pool.acquire() as conn:
            holder = await conn.fetchval(
                "SELECT worker_id FROM telecom.leases WHERE name = $1", invariant_watch.LEASE
            )
        assert holder == me
        assert gauge("hold_without_way_out") == 1
    finally:
        stop.set()
        await task
    async with pool.acquire() as conn:  # given up on the way out
        assert await conn.fetchval("SELECT count(*) FROM telecom.leases") == 0
