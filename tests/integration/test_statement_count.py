"""The set-based hot path: what one batch costs in SQL statements does not grow with its size.

Each batch here is of distinct users, counted with asyncpg's query loggers on the pipeline's own
pool (BEGIN and COMMIT included). Sizes 8, 32 and 128 must cost the same, and no more than
COSTS says for their route.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from datetime import timedelta
from uuid import UUID, uuid4

import asyncpg

from consumers.cli.user import summary
from consumers.delivery import DeliveryPipeline
from consumers.handler_errors import Bury
from consumers.handlers import usage_record
from consumers.registry import HANDLERS
from consumers.retry_policy import RetryPolicy
from consumers.unit_of_work import HandlerContext
from devtools.postgres.statements import StatementLog
from domain.delivery import Fate
from domain.model import ExpiryReason
from events.decoding import RawDelivery
from events.models import (
    PackageActivateEvent,
    PackageExpiringEvent,
    PackageQueuePushEvent,
    PurchasePackage,
    RecordUsage,
)
from events.routes import (
    PACKAGE_ACTIVATE,
    PACKAGE_EXPIRING,
    PACKAGE_PURCHASE,
    PACKAGE_QUEUING,
    USAGE_RECORD,
    Route,
)
from tests.support.deliveries import add_package, raw_for

SIZES = (8, 32, 128)
MAX_STATEMENTS = 10
COSTS = {
    "purchase": 8,
    "queuing": 5,
    "activate": 5,
    "usage": 5,
    "usage_v2": 6,
    "usage_v2_resent": 6,
    "usage_consuming": 6,
    "expiring": 5,
}
"""What each batch costs now, at most: BEGIN, the users' lock, one read under it (holds,
inbox, attempts, items: infra/postgres/batch_read.py), the writes, COMMIT; a purchase reads the
catalog and its order and takes item ids besides, a usage record with an id its billing."""


async def _run(
    pool: asyncpg.Pool, log: StatementLog, route: Route, raws: Sequence[RawDelivery]
) -> tuple[int, list[Fate]]:
    pipeline = DeliveryPipeline(
        pool, route, HANDLERS[route.name], RetryPolicy(), max_body_bytes=2**20
    )
    await log.settled()
    log.clear()
    results = await pipeline.process_batch(raws)
    return await log.settled(), [r.fate for r in results]


async def _lifecycle(
    pool: asyncpg.Pool, log: StatementLog, package: int, size: int
) -> dict[str, int]:
    """One batch per route for `size` fresh users: purchase, queuing (activates), activate
    (grants access), usage (bills the active item), expiring (consumes it, access ends)."""
    users = [uuid4() for _ in range(size)]
    counts: dict[str, int] = {}

    # Every purchase names an order: the batch loads and writes orders too (its dearest form).
    purchases = [
        raw_for(PACKAGE_PURCHASE, PurchasePackage(user_id=u, package_id=package, by_order=uuid4()))
        for u in users
    ]
    counts["purchase"], outcomes = await _run(pool, log, PACKAGE_PURCHASE, purchases)
    assert outcomes == [Fate.ACKED] * size
    async with pool.acquire() as conn:
        rows = await conn.fetch(
            "SELECT user_id, id FROM telecom.package_queue WHERE user_id = ANY($1::uuid[])", users
        )
    item: dict[UUID, int] = {r["user_id"]: r["id"] for r in rows}
    assert len(item) == size

    pushes = [
        raw_for(
            PACKAGE_QUEUING,
            PackageQueuePushEvent(user_id=u, item_ids=[item[u]], package_id=package, pushed_at=1),
        )
        for u in users
    ]
    counts["queuing"], outcomes = await _run(pool, log, PACKAGE_QUEUING, pushes)
    assert outcomes == [Fate.ACKED] * size

    grants = [
        raw_for(
            PACKAGE_ACTIVATE,
            PackageActivateEvent(user_id=u, item_id=item[u], package_id=package, activated_at=1),
            seq=2,
        )
        for u in users
    ]
    counts["activate"], outcomes = await _run(pool, log, PACKAGE_ACTIVATE, grants)
    assert outcomes == [Fate.ACKED] * size

    usage = [raw_for(USAGE_RECORD, RecordUsage(user_id=u, upload=1, download=0)) for u in users]
    counts["usage"], outcomes = await _run(pool, log, USAGE_RECORD, usage)
    assert outcomes == [Fate.ACKED] * size

    # Version 2, billed under the billing system's record id: each user's record twice in one
    # batch (a resend under a new message_id), then once more in the next (loaded as billed).
    def records() -> list[RawDelivery]:
        return [
            raw_for(USAGE_RECORD, RecordUsage(user_id=u, upload=0, download=0, usage_id="cdr-1"))
            for u in users
        ]

    counts["usage_v2"], outcomes = await _run(pool, log, USAGE_RECORD, records() + records())
    assert outcomes == [Fate.ACKED] * size + [Fate.DUPLICATE_USAGE] * size
    counts["usage_v2_resent"], outcomes = await _run(pool, log, USAGE_RECORD, records())
    assert outcomes == [Fate.DUPLICATE_USAGE] * size

    # This one uses the package up: the item is consumed, its timer withdrawn, and an expiring
    # event written.
    usage = [raw_for(USAGE_RECORD, RecordUsage(user_id=u, upload=9, download=5)) for u in users]
    counts["usage_consuming"], outcomes = await _run(pool, log, USAGE_RECORD, usage)
    assert outcomes == [Fate.ACKED] * size

    expiring = [
        raw_for(
            PACKAGE_EXPIRING,
            PackageExpiringEvent(
                user_id=u,
                item_id=item[u],
                package_id=package,
                expired_at=1,
                reason=ExpiryReason.USAGE,
            ),
        )
        for u in users
    ]
    counts["expiring"], outcomes = await _run(pool, log, PACKAGE_EXPIRING, expiring)
    assert outcomes == [Fate.ACKED] * size

    async with pool.acquire() as conn:
        billed = await conn.fetchval(
            "SELECT count(*) FROM telecom.package_queue "
            "WHERE user_id = ANY($1::uuid[]) AND upload = 10 AND download = 5 "
            "AND status = 'consumed'",
            users,
        )
        granted = await conn.fetchval(
            "SELECT count(*) FROM telecom.access WHERE user_id = ANY($1::uuid[]) "
            "AND granted AND remaining = 0",
            users,
        )
        owed = await conn.fetchval(
            "SELECT count(*) FROM telecom.outbox WHERE user_id = ANY($1::uuid[]) "
            "AND route = 'telecom.all_expired'",
            users,
        )
    assert billed == size  # every user's usage landed, then the item was consumed
    assert granted == size  # remaining set to 0 with the usage; all_expired not applied yet
    assert owed == size  # one AllPackageExpiredEvent per user, in the outbox
    return counts


async def test_a_batch_costs_the_same_fixed_number_of_statements_at_8_32_and_128_messages(
    counted: tuple[asyncpg.Pool, StatementLog],
) -> None:
    pool, log = counted
    package = await add_package(pool, 15, timedelta(days=30))
    await _lifecycle(pool, log, package, 2)  # warm up: prepared statements, codecs
    by_size = {size: await _lifecycle(pool, log, package, size) for size in SIZES}
    for route, cost in COSTS.items():
        counts = {size: by_size[size][route] for size in SIZES}
        assert len(set(counts.values())) == 1, f"{route}: statements grow with size: {counts}"
        assert counts[SIZES[0]] <= min(cost, MAX_STATEMENTS), f"{route}: {counts} statements"


async def test_the_statement_log_counts_every_statement_of_a_batch_including_begin_and_commit(
    counted: tuple[asyncpg.Pool, StatementLog],
) -> None:
    pool, log = counted
    package = await add_package(pool, 1000, None)
    user = uuid4()
    count, _ = await _run(
        pool,
        log,
        PACKAGE_PURCHASE,
        [raw_for(PACKAGE_PURCHASE, PurchasePackage(user_id=user, package_id=package))],
    )
    assert log.statements[0] == "BEGIN;"
    # The consumers' pool takes a connection back without asyncpg's reset (a round trip less):
    # the batch's COMMIT is the last thing sent.
    assert log.statements[-1] == "COMMIT;"
    assert not any("pg_advisory_unlock_all" in s for s in log.statements)
    assert count == len(log.statements) > 3


async def test_user_show_reads_a_users_summary_in_one_statement_whatever_its_item_count(
    counted: tuple[asyncpg.Pool, StatementLog],
) -> None:
    pool, log = counted
    package = await add_package(pool, 1000, timedelta(days=1))
    counts: dict[int, int] = {}
    for amount in (0, 1, 8):
        user = uuid4()
        if amount:
            purchase = PurchasePackage(user_id=user, package_id=package, amount=amount)
            _, outcomes = await _run(
                pool, log, PACKAGE_PURCHASE, [raw_for(PACKAGE_PURCHASE, purchase)]
            )
            assert outcomes == [Fate.ACKED]
        async with pool.acquire() as conn:
            await log.settled()
            log.clear()
            shown = await summary(conn, user)
            counts[amount] = await log.settled()
        assert len(shown["packages"]) == amount
        assert (shown["unbilled"] is None) == (amount == 0)  # the user's row came too
    assert counts == {0: 1, 1: 1, 8: 1}, counts


FAILS, BURIES = 7, 13
"""Uploads the failing handler below refuses: retried (a handler error), or buried (a Bury)."""


async def _failing_usage(ctx: HandlerContext, body: RecordUsage) -> None:
    if body.upload == FAILS:
        raise RuntimeError("billing refused (injected)")
    if body.upload == BURIES:
        raise Bury("refused_by_test")
    await usage_record.handle(ctx, body)


async def _failure_path(pool: asyncpg.Pool, log: StatementLog, size: int) -> tuple[int, int]:
    """Two batches of `size` users with two usage records each. In the first, a third of the
    users' first record fails (retried: a hold, and their second record parked behind it) and
    a sixth's is buried; bad input rides along. In the second, the retries arrive and succeed:
    holds are lifted and the parked records drained. Returns each batch's statements."""
    pipeline = DeliveryPipeline(
        pool,
        USAGE_RECORD,
        _failing_usage,
        RetryPolicy(backoff=lambda _: 60.0),
        max_body_bytes=2**20,
    )
    users = [uuid4() for _ in range(size)]
    first = {u: FAILS if i % 3 == 0 else BURIES if i % 6 == 1 else 1 for i, u in enumerate(users)}
    raws = [
        raw_for(USAGE_RECORD, RecordUsage(user_id=u, upload=first[u], download=0)) for u in users
    ]
    raws += [raw_for(USAGE_RECORD, RecordUsage(user_id=u, upload=2, download=0)) for u in users]
    bad = dataclasses.replace(raws[0], body=b"{not json", message_id=str(uuid4()))
    await log.settled()
    log.clear()
    fates = [r.fate for r in await pipeline.process_batch([*raws, bad])]
    failing = fates.count(Fate.RETRIED)
    assert failing == len(range(0, size, 3)) == fates.count(Fate.PARKED)
    assert fates.count(Fate.DEAD_LETTERED) == len(range(1, size, 6)) + 1
    first_batch = await log.settled()

    retries = [
        dataclasses.replace(
            r, body=RecordUsage(user_id=u, upload=3, download=0).model_dump_json().encode()
        )
        for r, u in zip(raws[:size], users, strict=True)
        if first[u] == FAILS
    ]
    log.clear()
    assert [r.fate for r in await pipeline.process_batch(retries)] == [Fate.ACKED] * failing
    second_batch = await log.settled()
    async with pool.acquire() as conn:
        assert await conn.fetchval("SELECT count(*) FROM telecom.holds") == 0
        assert await conn.fetchval("SELECT count(*) FROM telecom.parked") == 0
        await conn.execute("DELETE FROM telecom.dead_letters")
    return first_batch, second_batch


async def test_a_batch_where_a_third_fails_costs_the_same_statements_at_every_size(
    counted: tuple[asyncpg.Pool, StatementLog],
) -> None:
    pool, log = counted
    await _failure_path(pool, log, 6)  # warm up
    by_size = {size: await _failure_path(pool, log, size) for size in SIZES}
    assert len(set(by_size.values())) == 1, f"statements grow with size: {by_size}"
    print(f"statements: failing batch and recovering batch (with its drain) {by_size}")
    failing, recovering = by_size[SIZES[0]]
    assert failing <= MAX_STATEMENTS + 3, f"{failing} statements"
    assert recovering <= MAX_STATEMENTS + 11, f"{recovering} statements (two transactions)"
