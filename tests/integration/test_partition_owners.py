"""The records elastic replicas share a route's partitions through (infra/postgres/
partition_owners.py): who is a live replica of a route, and who owns which partition since
when; and what `pkgq workers` and the console's workers page show of it."""

from __future__ import annotations

import json
from uuid import UUID, uuid4

import asyncpg

from infra.postgres import partition_owners, workers
from infra.settings import Settings
from tests.support.processes import cli

ROUTE = "telecom.usage_record"


async def _replica(pool: asyncpg.Pool, name: str, *, heartbeat_age_s: float = 0) -> UUID:
    worker_id = uuid4()
    async with pool.acquire() as conn:
        await workers.register(conn, worker_id, name, "run", "host", 4242)
        await partition_owners.join(conn, worker_id, [ROUTE])
        await conn.execute(
            "UPDATE telecom.workers SET heartbeat_at = now() - make_interval(secs => $2) "
            "WHERE id = $1",
            worker_id,
            float(heartbeat_age_s),
        )
    return worker_id


async def test_live_replicas_are_the_members_with_a_fresh_heartbeat_and_reading_renews_ones_own(
    pool: asyncpg.Pool,
) -> None:
    me = await _replica(pool, "me", heartbeat_age_s=60)  # renewed by the read itself
    fresh = await _replica(pool, "fresh", heartbeat_age_s=1)
    await _replica(pool, "aged", heartbeat_age_s=10)
    stopped = await _replica(pool, "stopped")
    async with pool.acquire() as conn:
        await workers.stop(conn, stopped, "exited")
        live = await partition_owners.live_replicas(conn, me, [ROUTE, "telecom.other"], 3.0)
        age = await conn.fetchval(
            "SELECT extract(epoch FROM now() - heartbeat_at) FROM telecom.workers WHERE id = $1",
            me,
        )
    assert live.beaten
    assert sorted(live.replicas[ROUTE]) == sorted([me, fresh])  # not aged, not stopped
    assert live.replicas["telecom.other"] == []
    assert age < 5


async def test_a_stopped_worker_reading_is_told_it_is_not_live(pool: asyncpg.Pool) -> None:
    me = await _replica(pool, "me")
    other = await _replica(pool, "other")
    async with pool.acquire() as conn:
        await workers.stop(conn, me, "stale: reaped")
        live = await partition_owners.live_replicas(conn, me, [ROUTE], 3.0)
    assert not live.beaten
    assert live.replicas[ROUTE] == [other]


async def test_an_owner_keeps_its_since_and_a_new_owner_replaces_it_whatever_the_old_releases(
    pool: asyncpg.Pool,
) -> None:
    old = await _replica(pool, "old")
    new = await _replica(pool, "new")
    async with pool.acquire() as conn:
        await partition_owners.claim(conn, old, ROUTE, [0, 1])
        first = {o.partition: o.since for o in await partition_owners.owners(conn)}
        await partition_owners.claim(conn, old, ROUTE, [0])  # again: nothing changes
        await partition_owners.claim(conn, new, ROUTE, [1])  # the new owner took it first
        await partition_owners.release(conn, old, ROUTE, [1])  # the old one's release
        found = await partition_owners.owners(conn)
    assert [(o.partition, o.worker, o.owner_alive) for o in found] == [
        (0, "old", True),
        (1, "new", True),
    ]
    assert found[0].since == first[0]


async def test_a_replica_that_leaves_is_a_member_of_nothing_and_owns_nothing(
    pool: asyncpg.Pool,
) -> None:
    leaving = await _replica(pool, "leaving")
    staying = await _replica(pool, "staying")
    async with pool.acquire() as conn:
        await partition_owners.claim(conn, leaving, ROUTE, [0, 2])
        await partition_owners.claim(conn, staying, ROUTE, [1])
        await partition_owners.leave(conn, leaving)
        live = await partition_owners.live_replicas(conn, staying, [ROUTE], 3.0)
        found = await partition_owners.owners(conn)
    assert live.replicas[ROUTE] == [staying]
    assert [(o.partition, o.worker) for o in found] == [(1, "staying")]


async def test_pkgq_workers_shows_each_workers_partitions_and_since_when(
    settings: Settings, pool: asyncpg.Pool
) -> None:
    owner = await _replica(pool, "pkgq-run@host:4242")
    async with pool.acquire() as conn:
        await partition_owners.claim(conn, owner, ROUTE, [3, 5])
    shown = await cli(settings, "workers", "--json")
    assert shown.returncode == 0, shown.stderr
    [row] = [w for w in json.loads(shown.stdout) if w["id"] == str(owner)]
    assert [(p["route"], p["partition"]) for p in row["partitions"]] == [(ROUTE, 3), (ROUTE, 5)]
    assert all(p["since"] for p in row["partitions"])
    table = await cli(settings, "workers")
    assert "usage_record" in table.stdout
    assert "pkgq-run@host:4242" in table.stdout
