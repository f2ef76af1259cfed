"""telecom.usage_record: RecordPackageUsage on the active item (may consume it: reason usage).

A record (version 2) naming a billing record id (`usage_id`) the user was billed for before is
acked as `duplicate_usage` and bills nothing, whatever its message_id; `recorded_at` decides
which item late traffic is billed to (domain/queue.py, UserQueue.record_usage)."""

from __future__ import annotations

from datetime import UTC, datetime

import structlog

from consumers.unit_of_work import HandlerContext, Needs, transition
from domain.delivery import Fate
from domain.events import DuplicateUsage
from events.models import RecordUsage

log = structlog.get_logger(__name__)

NO_RECORD_ID = Needs()


def needs(body: RecordUsage) -> Needs:
    if body.usage_id is None:
        return NO_RECORD_ID
    return Needs(usages=((body.user_id, body.usage_id),))


async def handle(ctx: HandlerContext, body: RecordUsage) -> None:
    recorded_at = (
        datetime.fromtimestamp(body.recorded_at, UTC) if body.recorded_at is not None else None
    )
    events = await transition(
        ctx,
        body.user_id,
        lambda q: q.record_usage(
            body.upload, body.download, ctx.now, usage_id=body.usage_id, recorded_at=recorded_at
        ),
    )
    if body.usage_id is None:
        return
    for event in events:
        if isinstance(event, DuplicateUsage):
            ctx.work.repeats[ctx.envelope.message_id] = Fate.DUPLICATE_USAGE
            log.info("duplicate_usage", usage_id=event.usage_id, billed_to=event.item_id)
            return
    ctx.work.billed_by[(body.user_id, body.usage_id)] = ctx.envelope.message_id
