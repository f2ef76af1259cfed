"""telecom.package_purchase: CreateQueueItems, then PackageQueuePushEvent. A purchase of an
order (by_order) the user bought before queues nothing: it is acked as a duplicate order. One
that would take the user beyond `max_queued_items` live items is refused (QueueFullError, a
domain rule: buried at once as domain_rule). `pkgq run` binds the cap from PKGQ_MAX_QUEUED_ITEMS
(consumers/runner.handler_for); called as it is, the handler keeps the default."""

from __future__ import annotations

import structlog

from consumers.unit_of_work import HandlerContext, Needs, transition
from domain.delivery import Fate
from domain.errors import MAX_QUEUED_ITEMS, UnknownPackageError
from domain.events import DuplicateOrder
from events.models import PurchasePackage

log = structlog.get_logger(__name__)


def needs(body: PurchasePackage) -> Needs:
    orders = ((body.user_id, body.by_order),) if body.by_order is not None else ()
    return Needs(package_ids=(body.package_id,), new_items=body.amount, orders=orders)


async def handle(
    ctx: HandlerContext, body: PurchasePackage, *, max_queued_items: int = MAX_QUEUED_ITEMS
) -> None:
    package = ctx.package(body.package_id)
    if package is None:
        raise UnknownPackageError(body.package_id)
    # Ids and created_at are taken under the users' locks, so FIFO order (created_at, id) is
    # the order in which purchases committed, whatever order their transactions began in.
    item_ids, queued_at = ctx.new_item_ids(body.amount)
    events = await transition(
        ctx,
        body.user_id,
        lambda q: q.purchase(
            package,
            body.by_order,
            body.amount,
            item_ids,
            queued_at,
            max_queued_items=max_queued_items,
        ),
    )
    for event in events:
        if isinstance(event, DuplicateOrder):
            ctx.work.repeats[ctx.envelope.message_id] = Fate.DUPLICATE_ORDER
            log.info(
                "duplicate_order",
                by_order=str(event.by_order),
                item_ids=list(event.item_ids),
                package_id=body.package_id,
                amount=body.amount,
            )
