"""telecom.package_expiring: consume the item if due, activate the next, or end access."""

from __future__ import annotations

from consumers.unit_of_work import HandlerContext, Needs, transition
from events.models import PackageExpiringEvent


def needs(body: PackageExpiringEvent) -> Needs:
    return Needs(item_ids=(body.item_id,))


async def handle(ctx: HandlerContext, body: PackageExpiringEvent) -> None:
    await transition(ctx, body.user_id, lambda q: q.expire(body.item_id, body.reason, ctx.now))
