"""telecom.package_cancel: cancel an item; cancelling the active one advances the queue. The
cancel is announced (PackageCancelledEvent) and recorded in the item audit, with its reason,
the operator it claims and its publisher as the broker verified it."""

from __future__ import annotations

from consumers.unit_of_work import HandlerContext, Needs, transition
from events.models import CancelPackage


def needs(body: CancelPackage) -> Needs:
    return Needs(item_ids=(body.item_id,))


async def handle(ctx: HandlerContext, body: CancelPackage) -> None:
    await transition(
        ctx,
        body.user_id,
        lambda q: q.cancel(
            body.item_id, ctx.now, body.reason, body.operator, ctx.envelope.publisher
        ),
    )
    ctx.record_command(body)
