"""A replica that can no longer read the live replicas (its database unreachable) lets go of
its partitions once it is past the liveness bound: the others already take it for gone and
stand by on them, so holding on would stall them while its batches wait on a database it cannot
reach. Real RabbitMQ and PostgreSQL; the replica's own pool is closed to cut it off."""

from __future__ import annotations

import asyncio
from collections.abc import Sequence
from uuid import uuid4

import asyncpg
from aio_pika.abc import AbstractRobustConnection

from consumers.rebalance import ElasticRoute, Rebalancer
from consumers.route_pauses import PauseWatch
from domain.delivery import Fate
from events.decoding import RawDelivery
from events.routes import USAGE_RECORD
from infra.postgres import partition_owners, workers
from infra.postgres.pool import create_pool
from infra.rabbit.consumer import Decided, QueueConsumer
from infra.rabbit.publisher import Publisher
from infra.rabbit.route_consumer import route_consumer
from infra.settings import Settings
from tests.e2e.test_partitions_e2e import declared
from tests.support.observing import eventually

PARTITIONS = 2


async def _applied(raws: Sequence[RawDelivery]) -> list[Decided]:
    return [Decided.of(i, raw, Fate.ACKED) for i, raw in enumerate(raws)]


async def test_a_replica_cut_off_from_its_database_hands_its_partitions_over_past_the_bound(
    settings: Settings, pool: asyncpg.Pool, amqp: AbstractRobustConnection
) -> None:
    parted = settings.model_copy(update={"partitions": {USAGE_RECORD.name: PARTITIONS}})
    worker_id = uuid4()
    async with pool.acquire() as conn:
        await workers.register(conn, worker_id, "pkgq-run@test:1", "run", "test", 1)
        await partition_owners.join(conn, worker_id, [USAGE_RECORD.name])
    own = await create_pool(parted.postgres_dsn, min_size=1, max_size=2)
    started: list[QueueConsumer] = []
    async with declared(parted, amqp):
        dead_letters = await Publisher.open(amqp, parted.dlx)

        def consumer(partition: int) -> QueueConsumer:
            return route_consumer(
                USAGE_RECORD, parted, amqp, _applied, dead_letters, partition=partition
            )

        route = ElasticRoute(USAGE_RECORD.name, PARTITIONS, consumer)
        pauses = PauseWatch(pool, started, every=60)
        rebalancer = Rebalancer(own, worker_id, [route], started, pauses, every=0.2, live_within=1)
        stop = asyncio.Event()
        running = asyncio.create_task(rebalancer.run(stop))
        try:
            await eventually(lambda: _holds(rebalancer, PARTITIONS), within=20)
            held = list(rebalancer.held.values())
            assert all(c.consuming for c in held)

            await own.close()  # cut off from its database: every round fails from now on
            await eventually(lambda: _holds(rebalancer, 0), within=20)
            assert not any(c.consuming for c in held)  # its subscriptions are gone
            assert not rebalancer.failed.is_set()  # an outage, not a failure of the replica
        finally:
            stop.set()
            await running
            await rebalancer.close()
            await dead_letters.close()


async def _holds(rebalancer: Rebalancer, count: int) -> bool:
    return len(rebalancer.held) == count and not rebalancer._moving
