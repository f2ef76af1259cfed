"""telecom.usage_record: RecordPackageUsage on the active item (may consume it: reason usage)."""

from __future__ import annotations

from consumers.unit_of_work import HandlerContext, transition
from events.models import RecordUsage


async def handle(ctx: HandlerContext, body: RecordUsage) -> None:
    await transition(
        ctx, body.user_id, lambda q: q.record_usage(body.upload, body.download, ctx.now)
    )
