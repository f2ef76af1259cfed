"""docs/asyncapi.json documents every route as the code defines it, and stays current."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from events.asyncapi import document
from events.routes import ALL_ROUTES, PACKAGE_CANCELLED, ROUTES

COMMITTED = Path(__file__).resolve().parents[2] / "docs" / "asyncapi.json"


def test_the_committed_asyncapi_document_is_current() -> None:
    assert json.loads(COMMITTED.read_text()) == json.loads(json.dumps(document())), (
        "docs/asyncapi.json is stale: regenerate it with `pkgq asyncapi > docs/asyncapi.json`"
    )


def test_every_route_is_a_channel_with_its_message_and_a_receive_operation() -> None:
    doc = document()
    assert doc["asyncapi"] == "3.0.0"
    assert {c["address"] for c in doc["channels"].values()} == set(ALL_ROUTES)
    for route in ALL_ROUTES.values():
        payload = doc["components"]["messages"][route.message_type]["payload"]
        assert "user_id" in payload["required"]
        assert payload["additionalProperties"] is False  # unknown fields are refused
    for route in ROUTES.values():
        assert doc["operations"][f"consume_{route.short_name}"]["action"] == "receive"


def test_the_cancellation_event_is_documented_as_published_for_outside_subscribers() -> None:
    doc = document()

    operation = doc["operations"][f"publish_{PACKAGE_CANCELLED.short_name}"]

    assert operation["action"] == "send"
    assert f"consume_{PACKAGE_CANCELLED.short_name}" not in doc["operations"]
    payload = doc["components"]["messages"]["PackageCancelledEvent"]["payload"]
    assert {"item_id", "package_id", "cancelled_at", "was_active"} <= set(payload["required"])
    assert {"reason", "operator"} <= set(payload["properties"])


def test_every_reference_in_the_document_resolves() -> None:
    doc = document()

    def refs(node: Any) -> list[str]:
        if isinstance(node, dict):
            found = [node["$ref"]] if isinstance(node.get("$ref"), str) else []
            return found + [r for value in node.values() for r in refs(value)]
        if isinstance(node, list):
            return [r for value in node for r in refs(value)]
        return []

    for ref in refs(doc):
        target: Any = doc
        for part in ref.removeprefix("#/").split("/"):
            target = target[part]  # KeyError: a dangling reference
        assert target


def test_the_document_names_the_broker_over_amqp_and_amqps() -> None:
    servers = document()["servers"]
    assert {s["protocol"] for s in servers.values()} == {"amqp", "amqps"}
    assert servers["amqps"]["host"].endswith(":5671")
    assert all(s["protocolVersion"] == "0.9.1" for s in servers.values())


def test_pkgq_sends_every_route_it_publishes_and_receives_every_route_it_consumes() -> None:
    operations = document()["operations"]
    sent = {op["channel"]["$ref"] for op in operations.values() if op["action"] == "send"}
    received = {op["channel"]["$ref"] for op in operations.values() if op["action"] == "receive"}
    lifecycle = [r for r in ROUTES.values() if not r.inbound]
    assert {f"#/channels/{r.short_name}" for r in lifecycle} <= sent
    assert f"#/channels/{PACKAGE_CANCELLED.short_name}" in sent
    assert received == {f"#/channels/{r.short_name}" for r in ROUTES.values()}


def test_every_message_example_is_a_body_pkgq_accepts_with_the_headers_it_needs() -> None:
    messages = document()["components"]["messages"]
    for route in ALL_ROUTES.values():
        (example,) = messages[route.message_type]["examples"]
        body = route.model.model_validate_json(json.dumps(example["payload"]))
        assert example["headers"]["x-schema-version"] == route.schema_version
        assert example["headers"]["x-user-id"] == str(body.user_id)


def test_message_id_is_an_amqp_property_and_the_correlation_id_names_its_fallback_header() -> None:
    for message in document()["components"]["messages"].values():
        properties = message["x-amqp-properties"]
        assert "message_id" in properties["required"]
        assert "message_id" not in message["headers"]["properties"]
        location = message["correlationId"]["location"]
        assert location.startswith("$message.header#/")
        assert location.removeprefix("$message.header#/") in message["headers"]["properties"]
        assert "property" in message["correlationId"]["description"]
