"""telecom.all_expired: revoke access in the node-management read model."""

from __future__ import annotations

import structlog

from consumers.unit_of_work import HandlerContext
from events.models import AllPackageExpiredEvent
from infra.postgres import access

log = structlog.get_logger(__name__)


async def handle(ctx: HandlerContext, body: AllPackageExpiredEvent) -> None:
    applied = await access.revoke(ctx.conn, body.user_id, ctx.envelope.seq or 0)
    if not applied:
        log.info("access_update_stale", seq=ctx.envelope.seq)
