"""A batch is as good as its messages one at a time: the same state, the same outbox.

The delivery pipeline (docs/explanation/delivery.md, "One batch, one transaction, a fixed number of
statements") applies a batch in one transaction: per user in delivery order, in memory, then written
back set-based. This property drives the real handlers through `DeliveryPipeline.process_batch` (no
RabbitMQ) in two databases copied from the same template. A generated scenario is a list of steps,
each one route and 1-6 messages for up to 3 users (a purchase may name a package not in the catalog,
a quota change may overflow the item's column, and a step may end with redeliveries of its own
messages). The test's own database takes each step as one batch, every delivery taken ahead of it as
a consumer does as they arrive (DeliveryPipeline.take_ahead); the second takes each delivery of the
step as a batch of its own, in delivery order, with the same message ids. After every step both must
agree, per user, on the items (in queue order), the user row, the access read model, dead letters,
holds, parked messages and the outbox rows (in id order), on the inbox, and on every delivery's
outcome.

Item ids differ between the runs (a batch takes its ids in user order, not delivery order), so a
message names "its user's k-th item in queue order", resolved in each database just before the
step, and the state is compared with ids replaced by queue positions, catalog ids by catalog
positions, users by their index, and clock times left out.

The databases are shared by all examples of the test; each example has fresh users. Examples:
PKGQ_PROPERTY_EXAMPLES, default 40 in `make test` (about 5 s on an idle 2-core machine); raise it
for a longer search (`PKGQ_PROPERTY_EXAMPLES=1000 make test`).
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from uuid import UUID, uuid4

import asyncpg
import hypothesis
import pytest
from hypothesis import HealthCheck, example, given

from domain.delivery import Fate
from events.routes import (
    PACKAGE_PURCHASE,
    PACKAGE_QUEUING,
    QUOTA_ADJUST,
    USAGE_RECORD,
)
from infra.postgres.pool import create_pool
from infra.settings import Settings
from tests.integration.batch_scenarios import (
    EXAMPLES,
    USERS,
    Msg,
    Run,
    Step,
    deliveries,
    differences,
    new_run,
    scenarios,
    state_of,
)


@pytest.fixture
async def one_at_a_time_pool(settings: Settings, template_db: str) -> AsyncIterator[asyncpg.Pool]:
    """A second database from the same migrated template (the `settings` fixture's recipe)."""
    server = settings.postgres_dsn.rsplit("/", 1)[0]
    name = f"pkgq_t_{uuid4().hex[:12]}"
    admin = await asyncpg.connect(f"{server}/postgres")
    try:
        await admin.execute(f"CREATE DATABASE {name} TEMPLATE {template_db}")
    finally:
        await admin.close()
    pool = await create_pool(f"{server}/{name}", min_size=1, max_size=5)
    try:
        yield pool
    finally:
        await pool.close()
        admin = await asyncpg.connect(f"{server}/postgres")
        try:
            await admin.execute(f"DROP DATABASE IF EXISTS {name} WITH (FORCE)")
        finally:
            await admin.close()


@pytest.fixture
async def runs(pool: asyncpg.Pool, one_at_a_time_pool: asyncpg.Pool) -> tuple[Run, Run]:
    """(batched, one at a time), each with the same catalog."""
    return await new_run(pool), await new_run(one_at_a_time_pool)


@hypothesis.settings(
    max_examples=EXAMPLES,
    deadline=None,
    database=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)
@given(scenario=scenarios)
@example(  # always run: a write-back that overflows, the fallback, a hold and parked messages
    scenario=[
        Step(PACKAGE_PURCHASE.name, (Msg(0), Msg(1))),
        Step(PACKAGE_QUEUING.name, (Msg(0), Msg(1))),
        Step(QUOTA_ADJUST.name, (Msg(0, delta=2**62),)),
        Step(QUOTA_ADJUST.name, (Msg(0, delta=2**62), Msg(1, delta=-3), Msg(0, delta=1))),
        Step(USAGE_RECORD.name, (Msg(0, upload=1), Msg(1, upload=1))),
    ]
)
async def test_a_batch_reaches_the_same_state_and_outbox_as_its_messages_applied_one_at_a_time(
    runs: tuple[Run, Run], scenario: list[Step]
) -> None:
    batched, alone = runs
    users = [uuid4() for _ in range(USERS)]
    message_ids: list[UUID] = []
    seq = 0
    for number, step in enumerate(scenario):
        ids = [uuid4() for _ in step.messages]
        message_ids += ids
        seqs = list(range(seq + 1, seq + 1 + len(ids)))
        seq += len(ids)
        raws_b = await deliveries(batched, step, users, ids, seqs)
        raws_a = await deliveries(alone, step, users, ids, seqs)
        where = f"step {number} ({step.route}, {len(step.messages)} messages)"
        kept = [i for i, _ in raws_b]
        assert kept == [i for i, _ in raws_a], f"{where}: the runs have different items"
        if raws_b:
            pipeline = batched.pipeline(step.route)
            for _, raw in raws_b:  # as a consumer does, as each delivery arrives
                pipeline.take_ahead(raw)
            results = await pipeline.process_batch([r for _, r in raws_b])
            outcomes_b = [r.fate for r in results]
            outcomes_a: list[Fate] = []
            for _, raw in raws_a:
                (result,) = await alone.pipeline(step.route).process_batch([raw])
                outcomes_a.append(result.fate)
            assert outcomes_b == outcomes_a, f"{where}: outcomes {outcomes_b} != {outcomes_a}"
            for outcome in outcomes_b:
                hypothesis.event(f"{step.route}: {outcome}")
        state_b = await state_of(batched, users, message_ids)
        state_a = await state_of(alone, users, message_ids)
        assert state_b == state_a, f"{where}: the state differs:\n{differences(state_b, state_a)}"
