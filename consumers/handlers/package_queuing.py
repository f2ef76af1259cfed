"""telecom.package_queuing: process_package_queue_push (activate the oldest if none is active)."""

from __future__ import annotations

from consumers.unit_of_work import HandlerContext, transition
from events.models import PackageQueuePushEvent


async def handle(ctx: HandlerContext, body: PackageQueuePushEvent) -> None:
    await transition(ctx, body.user_id, lambda q: q.advance(ctx.now))
