"""The AsyncAPI 3.0 document of every route: generated from the route table and the body
models, so it cannot say something the code does not do (`pkgq asyncapi`).

Servers: the broker over AMQP and AMQPS. Operations, from pkgq's side: it receives every
route it consumes, and sends every route it publishes through its outbox (lifecycle events,
announcements, and the retries and replays of commands). Each message has an example (checked
against its model by the tests). AsyncAPI's runtime expressions reach headers and payload only,
never AMQP properties, so the properties pkgq reads (message_id, type, content_type, user_id)
are given as the `x-amqp-properties` extension, and correlationId names the header that carries
message_id for clients that cannot set the property. deploy/asyncapi/check.sh validates the
document with the official AsyncAPI parser.
"""

from __future__ import annotations

from typing import Any

from events.asyncapi_examples import PAYLOADS, USER
from events.envelope import (
    CONTENT_TYPE,
    H_ADDRESS,
    H_ATTEMPT,
    H_EXPIRES_AT,
    H_GROUP,
    H_MESSAGE_ID,
    H_MESSAGE_TYPE,
    H_PRIORITY,
    H_PUBLISHER,
    H_SCHEMA_VERSION,
    H_SEQ,
    H_TRACEPARENT,
    H_USER_ID,
)
from events.models import WireModel
from events.routes import ALL_ROUTES, INBOUND_ROUTES, SUBSCRIBER_ROUTES, Route

AMQP_BINDING = "0.3.0"

HEADERS_SCHEMA: dict[str, Any] = {
    "type": "object",
    "required": [H_SCHEMA_VERSION],
    "properties": {
        H_SCHEMA_VERSION: {"type": "integer", "description": "Body schema version."},
        H_USER_ID: {
            "type": "string",
            "format": "uuid",
            "description": "The ordering key; must match the body's user_id when present.",
        },
        H_SEQ: {"type": "integer", "description": "Per-user event sequence, set by pkgq."},
        H_ATTEMPT: {"type": "integer", "minimum": 1, "description": "Delivery attempt."},
        H_TRACEPARENT: {"type": "string", "description": "W3C trace context."},
        H_ADDRESS: {
            "type": "string",
            "description": "Addressed work: at most one queued or in-flight message per address. "
            "Set by pkgq only: ignored on a message another AMQP user published.",
        },
        H_GROUP: {
            "type": "string",
            "format": "uuid",
            "description": "The group the message is a member of. Set by pkgq only: ignored on "
            "a message another AMQP user published.",
        },
        H_PUBLISHER: {
            "type": "string",
            "description": "Who published the message first (the broker-verified AMQP user_id, "
            "or `unverified`), on pkgq's own retries and replays of it. Set by pkgq only: "
            "ignored on a message another AMQP user published.",
        },
        H_EXPIRES_AT: {
            "type": "string",
            "format": "date-time",
            "description": "TTL: not applied after this instant; recorded as expired instead.",
        },
        H_PRIORITY: {
            "type": "integer",
            "minimum": 0,
            "maximum": 2,
            "description": "0-2, higher is more urgent (also the AMQP priority).",
        },
        H_MESSAGE_ID: {
            "type": "string",
            "format": "uuid",
            "description": "The message_id, for clients that cannot set the AMQP property "
            "(read only when the property is absent).",
        },
        H_MESSAGE_TYPE: {
            "type": "string",
            "description": "The type, for clients that cannot set the AMQP property "
            "(read only when the property is absent).",
        },
    },
}


def _properties(route: Route) -> dict[str, Any]:
    """The AMQP basic properties pkgq reads, as a JSON Schema (an AsyncAPI extension)."""
    return {
        "type": "object",
        "required": ["message_id", "type", "content_type"],
        "properties": {
            "message_id": {
                "type": "string",
                "format": "uuid",
                "description": "The idempotency key: the same message_id is applied once.",
            },
            "type": {"const": route.message_type},
            "content_type": {"const": CONTENT_TYPE},
            "delivery_mode": {"const": 2, "description": "Persistent."},
            "user_id": {
                "type": "string",
                "description": "The publishing connection's RabbitMQ user, validated by the "
                "broker. Lifecycle and internal routes are accepted only from pkgq's own user.",
            },
            "timestamp": {"type": "integer", "description": "Unix seconds."},
            "priority": {"type": "integer", "minimum": 0, "maximum": 2},
            "expiration": {
                "type": "string",
                "description": "Milliseconds: not consumed by then, it is dead-lettered as "
                "expired.",
            },
        },
    }


def _servers() -> dict[str, Any]:
    variables = {
        "host": {"default": "localhost", "description": "The RabbitMQ host."},
        "vhost": {"default": "%2F", "description": "The vhost, URL-encoded (%2F is /)."},
    }
    return {
        "amqp": {
            "host": "{host}:5672",
            "pathname": "/{vhost}",
            "protocol": "amqp",
            "protocolVersion": "0.9.1",
            "title": "RabbitMQ over AMQP",
            "variables": variables,
        },
        "amqps": {
            "host": "{host}:5671",
            "pathname": "/{vhost}",
            "protocol": "amqps",
            "protocolVersion": "0.9.1",
            "title": "RabbitMQ over AMQP with TLS",
            "description": "The broker's certificate verified against a CA; a client "
            "certificate where the broker asks for one (docs/how-to/tls.md).",
            "variables": variables,
        },
    }


def _headers(version: int) -> dict[str, Any]:
    """The headers of a message of `version`: x-schema-version is that version."""
    described = {
        "const": version,
        "description": "Body schema version (a route accepts its current one and the one "
        "before; a newer one waits for a newer pkgq: docs/how-to/upgrade.md).",
    }
    return {
        **HEADERS_SCHEMA,
        "properties": {**HEADERS_SCHEMA["properties"], H_SCHEMA_VERSION: described},
    }


def _versions(route: Route) -> list[tuple[str, int, type[WireModel]]]:
    """(message name, schema version, body model) of each version the route takes, newest
    first: the current one is named for its type, an older one `<type>.v<N>`."""
    found = [(route.message_type, route.schema_version, route.model)]
    if route.previous is not None:
        previous = route.previous
        found.append(
            (f"{route.message_type}.v{previous.version}", previous.version, previous.model)
        )
    return found


def _message(route: Route, name: str, version: int, model: type[WireModel]) -> dict[str, Any]:
    schema = model.model_json_schema(ref_template="#/components/schemas/{model}")
    doc = route.model.__doc__
    summary = doc.strip().splitlines()[0] if doc else route.message_type
    if version != route.schema_version:
        summary = f"{summary} Schema version {version}, still accepted and upcast on decode."
    payload = PAYLOADS[route.message_type]
    return {
        "name": name,
        "title": f"{route.message_type} (schema version {version})",
        "summary": summary,
        "contentType": CONTENT_TYPE,
        "headers": _headers(version),
        "payload": {key: value for key, value in schema.items() if key != "$defs"},
        "bindings": {"amqp": {"messageType": route.message_type, "bindingVersion": AMQP_BINDING}},
        "correlationId": {
            "description": "The AMQP message_id property (a UUID, see x-amqp-properties): the "
            "idempotency key. It is a property, not a header, which AsyncAPI locations cannot "
            f"address; this location is the {H_MESSAGE_ID} header that carries it for clients "
            "that cannot set the property.",
            "location": f"$message.header#/{H_MESSAGE_ID}",
        },
        "x-amqp-properties": _properties(route),
        "examples": [
            {
                "name": f"{route.short_name}_v{version}_example",
                "summary": f"A {route.message_type} of version {version} on {route.name}",
                "headers": {H_SCHEMA_VERSION: version, H_USER_ID: USER},
                "payload": {k: v for k, v in payload.items() if k in model.model_fields},
            }
        ],
    }


def document(exchange: str = "telecom", queue_prefix: str = "pkgq") -> dict[str, Any]:
    channels: dict[str, Any] = {}
    operations: dict[str, Any] = {}
    messages: dict[str, Any] = {}
    schemas: dict[str, Any] = {}
    for route in ALL_ROUTES.values():
        key = route.short_name
        versions = _versions(route)
        for name, version, model in versions:
            messages[name] = _message(route, name, version, model)
            schemas.update(
                model.model_json_schema(ref_template="#/components/schemas/{model}").get(
                    "$defs", {}
                )
            )
        channels[key] = {
            "address": route.name,
            "title": route.name,
            "messages": {
                name: {"$ref": f"#/components/messages/{name}"} for name, _, _ in versions
            },
            "bindings": {
                "amqp": {
                    "is": "routingKey",
                    "exchange": {
                        "name": exchange,
                        "type": "topic",
                        "durable": True,
                        "autoDelete": False,
                        "vhost": "/",
                    },
                    "bindingVersion": "0.3.0",
                }
            },
        }
        reference = [{"$ref": f"#/channels/{key}/messages/{name}"} for name, _, _ in versions]
        operations[f"publish_{key}"] = {
            "action": "send",
            "title": _sends(route, queue_prefix),
            "channel": {"$ref": f"#/channels/{key}"},
            "messages": reference,
            "bindings": {
                "amqp": {"deliveryMode": 2, "mandatory": True, "bindingVersion": AMQP_BINDING}
            },
        }
        if route.name in SUBSCRIBER_ROUTES:
            continue
        operations[f"consume_{key}"] = {
            "action": "receive",
            "title": f"pkgq consumes {route.name} from queue {queue_prefix}.{route.name}",
            "channel": {"$ref": f"#/channels/{key}"},
            "messages": reference,
            "bindings": {"amqp": {"ack": True, "bindingVersion": AMQP_BINDING}},
        }
    return {
        "asyncapi": "3.0.0",
        "info": {
            "title": "pkgq",
            "version": "1",
            "description": (
                "The telecom package queue: commands published to pkgq, and the lifecycle "
                "events pkgq publishes through its outbox. A route split into partitions is "
                "published to `<route>.p<k>` (docs/publishing.md)."
            ),
        },
        "defaultContentType": CONTENT_TYPE,
        "servers": _servers(),
        "channels": channels,
        "operations": operations,
        "components": {"messages": messages, "schemas": schemas},
    }


def _sends(route: Route, queue_prefix: str) -> str:
    if route.name in SUBSCRIBER_ROUTES:
        return (
            f"pkgq publishes {route.name} through its outbox for outside subscribers "
            f"(queue {queue_prefix}.{route.name}; pkgq runs no consumer for it)"
        )
    if route.name in INBOUND_ROUTES:
        return (
            f"outside systems publish {route.name} (docs/publishing.md); pkgq publishes it "
            "too, through its outbox: retries, replayed dead letters, `pkgq publish`"
        )
    return f"pkgq publishes {route.name} through its outbox (only pkgq's user may)"
