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


class Sender:
    """Publishes many messages on one connection: the topology declared once when it opens,
    then one confirming channel for every message (`publish` opens one per message, and
    declaring every route's queues and bindings costs dozens of round trips)."""

    def __init__(self, settings: Settings, publisher: Publisher) -> None:
        self._settings = settings
        self._publisher = publisher

    @classmethod
    async def open(cls, settings: Settings, connection: AbstractRobustConnection) -> Sender:
        channel = await connection.channel()
        await declare_all(channel, settings)
        await channel.close()
        return cls(
            settings,
            await Publisher.open(connection, settings.exchange, user_id=settings.amqp_user),
        )

    async def send(
        self,
        route: Route,
        body: WireModel,
        *,
        message_id: UUID | None = None,
        traceparent: str | None = None,
        priority: int | None = None,
        schema_version: int | None = None,
    ) -> UUID:
        """Publish `body` on `route` with a confirm; its message_id. `traceparent`: the W3C
        trace context it continues (see infra/tracing.py); `priority`: the AMQP priority
        (0-2); `schema_version`: the version `body` is of (None: the route's current one)."""
        envelope = Envelope(
            message_id=message_id or uuid4(),
            message_type=route.message_type,
            schema_version=schema_version or route.schema_version,
            user_id=body.user_id,
            traceparent=traceparent,
        )
        await self._publisher.publish(
            build_message(
                body.model_dump_json().encode(),
                message_id=envelope.message_id,
                message_type=envelope.message_type,
                headers=envelope.headers(),
                timestamp=envelope.timestamp,
                priority=priority,
            ),
            routing_key_for(self._settings, route.name, body.user_id),
        )
        return envelope.message_id

    async def close(self) -> None:
        if self._publisher.is_open:
            await self._publisher.close()


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
    """Publish one message (see Sender.send): the topology declared first, so that it is
    routable whatever ran before (a one-off, such as `pkgq publish`)."""
    sender = await Sender.open(settings, connection)
    try:
        return await sender.send(
            route,
            body,
            message_id=message_id,
            traceparent=traceparent,
            priority=priority,
            schema_version=schema_version,
        )
    finally:
        await sender.close()
