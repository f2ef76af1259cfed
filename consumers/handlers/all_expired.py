"""telecom.all_expired: revoke access in the node-management read model (an older event than
the one last applied changes nothing)."""

from __future__ import annotations

from consumers.unit_of_work import HandlerContext
from events.models import AllPackageExpiredEvent


async def handle(ctx: HandlerContext, body: AllPackageExpiredEvent) -> None:
    ctx.revoke(body.user_id)
