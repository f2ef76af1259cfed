"""telecom.quota_adjust: change an item's adjust_quota; below use, the active item is consumed.
Recorded in the item audit with its delta, reason and operator."""

from __future__ import annotations

from consumers.unit_of_work import HandlerContext, Needs, transition
from events.models import AdjustQuota


def needs(body: AdjustQuota) -> Needs:
    return Needs(item_ids=(body.item_id,))


async def handle(ctx: HandlerContext, body: AdjustQuota) -> None:
    await transition(ctx, body.user_id, lambda q: q.adjust_quota(body.item_id, body.delta, ctx.now))
    ctx.record_command(body)
