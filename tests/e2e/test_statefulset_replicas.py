"""A StatefulSet's pods: each real `pkgq run` takes its replica index from the environment (the
downward API's pod-index label, PKGQ_REPLICA_INDEX) and the count from PKGQ_REPLICA_COUNT, and
subscribes first to its own partitions, as `--replica I/N` would."""

from __future__ import annotations

import json
from collections.abc import AsyncIterator, Callable

import asyncpg
import pytest
from aio_pika.abc import AbstractRobustConnection

from events.routes import USAGE_RECORD
from infra.settings import Settings
from tests.e2e.test_partitions_e2e import declared, wait_logged
from tests.support.observing import eventually
from tests.support.processes import PkgqProcess

pytestmark = pytest.mark.e2e

PARTITIONS = {USAGE_RECORD.name: 4}


@pytest.fixture
async def split(settings: Settings, amqp: AbstractRobustConnection) -> AsyncIterator[Settings]:
    parted = settings.model_copy(update={"partitions": PARTITIONS})
    async with declared(parted, amqp):
        yield parted


async def _routes_of(pool: asyncpg.Pool, process: PkgqProcess) -> list[str]:
    async with pool.acquire() as conn:
        routes = await conn.fetchval(
            "SELECT routes FROM telecom.workers WHERE pid = $1 AND stopped_at IS NULL",
            process.proc.pid,
        )
    return sorted(routes or [])


async def test_pods_with_an_index_and_a_count_consume_their_own_partitions_first(
    split: Settings, pool: asyncpg.Pool, spawn: Callable[..., PkgqProcess]
) -> None:
    env = {
        "PKGQ_PARTITIONS": json.dumps(PARTITIONS),
        "PKGQ_STANDBY_DELAY": "600",  # the standby subscriptions stay out of this test
        "PKGQ_REPLICA_COUNT": "2",
    }
    pods = [
        spawn("run", "usage_record", "--no-ingest", PKGQ_REPLICA_INDEX=str(i), **env)
        for i in range(2)
    ]
    for pod in pods:
        await wait_logged(pod, "ready", within=60)
    key = USAGE_RECORD.name
    expected = [[f"{key}.p0", f"{key}.p2"], [f"{key}.p1", f"{key}.p3"]]

    async def subscribed() -> bool:  # the routes are recorded just after `ready`
        return [await _routes_of(pool, pod) for pod in pods] == expected

    await eventually(subscribed)


async def test_a_pod_whose_index_is_not_below_the_count_refuses_to_start(
    split: Settings, spawn: Callable[..., PkgqProcess]
) -> None:
    pod = spawn(
        "run",
        "usage_record",
        "--no-ingest",
        PKGQ_PARTITIONS=json.dumps(PARTITIONS),
        PKGQ_REPLICA_COUNT="2",
        PKGQ_REPLICA_INDEX="2",
    )
    assert pod.proc.wait(timeout=60) != 0
    assert "not below PKGQ_REPLICA_COUNT 2" in pod.logs()
