"""A job handler for the conformance tests: records what it ran, in order, and misbehaves on
request. It serves the usage_record route (any route would do: the semantics under test are the
messaging layer's, not the package queue's), and the body's `upload` says what to do:

- `HANG_ONCE`: hang past the TTR on the first delivery, succeed after;
- `BURY`: raise Bury; `BURY_ONCE`: raise Bury unless it was buried before (then replayed);
- `RETRY_LATER`: raise Retry(delay=3600);
- `BLOCK`: wait until the test opens `gate`;
- `FAIL_FIRST`: fail (a plain error: retried by the policy) on the first attempt;
  `FAIL_ALWAYS`: fail on every attempt;
- anything else: succeed (after `pause` seconds).
"""

from __future__ import annotations

import asyncio
from dataclasses import dataclass, field
from uuid import UUID

import asyncpg

from consumers.delivery import DeliveryPipeline
from consumers.handler_errors import Bury, Retry
from consumers.retry_policy import RetryPolicy
from consumers.unit_of_work import HandlerContext
from events.models import RecordUsage
from events.routes import USAGE_RECORD

HANG_ONCE = 900_001
BURY = 900_002
BURY_ONCE = 900_003
RETRY_LATER = 900_004
BLOCK = 900_005
FAIL_FIRST = 900_006
FAIL_ALWAYS = 900_007


@dataclass
class Recorder:
    """What the handler saw: `ran` in commit order is not known to it, so `started` is the order
    the handler was entered and `applied` the order it returned successfully."""

    pause: float = 0.0
    started: list[UUID] = field(default_factory=list)
    applied: list[UUID] = field(default_factory=list)
    bodies: dict[UUID, RecordUsage] = field(default_factory=dict)
    running: int = 0
    max_running: int = 0
    gate: asyncio.Event = field(default_factory=asyncio.Event)
    hung_once: set[UUID] = field(default_factory=set)

    async def handle(self, ctx: HandlerContext, body: RecordUsage) -> None:
        message_id = ctx.envelope.message_id
        self.started.append(message_id)
        self.bodies[message_id] = body
        self.running += 1
        self.max_running = max(self.max_running, self.running)
        try:
            if body.upload == HANG_ONCE and message_id not in self.hung_once:
                self.hung_once.add(message_id)
                await asyncio.sleep(3600)
            if body.upload == BURY:
                raise Bury("needs_a_human", "the handler buried it")
            if body.upload == BURY_ONCE and not await _was_buried(ctx):
                # Decided from the database, not from memory: a delivery rolled back (a TTR in
                # its batch) is not a burial.
                raise Bury("needs_a_human", "the handler buried it once")
            if body.upload == RETRY_LATER:
                raise Retry(delay=3600)
            if body.upload == FAIL_ALWAYS or (
                body.upload == FAIL_FIRST and ctx.envelope.attempt == 1
            ):
                raise RuntimeError(f"attempt {ctx.envelope.attempt} fails")
            if body.upload == BLOCK:
                await self.gate.wait()
            if self.pause:
                await asyncio.sleep(self.pause)
            self.applied.append(message_id)
        finally:
            self.running -= 1

    def uploads(self, ids: list[UUID]) -> list[int]:
        return [self.bodies[i].upload for i in ids]


async def _was_buried(ctx: HandlerContext) -> bool:
    found = await ctx.conn.fetchval(
        "SELECT 1 FROM telecom.dead_letters WHERE message_id = $1", str(ctx.envelope.message_id)
    )
    return found is not None


def recording_pipeline(
    pool: asyncpg.Pool,
    recorder: Recorder,
    *,
    ttr: float | None = None,
    max_attempts: int = 5,
    retry_after: float = 0.2,
) -> DeliveryPipeline:
    return DeliveryPipeline(
        pool,
        USAGE_RECORD,
        recorder.handle,
        RetryPolicy(max_attempts=max_attempts, backoff=lambda attempt: retry_after),
        max_body_bytes=2**20,
        ttr=ttr,
    )


def usage(user: UUID, upload: int) -> RecordUsage:
    return RecordUsage(user_id=user, upload=upload, download=0)
