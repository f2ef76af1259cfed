"""telecom.expiry_due (internal): a time-expiry timer fired; expire the item if still due."""

from __future__ import annotations

from consumers.unit_of_work import HandlerContext, Needs, transition
from events.models import PackageExpiryDue


def needs(body: PackageExpiryDue) -> Needs:
    return Needs(item_ids=(body.item_id,))


async def handle(ctx: HandlerContext, body: PackageExpiryDue) -> None:
    await transition(ctx, body.user_id, lambda q: q.expire_due(body.item_id, ctx.now))
