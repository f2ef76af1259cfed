"""telecom.package_purchase: CreateQueueItems, then PackageQueuePushEvent."""

from __future__ import annotations

from consumers.unit_of_work import HandlerContext, Needs, transition
from domain.errors import UnknownPackageError
from events.models import PurchasePackage


def needs(body: PurchasePackage) -> Needs:
    return Needs(package_ids=(body.package_id,), new_items=body.amount)


async def handle(ctx: HandlerContext, body: PurchasePackage) -> None:
    package = ctx.package(body.package_id)
    if package is None:
        raise UnknownPackageError(body.package_id)
    # Ids and created_at are taken under the users' locks, so FIFO order (created_at, id) is
    # the order in which purchases committed, whatever order their transactions began in.
    item_ids, queued_at = ctx.new_item_ids(body.amount)
    await transition(
        ctx,
        body.user_id,
        lambda q: q.purchase(package, body.by_order, body.amount, item_ids, queued_at),
    )
