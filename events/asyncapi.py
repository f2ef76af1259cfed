"""The AsyncAPI 3.0 document of every route: generated from the route table and the body
models, so it cannot say something the code does not do (`pkgq asyncapi`)."""

from __future__ import annotations

from typing import Any

from events.envelope import (
    CONTENT_TYPE,
    H_ADDRESS,
    H_ATTEMPT,
    H_EXPIRES_AT,
    H_GROUP,
    H_PRIORITY,
    H_SCHEMA_VERSION,
    H_SEQ,
    H_TRACEPARENT,
    H_USER_ID,
)
from events.routes import ALL_ROUTES, SUBSCRIBER_ROUTES, Route

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
    },
}


def _message(route: Route) -> dict[str, Any]:
    schema = route.model.model_json_schema(ref_template="#/components/schemas/{model}")
    return {
        "name": route.message_type,
        "title": route.message_type,
        "summary": (route.model.__doc__ or "").strip().splitlines()[0]
        if route.model.__doc__
        else route.message_type,
        "contentType": CONTENT_TYPE,
        "headers": HEADERS_SCHEMA,
        "payload": {key: value for key, value in schema.items() if key != "$defs"},
        "bindings": {
            "amqp": {
                "messageType": route.message_type,
                "deliveryMode": 2,
                "bindingVersion": "0.3.0",
            }
        },
        "correlationId": {
            "description": "The AMQP message_id (a UUID): the idempotency key.",
            "location": "$message.header#/message_id",
        },
    }


def document(exchange: str = "telecom", queue_prefix: str = "pkgq") -> dict[str, Any]:
    channels: dict[str, Any] = {}
    operations: dict[str, Any] = {}
    messages: dict[str, Any] = {}
    schemas: dict[str, Any] = {}
    for route in ALL_ROUTES.values():
        key = route.short_name
        message = _message(route)
        messages[route.message_type] = message
        defs = route.model.model_json_schema(ref_template="#/components/schemas/{model}").get(
            "$defs", {}
        )
        schemas.update(defs)
        channels[key] = {
            "address": route.name,
            "title": route.name,
            "messages": {
                route.message_type: {"$ref": f"#/components/messages/{route.message_type}"}
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
        if route.name in SUBSCRIBER_ROUTES:
            operations[f"publish_{key}"] = {
                "action": "send",
                "title": (
                    f"pkgq publishes {route.name} through its outbox for outside subscribers "
                    f"(queue {queue_prefix}.{route.name}; pkgq runs no consumer for it)"
                ),
                "channel": {"$ref": f"#/channels/{key}"},
                "messages": [{"$ref": f"#/channels/{key}/messages/{route.message_type}"}],
            }
            continue
        operations[f"consume_{key}"] = {
            "action": "receive",
            "title": f"pkgq consumes {route.name} from queue {queue_prefix}.{route.name}",
            "channel": {"$ref": f"#/channels/{key}"},
            "messages": [{"$ref": f"#/channels/{key}/messages/{route.message_type}"}],
        }
    return {
        "asyncapi": "3.0.0",
        "info": {
            "title": "pkgq",
            "version": "1",
            "description": (
                "The telecom package queue: commands published to pkgq, and the lifecycle "
                "events pkgq publishes through its outbox. A route split into partitions is "
                "published to `<route>.p<k>` (see the README)."
            ),
        },
        "defaultContentType": CONTENT_TYPE,
        "channels": channels,
        "operations": operations,
        "components": {"messages": messages, "schemas": schemas},
    }
