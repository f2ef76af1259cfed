"""Partitioned routes with real processes: replicas share a route's partitions, every user's
events stay in order and are applied once, a killed replica's partitions are taken over, and a
route's partition count can be changed with the documented procedure without losing anything.
"""

from __future__ import annotations

import asyncio
import json
from collections import Counter
from collections.abc import AsyncIterator, Callable

import asyncpg
import pytest
from aio_pika.abc import AbstractRobustConnection

from events.partitioning import partition_of
from events.routes import (
    ALL_EXPIRED,
    PACKAGE_ACTIVATE,
    PACKAGE_EXPIRING,
    PACKAGE_QUEUING,
    ROUTES,
    USAGE_RECORD,
)
from infra.rabbit.connection import connect
from infra.rabbit.topology import declare_all, delete_all
from infra.settings import Settings
from tests.e2e.workload import USERS, Workload
from tests.support.observing import eventually
from tests.support.processes import PkgqProcess, cli

pytestmark = pytest.mark.e2e

FOUR = {name: 4 for name in ROUTES}


def env_for(settings: Settings, **extra: str) -> dict[str, str]:
    return {
        "PKGQ_PARTITIONS": json.dumps(settings.partitions),
        "PKGQ_STANDBY_DELAY": str(settings.standby_delay),
        **extra,
    }


@pytest.fixture
async def four(settings: Settings, amqp: AbstractRobustConnection) -> AsyncIterator[Settings]:
    """The test's namespace with every route split into four partitions."""
    parted = settings.model_copy(update={"partitions": FOUR, "standby_delay": 4.0})
    async with declared(parted, amqp):
        yield parted


class declared:  # noqa: N801  (used as a context manager, like contextlib's)
    def __init__(self, settings: Settings, amqp: AbstractRobustConnection) -> None:
        self.settings = settings
        self.amqp = amqp

    async def __aenter__(self) -> Settings:
        channel = await self.amqp.channel()
        await declare_all(channel, self.settings)
        await channel.close()
        return self.settings

    async def __aexit__(self, *_: object) -> None:
        connection = await connect(self.settings.amqp_url, "pkgq-test-cleanup")
        try:
            await delete_all(await connection.channel(), self.settings)
        finally:
            await connection.close()


async def wait_logged(process: PkgqProcess, event: str, within: float = 30) -> None:
    async def logged() -> bool:
        return f'"event": "{event}"' in process.logs()

    logged.__qualname__ = f"{' '.join(process.args)} logged {event}"
    await eventually(logged, within=within)


async def lifecycle_exact(pool: asyncpg.Pool, workloads: list[Workload]) -> None:
    """Every user's lifecycle events were emitted exactly as often as the reference says."""
    expected = Counter[tuple[str, str]]()
    for workload in workloads:
        for plan in workload.plans:
            _, activations, expirations, all_expired, _ = plan.expected()
            expected[(str(plan.user), PACKAGE_ACTIVATE.name)] = activations
            expected[(str(plan.user), PACKAGE_EXPIRING.name)] = expirations
            expected[(str(plan.user), ALL_EXPIRED.name)] = all_expired

    async def emitted() -> Counter[tuple[str, str]]:
        async with pool.acquire() as conn:
            rows = await conn.fetch(
                "SELECT user_id::text AS user, route, count(*) AS n FROM telecom.outbox "
                "WHERE route = ANY($1::text[]) GROUP BY 1, 2",
                [PACKAGE_ACTIVATE.name, PACKAGE_EXPIRING.name, ALL_EXPIRED.name],
            )
        return Counter({(r["user"], r["route"]): r["n"] for r in rows})

    async def exact() -> bool:
        return await emitted() == +expected

    await eventually(exact, within=30)


async def test_three_replicas_on_four_partitions_apply_every_users_events_in_order_once(
    four: Settings,
    pool: asyncpg.Pool,
    amqp: AbstractRobustConnection,
    spawn: Callable[..., PkgqProcess],
) -> None:
    workload = await Workload.create(pool, seed=4_3_2026, users=max(USERS, 24))
    # Every replica has users: replica i prefers the partitions p with p % 3 == i.
    assert {partition_of(u, 4) % 3 for u in workload.users} == {0, 1, 2}
    spawn("relay", **env_for(four))
    replicas = [spawn("run", "--replica", f"{i}/3", **env_for(four)) for i in range(3)]
    await asyncio.gather(*(wait_logged(r, "standing_by") for r in replicas))

    await workload.send_purchases(four, amqp)
    await workload.wait_all_queued(pool)
    await workload.send_usage(four, amqp)
    await workload.wait_end_state(pool)  # depends on every user's usage applied in order
    await lifecycle_exact(pool, [workload])
    for replica in replicas:
        assert replica.terminate() == 0, replica.logs()
        # Each replica did a share of the work; if not, every replica's lines but those of
        # its messages (when each subscribed, lost a connection, ...) say why.
        assert '"event": "processed"' in replica.logs(), [
            f"{i}: {line}"
            for i, r in enumerate(replicas)
            for line in r.logs().splitlines()
            if '"event": "processed"' not in line
        ]


async def test_a_killed_replicas_partitions_are_taken_over_and_the_end_state_is_exact(
    four: Settings,
    pool: asyncpg.Pool,
    amqp: AbstractRobustConnection,
    spawn: Callable[..., PkgqProcess],
) -> None:
    workload = await Workload.create(pool, seed=5_3_2026, users=max(USERS, 24))
    spawn("relay", **env_for(four))
    replicas = [spawn("run", "--replica", f"{i}/3", **env_for(four)) for i in range(3)]
    await asyncio.gather(*(wait_logged(r, "standing_by") for r in replicas))

    await workload.send_purchases(four, amqp)
    await workload.wait_all_queued(pool)
    sending = asyncio.create_task(workload.send_usage(four, amqp))

    async def some_usage_applied() -> bool:
        async with pool.acquire() as conn:
            applied = await conn.fetchval(
                "SELECT count(*) FROM telecom.inbox WHERE consumer = 'usage_record'"
            )
        return bool(applied >= 10)

    await eventually(some_usage_applied)
    replicas[0].kill()  # mid-run: partitions 0 and 3 of every route lose their consumer
    await sending
    await workload.wait_end_state(pool)
    await lifecycle_exact(pool, [workload])
    for replica in replicas[1:]:
        assert replica.terminate() == 0, replica.logs()


async def test_changing_the_partition_count_of_an_outbox_fed_route_holds_and_loses_nothing(
    settings: Settings,
    pool: asyncpg.Pool,
    amqp: AbstractRobustConnection,
    spawn: Callable[..., PkgqProcess],
) -> None:
    route = PACKAGE_QUEUING.name  # fed by the outbox: its rows wait while it is paused
    two = settings.model_copy(update={"partitions": {route: 2}})
    four = settings.model_copy(update={"partitions": {route: 4}})
    before = await Workload.create(pool, seed=6_3_2026, users=12)
    during = await Workload.create(pool, seed=7_3_2026, users=12)
    async with declared(two, amqp), declared(four, amqp):
        relay = spawn("relay", **env_for(two))
        run = spawn("run", **env_for(two))
        await before.send_purchases(two, amqp)
        await before.wait_all_queued(pool)

        # 1. Pause the route: its outbox rows wait, in order, instead of going to 2 queues.
        paused = await cli(two, "partitions", "pause", "package_queuing")
        assert paused.returncode == 0, paused.stderr
        await during.send_purchases(two, amqp)

        # 2. Wait until the route's queues are drained, with its rows held in the outbox.
        async def drained_and_held() -> bool:
            done = await cli(two, "partitions", "status", "package_queuing", "--json")
            state = json.loads(done.stdout)
            return state["pending"] > 0 and all(q["ready"] == 0 for q in state["queues"])

        await eventually(drained_and_held, within=30)
        # 3. Stop the consumers and relays (a graceful stop returns anything in hand).
        assert run.terminate() == 0, run.logs()
        assert relay.terminate() == 0, relay.logs()
        stopped = json.loads(
            (await cli(two, "partitions", "status", "package_queuing", "--json")).stdout
        )
        assert [q["ready"] for q in stopped["queues"]] == [0, 0]

        # 4. Start everything with the new count, then resume the route.
        spawn("relay", **env_for(four))
        spawn("run", **env_for(four))
        resumed = await cli(four, "partitions", "resume", "package_queuing")
        assert resumed.returncode == 0, resumed.stderr
        await during.wait_all_queued(pool)
        await before.send_usage(four, amqp)
        await during.send_usage(four, amqp)
        await before.wait_end_state(pool)
        await during.wait_end_state(pool)
        await lifecycle_exact(pool, [before, during])
        after = json.loads(
            (await cli(four, "partitions", "status", "package_queuing", "--json")).stdout
        )
        assert after["pending"] == 0
        assert [q["ready"] for q in after["queues"]] == [0, 0, 0, 0]


async def test_changing_an_order_sensitive_routes_partition_count_keeps_every_users_order(
    settings: Settings,
    pool: asyncpg.Pool,
    amqp: AbstractRobustConnection,
    spawn: Callable[..., PkgqProcess],
) -> None:
    # usage_record is fed from outside and order-sensitive (which item a usage bills depends on
    # what came before it). Users move between queues when 2 partitions become 4.
    two = settings.model_copy(update={"partitions": {USAGE_RECORD.name: 2}})
    four = settings.model_copy(update={"partitions": {USAGE_RECORD.name: 4}})
    workload = await Workload.create(pool, seed=8_3_2026, users=max(USERS, 16))
    async with declared(two, amqp), declared(four, amqp):
        spawn("relay", **env_for(two))
        run = spawn("run", **env_for(two))
        await workload.send_purchases(two, amqp)
        await workload.wait_all_queued(pool)
        await workload.send_usage(two, amqp, part=(0.0, 0.5))  # then the publishers stop

        async def drained() -> bool:
            done = await cli(two, "partitions", "status", "usage_record", "--json")
            return all(q["ready"] == 0 for q in json.loads(done.stdout)["queues"])

        await eventually(drained, within=30)
        assert run.terminate() == 0, run.logs()
        assert await drained()
        spawn("run", **env_for(four))
        await workload.send_usage(four, amqp, part=(0.5, 1.0))
        await workload.wait_end_state(pool)  # every user's usage applied in order
        await lifecycle_exact(pool, [workload])
