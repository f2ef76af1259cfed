"""The set-up the identity tests through the broker share (tests/integration/test_identity.py):
the shop and an outsider each publishing as a broker user of their own, the victim's cancel
route whose handler fails a message's first attempt, and what Postgres shows of the victim's
cancels and hold."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any
from uuid import UUID

import asyncpg

from consumers.delivery import DeliveryPipeline
from consumers.retry_policy import RetryPolicy
from consumers.runner import handler_for
from consumers.unit_of_work import HandlerContext
from events.identity import message_key
from events.models import CancelPackage
from events.routes import PACKAGE_CANCEL
from infra.postgres import invariants
from infra.settings import Settings
from tests.support.broker_users import Publisher
from tests.support.observing import eventually, fetch

RETRY_AFTER_S = 4.0
"""How long the victim's failed cancel waits for its retry: long enough for the outsider to
act meanwhile."""


@dataclass
class Publishers:
    shop: Publisher
    """The honest publisher of the victim's commands."""
    mallory: Publisher
    """The outsider: the same role's permissions, nothing more."""


def cancel(user: UUID, item_id: int) -> bytes:
    return CancelPackage(user_id=user, item_id=item_id).model_dump_json().encode()


def cancels_failing_once(
    settings: Settings, pool: asyncpg.Pool, once: set[UUID]
) -> DeliveryPipeline:
    """The cancel route, whose handler fails the first attempt of each message in `once`."""
    real = handler_for(settings, PACKAGE_CANCEL)

    async def handler(ctx: HandlerContext, body: Any) -> None:
        if ctx.envelope.message_id in once:
            once.discard(ctx.envelope.message_id)
            raise RuntimeError("the refund service timed out (injected)")
        await real(ctx, body)

    return DeliveryPipeline(
        pool,
        PACKAGE_CANCEL,
        handler,
        RetryPolicy(max_attempts=5, backoff=lambda _: RETRY_AFTER_S),
        max_body_bytes=settings.max_body_bytes,
        trusted_publisher=settings.amqp_user,
    )


async def statuses(pool: asyncpg.Pool, items: list[int]) -> list[str]:
    rows = await fetch(
        pool,
        "SELECT status::text AS status FROM telecom.package_queue WHERE id = ANY($1::bigint[]) "
        "ORDER BY array_position($1::bigint[], id)",
        items,
    )
    return [r["status"] for r in rows]


async def applied_in_order(pool: asyncpg.Pool, victim: UUID) -> list[tuple[UUID, UUID]]:
    """The victim's cancels the consumer applied, as (message_id, key), in the order applied."""
    rows = await fetch(
        pool,
        "SELECT sent_as, message_id AS key FROM telecom.inbox "
        "WHERE consumer = 'package_cancel' AND user_id = $1 ORDER BY processed_at, message_id",
        victim,
    )
    return [(r["sent_as"], r["key"]) for r in rows]


async def hold_of(pool: asyncpg.Pool, consumer: str, user: UUID) -> dict[str, Any] | None:
    rows = await fetch(
        pool,
        "SELECT blocker, blocker_key, state, attempts FROM telecom.holds "
        "WHERE consumer = $1 AND user_id = $2",
        consumer,
        user,
    )
    return rows[0] if rows else None


async def broken(pool: asyncpg.Pool) -> dict[str, int]:
    async with pool.acquire() as conn:
        results = await invariants.run_all(conn)
    return {r.check: r.violations for r in results if not r.ok}


@dataclass
class Scene:
    """The victim's cancel M (from the shop) failed once and waits for its retry; the victim's
    later cancel L is parked behind it."""

    settings: Settings
    pool: asyncpg.Pool
    publishers: Publishers
    victim: UUID
    items: list[int]
    m: UUID
    later: UUID

    def key(self, message_id: UUID) -> UUID:
        """The key of the shop's message `message_id` for the victim."""
        return message_key(message_id, self.publishers.shop.name, self.victim)

    async def m_still_waits(self) -> None:
        """M still holds the victim, with its own retry on its way."""
        hold = await hold_of(self.pool, PACKAGE_CANCEL.short_name, self.victim)
        assert hold is not None
        assert (hold["blocker"], hold["state"]) == (self.m, "retrying")
        retry = f"retry:{PACKAGE_CANCEL.short_name}:{self.key(self.m)}"
        assert await fetch(self.pool, "SELECT 1 FROM telecom.outbox WHERE cancel_key = $1", retry)

    async def applied(self, *, in_order: bool = True) -> None:
        """M and L are applied, each once (M first unless told otherwise), nothing is left held
        and every doctor check holds."""

        async def both() -> bool:
            return await statuses(self.pool, self.items[2:]) == ["cancelled", "cancelled"]

        await eventually(both, within=30)
        keys = [key for _, key in await applied_in_order(self.pool, self.victim)]
        assert keys.count(self.key(self.m)) == 1
        assert keys.count(self.key(self.later)) == 1
        if in_order:
            assert keys.index(self.key(self.m)) < keys.index(self.key(self.later))

        async def settled() -> bool:
            return await hold_of(self.pool, PACKAGE_CANCEL.short_name, self.victim) is None

        await eventually(settled)
        assert await broken(self.pool) == {}
