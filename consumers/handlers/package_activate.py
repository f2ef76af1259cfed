"""telecom.package_activate: grant access in the node-management read model.

Time expiry was already scheduled by the transaction that activated the item.
"""

from __future__ import annotations

import structlog

from consumers.unit_of_work import HandlerContext
from events.models import PackageActivateEvent
from infra.postgres import access

log = structlog.get_logger(__name__)


async def handle(ctx: HandlerContext, body: PackageActivateEvent) -> None:
    applied = await access.grant(ctx.conn, body.user_id, body.item_id, ctx.envelope.seq or 0)
    if not applied:
        log.info("access_update_stale", item_id=body.item_id, seq=ctx.envelope.seq)
