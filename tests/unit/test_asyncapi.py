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
