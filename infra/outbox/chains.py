"""One round's rows published as chains, one per user: every chain at once, but within a chain a
row is sent only after the row before it is confirmed; a chain stops at its first failure, and
every chain stops once a publish failed (the channel is renewed: infra/outbox/relay.py).

Why a user's next row waits for the previous row's confirm, rather than being sent right behind
it: a publish can fail on its own while a later one on the same channel succeeds. The broker
returns an unroutable message (`mandatory`) but routes the next one if its route has a queue; a
queue nacks one message (internal error, a `reject-publish` length limit) and accepts the next
once it has room; a broker crash can lose an unconfirmed message on one queue but not a later
one on another. Had the later row been sent, it would be in its queue, consumed and applied
before the failed row's retry: a user's events applied out of order, which re-sending the later
row (the inbox drops it) cannot undo. Waiting for the confirm means a row is on the broker,
durably, before anything after it is sent. The throughput cost is one confirm round trip per
row of a user (about 1 ms locally); different users' chains, and overlapping rounds, keep the
channel busy meanwhile. The publishes begun together (each chain's first row, and rows whose
confirms came together) are handed to the connection's writer as one frame
(infra/rabbit/wire/coalesce.py).
"""

from __future__ import annotations

import asyncio
import time
from collections import defaultdict
from collections.abc import Awaitable, Callable
from uuid import UUID

import structlog

from events.envelope import H_TRACEPARENT
from infra import faults, tracing
from infra.observability import RELAY_LAG
from infra.postgres.outbox import ClaimedRow
from infra.rabbit.publisher import Publisher, build_properties
from infra.rabbit.topology import routing_key_for
from infra.settings import Settings

log = structlog.get_logger(__name__)


async def publish_in_chains(
    rows: list[ClaimedRow],
    send: Callable[[ClaimedRow], Awaitable[None]],
    renewing: Callable[[], bool],
    failed: Callable[[BaseException], None],
) -> tuple[list[int], list[int], str]:
    """Send `rows` (confirmed, one by one within each user's chain). `renewing()`: whether the
    channel is to be replaced (a publish failed, here or in another round): the chains stop
    there; `failed(exc)` is told of each failed publish. Returns the ids confirmed, the ids
    not sent or failed, and the first errors."""
    chains: dict[UUID | None, list[ClaimedRow]] = defaultdict(list)
    for row in rows:
        chains[row.user_id].append(row)
    done: list[int] = []
    not_sent: list[int] = []
    errors: list[str] = []

    async def send_chain(chain: list[ClaimedRow]) -> None:
        for row in chain:
            if renewing():
                not_sent.append(row.id)  # another chain's publish failed: not on this channel
                return
            try:
                await send(row)
            except Exception as exc:  # noqa: BLE001  (the row stays pending: retried)
                not_sent.append(row.id)
                errors.append(repr(exc))
                failed(exc)
                log.warning("publish_failed", message_id=str(row.message_id), error=repr(exc))
                return  # the rest of the chain stays unsent, so nothing overtakes this row
            done.append(row.id)
            if row.available_at is not None:
                RELAY_LAG.observe(max(0.0, time.time() - row.available_at.timestamp()))
            faults.hit(faults.RELAY_AFTER_CONFIRM, route=row.route)

    await asyncio.gather(*(send_chain(c) for c in chains.values()))
    return done, not_sent, "; ".join(errors[:3])


async def send_row(publisher: Publisher, settings: Settings, row: ClaimedRow) -> None:
    """Publish one row and return once it is confirmed (raise if it is not)."""
    incoming = row.headers.get(H_TRACEPARENT)
    with tracing.publishing(
        row.route,
        row.message_id,
        incoming if isinstance(incoming, str) else None,
        row.available_at,
    ) as traceparent:
        headers = row.headers
        if traceparent is not None and traceparent != incoming:
            headers = {**row.headers, H_TRACEPARENT: traceparent}
        properties = build_properties(
            message_id=row.message_id,
            message_type=row.message_type,
            headers=headers,
            priority=row.priority,
            expiration_ms=row.ttl_ms if row.expires_at is not None else None,
        )
        await publisher.publish_properties(
            row.body, properties, routing_key_for(settings, row.route, row.user_id)
        )
