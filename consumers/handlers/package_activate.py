"""telecom.package_activate: grant access in the node-management read model.

Time expiry was already scheduled by the transaction that activated the item. The grant carries
the event's sequence number: an older event than the one last applied changes nothing (the
pipeline logs it as stale).
"""

from __future__ import annotations

from consumers.unit_of_work import HandlerContext, Needs
from events.models import PackageActivateEvent


def needs(body: PackageActivateEvent) -> Needs:
    return Needs(item_ids=(body.item_id,))  # it may have been consumed since


async def handle(ctx: HandlerContext, body: PackageActivateEvent) -> None:
    ctx.grant(body.user_id, body.item_id)
