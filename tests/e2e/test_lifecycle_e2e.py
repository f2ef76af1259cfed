"""End to end with real processes: random traffic reaches the reference model's end state."""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable

import asyncpg
import pytest
from aio_pika.abc import AbstractRobustConnection

from events.routes import ALL_EXPIRED, PACKAGE_ACTIVATE, PACKAGE_EXPIRING
from infra.rabbit.tap import Tap
from infra.settings import Settings
from tests.e2e.workload import Workload
from tests.support.processes import PkgqProcess

pytestmark = pytest.mark.e2e


@pytest.mark.parametrize("batch_size", ["1", "32"], ids=["unbatched", "batched"])
async def test_random_traffic_through_two_relays_and_two_replicas_reaches_the_reference_end_state(
    batch_size: str,
    settings: Settings,
    pool: asyncpg.Pool,
    amqp: AbstractRobustConnection,
    tap: Tap,
    spawn: Callable[..., PkgqProcess],
) -> None:
    workload = await Workload.create(pool, seed=20261122)
    # Two of each: relays share the outbox by partition lease, consumer replicas stand by
    # behind single-active-consumer queues. Order and exactly-once effects must still hold.
    # Batched and unbatched runs of the same workload must reach the same (reference) end state.
    relays = [spawn("relay"), spawn("relay")]
    replicas = [spawn("run", PKGQ_BATCH_SIZE=batch_size) for _ in range(2)]
    await workload.send_purchases(settings, amqp)
    await workload.wait_all_queued(pool)
    await workload.send_usage(settings, amqp)
    await workload.wait_end_state(pool)

    expected = Counter[tuple[str, str]]()
    for plan in workload.plans:
        _, activations, expirations, all_expired, _ = plan.expected()
        expected[(str(plan.user), PACKAGE_ACTIVATE.name)] = activations
        expected[(str(plan.user), PACKAGE_EXPIRING.name)] = expirations
        expected[(str(plan.user), ALL_EXPIRED.name)] = all_expired
    lifecycle = {PACKAGE_ACTIVATE.name, PACKAGE_EXPIRING.name, ALL_EXPIRED.name}

    def seen() -> Counter[tuple[str, str]]:
        return Counter(
            (t.json()["user_id"], t.routing_key)
            for t in tap.seen
            if t.routing_key in lifecycle and t.exchange == settings.exchange
        )

    await tap.wait_for(lambda _: seen() == +expected, within=30)
    for process in replicas + relays:
        assert process.terminate() == 0, process.logs()
    assert seen() == +expected
    seqs: dict[str, list[int]] = {}
    for t in tap.seen:
        if t.seq is not None:
            seqs.setdefault(t.json()["user_id"], []).append(t.seq)
    for user, numbers in seqs.items():
        assert numbers == sorted(numbers), f"{user}: events left out of order {numbers}"
