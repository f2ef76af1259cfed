"""Text Postgres cannot store (NUL, a lone UTF-16 surrogate) is refused when a body is decoded,
in every text field of every wire model (schema_invalid, naming the field), before anything
reaches the database; header text is cleaned instead (a header is data, never refused for it).
"""

from __future__ import annotations

import json
from typing import Any
from uuid import uuid4

import pytest
from pydantic import ValidationError

from events.asyncapi_examples import PAYLOADS
from events.decoding import BadMessageError, RawDelivery, decode
from events.envelope import (
    CONTENT_TYPE,
    H_ADDRESS,
    H_SCHEMA_VERSION,
    H_TRACEPARENT,
    H_USER_ID,
    jsonable,
    unstorable,
)
from events.models import AdjustQuota, CancelPackage, WireModel
from events.routes import ALL_ROUTES, PACKAGE_CANCEL, Route

UNSTORABLE = {
    "nul": "refund\x00requested",
    "nul_alone": "\x00",
    "lone_high_surrogate": "refund \ud800",
    "lone_low_surrogate": "\udfff refund",
    "reversed_pair": "\udc00\ud800",
}
STORABLE = ["refund requested", "ünïcødé, 中文, 😀", "a\\u0000 typed out", "tab\tand\nnewline"]


def delivery(route: Route, body: str, headers: dict[str, Any] | None = None) -> RawDelivery:
    return RawDelivery(
        body=body.encode("utf-8", "surrogatepass"),
        message_id=str(uuid4()),
        message_type=route.message_type,
        content_type=CONTENT_TYPE,
        timestamp=None,
        headers=headers if headers is not None else {H_SCHEMA_VERSION: route.schema_version},
    )


def text_fields(model: type[WireModel]) -> list[str]:
    """The fields of `model` that hold free text (a string that is not a UUID or an enum)."""
    found = []
    for name, spec in model.model_json_schema()["properties"].items():
        options = spec.get("anyOf", [spec])
        if any(o.get("type") == "string" and "format" not in o for o in options):
            found.append(name)
    return found


TEXT_FIELDS = [
    (route, field) for route in ALL_ROUTES.values() for field in text_fields(route.model)
]


def test_the_models_with_text_are_found_so_the_tests_below_cover_them() -> None:
    assert {(r.model.__name__, f) for r, f in TEXT_FIELDS} == {
        (model, field)
        for model in ("CancelPackage", "AdjustQuota", "PackageCancelledEvent")
        for field in ("reason", "operator")
    } | {("PackageCancelledEvent", "publisher"), ("RecordUsage", "usage_id")}


@pytest.mark.parametrize("value", UNSTORABLE.values(), ids=UNSTORABLE.keys())
@pytest.mark.parametrize(
    ("route", "field"), TEXT_FIELDS, ids=[f"{r.short_name}.{f}" for r, f in TEXT_FIELDS]
)
def test_text_postgres_cannot_store_is_refused_as_schema_invalid_naming_the_field(
    route: Route, field: str, value: str
) -> None:
    # json.dumps writes a lone surrogate as its \ud800 escape, as any JSON producer would.
    body = json.dumps({**PAYLOADS[route.model.__name__], field: value})
    with pytest.raises(BadMessageError) as refused:
        decode(route, delivery(route, body), max_body_bytes=4096)
    assert refused.value.reason == "schema_invalid"
    assert refused.value.detail.startswith(f"{field}: text holds U+")
    assert "PostgreSQL cannot store" in refused.value.detail
    assert unstorable(refused.value.detail) is None  # the message itself can be stored


@pytest.mark.parametrize("value", STORABLE)
def test_text_postgres_can_store_is_accepted_as_sent(value: str) -> None:
    body = json.dumps({**PAYLOADS["CancelPackage"], "reason": value})
    decoded = decode(PACKAGE_CANCEL, delivery(PACKAGE_CANCEL, body), max_body_bytes=4096)
    assert isinstance(decoded.body, CancelPackage)
    assert decoded.body.reason == value


def test_an_operator_command_built_in_python_with_a_nul_is_refused_before_it_is_sent() -> None:
    # The CLI and the console build their commands as models: refused there, not by a consumer.
    with pytest.raises(ValidationError, match="unstorable_text"):
        AdjustQuota(user_id=uuid4(), item_id=1, delta=1, operator="ops\x00")
    with pytest.raises(ValidationError, match="unstorable_text"):
        CancelPackage(user_id=uuid4(), item_id=1, reason="\udcff")  # argv's surrogateescape


def test_a_lone_surrogate_in_a_field_name_is_schema_invalid_naming_it() -> None:
    body = json.dumps({**PAYLOADS["CancelPackage"], "note\ud800": 1})
    with pytest.raises(BadMessageError) as refused:
        decode(PACKAGE_CANCEL, delivery(PACKAGE_CANCEL, body), max_body_bytes=4096)
    assert refused.value.reason == "schema_invalid"
    assert refused.value.detail.startswith("note? (the field's name): text holds U+D800")


@pytest.mark.parametrize(
    "body",
    [
        '{"user_id": "\\ud800',  # cut short: broken whatever the escape
        '{"user_id": "\\ud800", }',  # a trailing comma too
        "[" * 5000 + '"\\ud800"' + "]" * 5000,  # deeper than any parser goes
    ],
)
def test_a_body_broken_besides_its_lone_surrogate_is_invalid_json(body: str) -> None:
    with pytest.raises(BadMessageError) as refused:
        decode(PACKAGE_CANCEL, delivery(PACKAGE_CANCEL, body), max_body_bytes=2**20)
    assert refused.value.reason == "invalid_json"


def test_a_nul_quoted_by_a_schema_error_is_not_repeated_in_its_detail() -> None:
    body = json.dumps({"user_id": "\x00" + str(uuid4()), "item_id": 1, "x\x00": 1})
    with pytest.raises(BadMessageError) as refused:
        decode(PACKAGE_CANCEL, delivery(PACKAGE_CANCEL, body), max_body_bytes=4096)
    assert refused.value.reason == "schema_invalid"
    assert "x\\0: Extra inputs are not permitted" in refused.value.detail
    assert unstorable(refused.value.detail) is None


@pytest.mark.parametrize("value", UNSTORABLE.values(), ids=UNSTORABLE.keys())
def test_header_text_postgres_cannot_store_is_cleaned_not_refused(value: str) -> None:
    body = json.dumps(PAYLOADS["CancelPackage"])
    headers = {
        H_SCHEMA_VERSION: 1,
        H_TRACEPARENT: value,
        H_ADDRESS: value.encode("utf-8", "surrogatepass"),  # bytes: not even UTF-8
        f"x-note{value}": [value, {value: value}],
    }
    decoded = decode(PACKAGE_CANCEL, delivery(PACKAGE_CANCEL, body, headers), max_body_bytes=4096)
    envelope = decoded.envelope
    assert envelope.traceparent is not None
    assert envelope.address is not None
    assert unstorable(envelope.traceparent) is None
    assert unstorable(envelope.address) is None
    # What the failure path files as jsonb (dead letters, parked messages, retries).
    stored = json.dumps(jsonable(headers))
    assert "\\u0000" not in stored
    assert all(unstorable(part) is None for part in _strings(json.loads(stored)))


def test_a_user_header_with_a_nul_is_schema_invalid_and_its_detail_storable() -> None:
    payload = PAYLOADS["CancelPackage"]
    headers = {H_SCHEMA_VERSION: 1, H_USER_ID: payload["user_id"] + "\x00"}
    body = json.dumps(payload)
    with pytest.raises(BadMessageError) as refused:
        decode(PACKAGE_CANCEL, delivery(PACKAGE_CANCEL, body, headers), max_body_bytes=4096)
    assert refused.value.reason == "schema_invalid"
    assert unstorable(refused.value.detail) is None


def _strings(value: Any) -> list[str]:
    if isinstance(value, str):
        return [value]
    if isinstance(value, dict):
        return [s for k, v in value.items() for s in (k, *_strings(v))]
    if isinstance(value, list):
        return [s for v in value for s in _strings(v)]
    return []
