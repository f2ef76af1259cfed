"""Elastic replicas under load: real `pkgq run` processes on routes of 16 partitions go from 1
to 3 replicas, then to 2 (one SIGTERMed), back to 3 and to 2 again (one SIGKILLed), while
usage keeps being published. After each change every partition queue has exactly one consumer,
active, and it is the replica rendezvous hashing gives it among the live ones (the broker's
management API says so); at the end every user's state is exactly what the reference model
predicts from its messages in order, and every lifecycle event was emitted once: nothing lost,
reordered or applied twice.

The rebalance times are printed (`pytest -s` shows them); the only bound asserted is a
generous one (REBALANCE_BOUND_S), for "within a few seconds". PKGQ_E2E_USERS scales the
workload up (the default is CI-sized)."""

from __future__ import annotations

import asyncio
import json
import random
import time
from collections.abc import AsyncIterator, Callable
from datetime import datetime
from uuid import UUID

import asyncpg
import pytest
from aio_pika.abc import AbstractRobustConnection

from consumers.rebalance import LIVE_WITHIN_S, REBALANCE_EVERY_S
from domain.assignment import assign
from events.models import RecordUsage
from events.routes import PACKAGE_PURCHASE, USAGE_RECORD
from infra.rabbit.topology import route_queues
from infra.settings import Settings
from tests.e2e.test_partitions_e2e import declared, lifecycle_exact, wait_logged
from tests.e2e.workload import USERS, Workload
from tests.support.deliveries import Sending
from tests.support.observing import eventually
from tests.support.partition_consumers import QueueConsumers, partition_consumers
from tests.support.processes import PkgqProcess

pytestmark = pytest.mark.e2e

PARTITIONS = {USAGE_RECORD.name: 16, PACKAGE_PURCHASE.name: 16}
REBALANCE_BOUND_S = 30.0
"""Generous: a change settles in LIVE_WITHIN_S + a few REBALANCE_EVERY_S rounds (plus, for a
join, the process's start), about 1-5 s on a quiet machine; the bound only catches a change
that never settles on a machine shared with other tests."""
SEND_OVER_S = 40.0
"""The usage is spread over about this long, so that it is published throughout the changes
(the rest goes at once when they are done)."""


@pytest.fixture
async def sixteen(settings: Settings, amqp: AbstractRobustConnection) -> AsyncIterator[Settings]:
    parted = settings.model_copy(update={"partitions": PARTITIONS})
    async with declared(parted, amqp):
        yield parted


def _env() -> dict[str, str]:
    return {"PKGQ_PARTITIONS": json.dumps(PARTITIONS)}


async def _worker_ids(pool: asyncpg.Pool, replicas: list[PkgqProcess]) -> dict[str, str]:
    """Each running replica's worker id, by its pid."""
    async with pool.acquire() as conn:
        rows = await conn.fetch(
            "SELECT pid, id FROM telecom.workers WHERE pid = ANY($1::int[]) "
            "AND stopped_at IS NULL AND role = 'run'",
            [r.proc.pid for r in replicas],
        )
    return {str(r["pid"]): str(r["id"]) for r in rows}


class Partitions:
    """What the broker says of the partitions against what the assignment asks for."""

    def __init__(self, settings: Settings, pool: asyncpg.Pool) -> None:
        self.settings = settings
        self.pool = pool
        self.everyone: list[PkgqProcess] = []
        """Every replica started (a stopped one's log tells when it handed over)."""
        self.last: dict[str, QueueConsumers] = {}

    async def settled_on(self, replicas: list[PkgqProcess]) -> bool:
        """Every partition queue has exactly one consumer, active, of its rendezvous owner
        among `replicas` (all of them registered)."""
        ids = await _worker_ids(self.pool, replicas)
        if len(ids) != len(replicas):
            return False
        pid_of = {worker: pid for pid, worker in ids.items()}
        wanted: dict[str, str] = {}
        for route, count in PARTITIONS.items():
            owners = assign(route, count, ids.values())
            for k, (queue, _) in enumerate(route_queues(self.settings, route)):
                wanted[queue] = pid_of[owners[k]]
        self.last = await partition_consumers(self.settings, list(wanted))
        return all(
            found.active == [wanted[q]] and not found.waiting for q, found in self.last.items()
        )

    async def wait(self, replicas: list[PkgqProcess], change: str, since: float) -> float:
        """Wait until the partitions have settled on `replicas` after a change made at `since`
        (time.time()); how long after it the last partition moved, by the replicas' logs."""

        async def settled() -> bool:
            return await self.settled_on(replicas)

        settled.__qualname__ = f"every partition consumed by its owner after {change}"
        try:
            await eventually(settled, within=REBALANCE_BOUND_S, every=0.1)
        except AssertionError:
            shown = {q: (c.active, c.waiting) for q, c in self.last.items()}
            raise AssertionError(f"{change}: not settled, broker says {shown}") from None
        seen = time.time() - since
        moved = _last_move(self.everyone, since) - since
        print(
            f"rebalance after {change}: the last partition moved {moved:.2f} s later (its new "
            f"owner active); the management API showed it {seen:.2f} s later (it refreshes "
            "its consumer list every 5 s)"
        )
        return moved


def _last_move(replicas: list[PkgqProcess], since: float) -> float:
    """When the last partition moved after `since` (time.time()): the last `partition_taken`
    or `partition_handed_over` the replicas logged (a new owner is active from the later of
    its subscription and the old owner's hand-over; a dead owner hands nothing over)."""
    last = since
    for replica in replicas:
        for line in replica.logs().splitlines():
            if '"partition_taken"' not in line and '"partition_handed_over"' not in line:
                continue
            at = datetime.fromisoformat(json.loads(line)["timestamp"]).timestamp()
            last = max(last, at)
    return last


async def _send_usage_paced(
    workload: Workload, settings: Settings, amqp: AbstractRobustConnection, hurry: asyncio.Event
) -> int:
    """Send every user's usage in order (users interleaved), spread over about SEND_OVER_S;
    the last tenth waits for `hurry`, so that publishing goes on until the changes are done
    however long they take. The number sent."""
    rng = random.Random(7)
    lists = {p.user: list(p.usages) for p in workload.plans}
    total = sum(len(v) for v in lists.values())
    pace = SEND_OVER_S / max(1, total)
    held_back = max(1, total // 10)
    pending: list[UUID] = [u for u, usages in lists.items() if usages]
    sent = 0
    async with Sending(settings, amqp) as sending:
        while pending:
            user = rng.choice(pending)
            up, down = lists[user].pop(0)
            await sending.send(USAGE_RECORD, RecordUsage(user_id=user, upload=up, download=down))
            sent += 1
            if not lists[user]:
                pending.remove(user)
            if not hurry.is_set():
                await asyncio.sleep(pace)
            if sent == total - held_back:
                await hurry.wait()
    return sent


async def test_replicas_that_join_leave_and_die_share_sixteen_partitions_with_one_consumer_each(
    sixteen: Settings,
    pool: asyncpg.Pool,
    amqp: AbstractRobustConnection,
    spawn: Callable[..., PkgqProcess],
) -> None:
    workload = await Workload.create(pool, seed=29_11_2026, users=max(USERS, 32))
    spawn("relay", **_env())
    partitions = Partitions(sixteen, pool)

    def replica() -> PkgqProcess:
        started = spawn("run", **_env())
        partitions.everyone.append(started)
        return started

    first = replica()
    await wait_logged(first, "ready", within=60)
    await partitions.wait([first], "1 replica started", time.time())
    await workload.send_purchases(sixteen, amqp)
    await workload.wait_all_queued(pool)

    hurry = asyncio.Event()
    sending = asyncio.create_task(_send_usage_paced(workload, sixteen, amqp, hurry))
    times: dict[str, float] = {}
    try:
        began = time.time()
        second, third = replica(), replica()
        times["1 -> 3 (two joined)"] = await partitions.wait(
            [first, second, third], "two replicas joined", began
        )

        began = time.time()
        assert second.terminate() == 0, second.logs()
        times["3 -> 2 (SIGTERM)"] = await partitions.wait(
            [first, third], "one replica SIGTERMed", began
        )

        began = time.time()
        fourth = replica()
        times["2 -> 3 (one joined)"] = await partitions.wait(
            [first, third, fourth], "one replica joined", began
        )

        began = time.time()
        third.kill()
        times["3 -> 2 (SIGKILL)"] = await partitions.wait(
            [first, fourth], "one replica SIGKILLed", began
        )
    finally:
        hurry.set()
        sent = await sending
    print(
        f"rebalance times (s), replicas live within {LIVE_WITHIN_S:g} s, read every "
        f"{REBALANCE_EVERY_S:g} s: " + ", ".join(f"{k}: {v:.2f}" for k, v in times.items())
    )
    assert sent == sum(len(p.usages) for p in workload.plans)
    await workload.wait_end_state(pool)  # every user's usage applied once, in order
    await lifecycle_exact(pool, [workload])  # every lifecycle event emitted once
    async with pool.acquire() as conn:
        applied = await conn.fetchval(
            "SELECT count(*) FROM telecom.inbox WHERE consumer = 'usage_record' "
            "AND user_id = ANY($1::uuid[])",
            workload.users,
        )
    assert applied == sent
    for survivor in (first, fourth):
        assert survivor.terminate() == 0, survivor.logs()
