"""A user's live items are bounded (PKGQ_MAX_QUEUED_ITEMS) against real Postgres and RabbitMQ: a
purchase beyond the cap is dead-lettered as domain_rule, holding nothing, and the user's next
purchase within the cap is applied; in one batch, and through `pkgq run`'s consumers with the
setting threaded from Settings to the domain."""

from __future__ import annotations

from collections.abc import Sequence
from uuid import UUID, uuid4

import asyncpg
from aio_pika.abc import AbstractRobustConnection

from consumers.delivery import DeliveryPipeline
from consumers.registry import HANDLERS
from consumers.retry_policy import RetryPolicy
from domain.delivery import Fate
from events.decoding import RawDelivery
from events.models import PurchasePackage
from events.routes import PACKAGE_PURCHASE
from infra.settings import Settings
from tests.support.dead_letters import buried_id
from tests.support.deliveries import add_package, raw_for, send
from tests.support.in_process import StartApp
from tests.support.observing import eventually


async def _run(pool: asyncpg.Pool, raws: Sequence[RawDelivery]) -> list[Fate]:
    pipeline = DeliveryPipeline(
        pool, PACKAGE_PURCHASE, HANDLERS[PACKAGE_PURCHASE.name], RetryPolicy(), max_body_bytes=2**20
    )
    return [r.fate for r in await pipeline.process_batch(raws)]


def _purchase(user: UUID, package: int, amount: int) -> RawDelivery:
    body = PurchasePackage(user_id=user, package_id=package, amount=amount)
    return raw_for(PACKAGE_PURCHASE, body)


async def _live(pool: asyncpg.Pool, user: UUID) -> int:
    async with pool.acquire() as conn:
        return int(
            await conn.fetchval(
                "SELECT count(*) FROM telecom.package_queue "
                "WHERE user_id = $1 AND status IN ('in_queue', 'active')",
                user,
            )
        )


async def _dead_letters(pool: asyncpg.Pool, user: UUID) -> list[tuple[str, str, str]]:
    async with pool.acquire() as conn:
        rows = await conn.fetch(
            "SELECT reason, error_type, status::text AS status FROM telecom.dead_letters "
            "WHERE user_id = $1 ORDER BY id",
            user,
        )
    return [(r["reason"], r["error_type"], r["status"]) for r in rows]


async def _holds(pool: asyncpg.Pool, user: UUID) -> int:
    async with pool.acquire() as conn:
        return int(
            await conn.fetchval("SELECT count(*) FROM telecom.holds WHERE user_id = $1", user)
        )


async def test_in_one_batch_the_purchase_beyond_the_default_cap_of_1000_is_buried_the_rest_applied(
    pool: asyncpg.Pool,
) -> None:
    package = await add_package(pool, 1000)
    user, neighbour = uuid4(), uuid4()

    fates = await _run(
        pool,
        [
            _purchase(user, package, 600),
            _purchase(user, package, 500),  # 1,100: beyond the cap
            _purchase(neighbour, package, 700),  # another user's queue is their own
            _purchase(user, package, 400),  # 1,000: exactly the cap
        ],
    )

    assert fates == [Fate.ACKED, Fate.DEAD_LETTERED, Fate.ACKED, Fate.ACKED]
    assert (await _live(pool, user), await _live(pool, neighbour)) == (1000, 700)
    assert await _run(pool, [_purchase(user, package, 1)]) == [Fate.DEAD_LETTERED]
    assert await _live(pool, user) == 1000
    assert await _dead_letters(pool, user) == [("domain_rule", "QueueFullError", "buried")] * 2
    assert await _holds(pool, user) == 0  # a broken rule holds back nothing behind it


async def test_a_purchase_beyond_the_configured_cap_is_dead_lettered_and_the_next_within_it_applied(
    settings: Settings,
    pool: asyncpg.Pool,
    amqp: AbstractRobustConnection,
    in_process: StartApp,
) -> None:
    capped = settings.model_copy(update={"max_queued_items": 5})
    app = in_process(capped, pool, amqp)
    await app.start_consumers([PACKAGE_PURCHASE])  # nothing activates or consumes meanwhile
    package = await add_package(pool, 1000)
    user = uuid4()

    async def live_is(count: int) -> bool:
        return await _live(pool, user) == count

    await send(
        capped, amqp, PACKAGE_PURCHASE, PurchasePackage(user_id=user, package_id=package, amount=3)
    )
    await eventually(lambda: live_is(3))
    beyond = await send(
        capped, amqp, PACKAGE_PURCHASE, PurchasePackage(user_id=user, package_id=package, amount=3)
    )
    await buried_id(pool, beyond)
    await send(
        capped, amqp, PACKAGE_PURCHASE, PurchasePackage(user_id=user, package_id=package, amount=2)
    )
    await eventually(lambda: live_is(5))

    async with pool.acquire() as conn:
        dead = await conn.fetchrow(
            "SELECT reason, error_type, error_message, consumer FROM telecom.dead_letters "
            "WHERE message_id = $1",
            str(beyond),
        )
    assert dead is not None
    assert (dead["reason"], dead["error_type"], dead["consumer"]) == (
        "domain_rule",
        "QueueFullError",
        PACKAGE_PURCHASE.short_name,
    )
    assert "holds 3 live item(s)" in dead["error_message"]
    assert "beyond the 5 one user may hold" in dead["error_message"]
    assert await _holds(pool, user) == 0
