"""The handler pattern: inbox, user lock, pure transition, write-back, outbox — one transaction."""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Iterable
from dataclasses import dataclass
from datetime import datetime
from typing import Any
from uuid import UUID

from domain.events import DomainEvent, ExpiryUnscheduled, PackageExpired, UsageRemaining
from domain.queue import UserQueue
from events.envelope import Envelope
from events.outgoing import expiry_key, outgoing
from infra.postgres import access, outbox, queue_repo
from infra.postgres.pool import Conn


@dataclass(frozen=True, slots=True)
class HandlerContext:
    conn: Conn
    now: datetime
    """The transaction's clock (Postgres `now()`), the same clock the relay schedules by."""
    envelope: Envelope
    outbox_rows: list[outbox.OutboxMessage] | None = None
    """Where follow-up events go when the caller writes a whole batch's outbox rows in one
    statement before it commits (None: written at once)."""
    traceparent: str | None = None
    """The trace context follow-up events carry: the span applying this message (see
    infra/tracing.py), or the incoming message's."""


Handler = Callable[[HandlerContext, Any], Awaitable[None]]


async def transition(
    ctx: HandlerContext,
    user_id: UUID,
    step: Callable[[UserQueue], list[DomainEvent]],
    *,
    item_ids: Iterable[int] = (),
) -> list[DomainEvent]:
    """Lock and load the user's queue, run `step`, write the new state and its events."""
    loaded = await queue_repo.load_queue(ctx.conn, user_id, item_ids)
    return await commit(ctx, loaded, step(loaded.queue))


async def commit(
    ctx: HandlerContext, loaded: queue_repo.LoadedQueue, events: list[DomainEvent]
) -> list[DomainEvent]:
    """Write back a loaded queue after its transition, and the events the transition caused.

    The events' sequence numbers come from the locked user row as loaded, and the new sequence
    is written with the rest of the row: no extra round trip for it."""
    user_id = loaded.queue.user_id
    withdrawn = [expiry_key(e.item_id) for e in events if isinstance(e, ExpiryUnscheduled)]
    # A timer scheduled and withdrawn in the same transaction (an item activated and consumed
    # at once) is never written; one written by an earlier transaction is deleted.
    messages = [
        out
        for event in events
        if (out := outgoing(event)) is not None and out.cancel_key not in withdrawn
    ]
    seqs = loaded.take_seqs(len(messages))
    await queue_repo.save_queue(ctx.conn, loaded)
    if ctx.outbox_rows is not None and withdrawn:
        # A timer scheduled earlier in the same batch is not written yet: drop it there.
        ctx.outbox_rows[:] = [m for m in ctx.outbox_rows if m.cancel_key not in withdrawn]
    await outbox.withdraw(ctx.conn, withdrawn)
    for event in events:
        # Node management sees remaining traffic change in the same transaction as billing.
        if isinstance(event, UsageRemaining):
            await access.set_remaining(ctx.conn, user_id, event.item_id, event.remaining)
        elif isinstance(event, PackageExpired):
            await access.set_remaining(ctx.conn, user_id, event.item_id, 0)
    rows = [
        outbox.from_outgoing(out, seq=seq, traceparent=ctx.traceparent or ctx.envelope.traceparent)
        for out, seq in zip(messages, seqs, strict=True)
    ]
    if ctx.outbox_rows is not None:
        ctx.outbox_rows.extend(rows)
    else:
        await outbox.enqueue(ctx.conn, rows)
    return events
