"""telecom.package_purchase: CreateQueueItems, then PackageQueuePushEvent."""

from __future__ import annotations

from consumers.unit_of_work import HandlerContext, commit
from domain.errors import UnknownPackageError
from events.models import PurchasePackage
from infra.postgres import catalog, queue_repo


async def handle(ctx: HandlerContext, body: PurchasePackage) -> None:
    package = await catalog.get_package(ctx.conn, body.package_id)
    if package is None:
        raise UnknownPackageError(body.package_id)
    loaded = await queue_repo.load_queue(ctx.conn, body.user_id)
    # Ids and created_at are taken under the user's lock, so FIFO order (created_at, id) is
    # the order in which purchases committed, whatever order their transactions began in.
    item_ids = await queue_repo.allocate_item_ids(ctx.conn, body.amount)
    queued_at = await ctx.conn.fetchval("SELECT clock_timestamp()")
    events = loaded.queue.purchase(package, body.by_order, body.amount, item_ids, queued_at)
    await commit(ctx, loaded, events)
