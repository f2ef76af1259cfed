"""Publishing one outbox row, the same way from the relay and from a hand-off: its message's
properties as the row has them, a PRODUCER span from the moment it fell due, its route's key."""

from __future__ import annotations

from events.envelope import H_TRACEPARENT
from infra import tracing
from infra.postgres.outbox import ClaimedRow
from infra.rabbit.publisher import Publisher, build_properties
from infra.rabbit.topology import routing_key_for
from infra.settings import Settings


async def send_row(publisher: Publisher, settings: Settings, row: ClaimedRow) -> None:
    """Publish `row` and return once the broker has confirmed it (raise if it did not)."""
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
