"""Publish a command or event straight to the exchange, validated and confirmed (`pkgq publish`)."""

from __future__ import annotations

from uuid import UUID, uuid4

from aio_pika.abc import AbstractRobustConnection

from events.envelope import Envelope
from events.models import WireModel
from events.routes import Route
from infra.rabbit.publisher import Publisher, build_message
from infra.rabbit.topology import declare_all, routing_key_for
from infra.settings import Settings


def versions_of(route: Route) -> str:
    """The schema versions `route` takes, for people: `2 (current) or 1`."""
    older = [str(v) for v in route.accepted_versions if v != route.schema_version]
    return " or ".join([f"{route.schema_version} (current)", *older])


def parse_body(route: Route, text: str, version: int | None = None) -> WireModel:
    """Validate JSON against the route's model of `version` (None: the current one), as it is
    sent: a previous version's body is checked against that version's model, not upcast
    (raises pydantic.ValidationError; ValueError for a version the route does not take)."""
    if version is None or version == route.schema_version:
        return route.model.model_validate_json(text)
    if route.previous is not None and version == route.previous.version:
        return route.previous.model.model_validate_json(text)
    raise ValueError(f"{route.name} takes schema version {versions_of(route)}, not {version}")


async def publish(
    settings: Settings,
    connection: AbstractRobustConnection,
    route: Route,
    body: WireModel,
    *,
    message_id: UUID | None = None,
    traceparent: str | None = None,
    priority: int | None = None,
    schema_version: int | None = None,
) -> UUID:
    """Publish `body` on `route` with a confirm. `traceparent`: the W3C trace context it
    continues (see infra/tracing.py); `priority`: the AMQP priority (0-2); `schema_version`:
    the version `body` is of (None: the route's current one)."""
    channel = await connection.channel()
    await declare_all(channel, settings)
    await channel.close()
    envelope = Envelope(
        message_id=message_id or uuid4(),
        message_type=route.message_type,
        schema_version=schema_version or route.schema_version,
        user_id=body.user_id,
        traceparent=traceparent,
    )
    publisher = await Publisher.open(connection, settings.exchange, user_id=settings.amqp_user)
    try:
        await publisher.publish(
            build_message(
                body.model_dump_json().encode(),
                message_id=envelope.message_id,
                message_type=envelope.message_type,
                headers=envelope.headers(),
                timestamp=envelope.timestamp,
                priority=priority,
            ),
            routing_key_for(settings, route.name, body.user_id),
        )
    finally:
        await publisher.close()
    return envelope.message_id
