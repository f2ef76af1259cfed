"""telecom.package_purchase: CreateQueueItems, then PackageQueuePushEvent."""

from __future__ import annotations

from consumers.unit_of_work import HandlerContext, transition
from domain.errors import UnknownPackageError
from events.models import PurchasePackage
from infra.postgres import catalog, queue_repo


async def handle(ctx: HandlerContext, body: PurchasePackage) -> None:
    package = await catalog.get_package(ctx.conn, body.package_id)
    if package is None:
        raise UnknownPackageError(body.package_id)
    item_ids = await queue_repo.allocate_item_ids(ctx.conn, body.amount)
    await transition(
        ctx,
        body.user_id,
        lambda q: q.purchase(package, body.by_order, body.amount, item_ids, ctx.now),
    )
