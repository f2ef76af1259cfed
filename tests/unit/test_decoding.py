"""Decoding a delivery: every way a message can be unprocessable has its own reason code."""

from __future__ import annotations

import json
from datetime import UTC, datetime
from decimal import Decimal
from uuid import uuid4

import pytest

from events.decoding import BadMessageError, RawDelivery, decode
from events.envelope import (
    CONTENT_TYPE,
    H_ADDRESS,
    H_ATTEMPT,
    H_EXPIRES_AT,
    H_GROUP,
    H_SCHEMA_VERSION,
    H_SEQ,
    H_TRACEPARENT,
    H_USER_ID,
    jsonable,
)
from events.models import RecordUsage
from events.routes import USAGE_RECORD
from tests.support.hostile import nested

USER = uuid4()
GOOD = json.dumps({"user_id": str(USER), "upload": 1, "download": 2}).encode()


def raw(body: bytes = GOOD, **overrides: object) -> RawDelivery:
    values: dict[str, object] = {
        "body": body,
        "message_id": str(uuid4()),
        "message_type": USAGE_RECORD.message_type,
        "content_type": CONTENT_TYPE,
        "timestamp": None,
        "headers": {H_SCHEMA_VERSION: 1, H_USER_ID: str(USER), H_SEQ: 4, H_ATTEMPT: 2},
    }
    values.update(overrides)
    return RawDelivery(**values)  # type: ignore[arg-type]  # keys are RawDelivery fields


def test_a_valid_delivery_decodes_into_envelope_and_body() -> None:
    decoded = decode(USAGE_RECORD, raw(), max_body_bytes=1024)
    assert isinstance(decoded.body, RecordUsage)
    assert decoded.body.download == 2
    assert decoded.envelope.user_id == USER
    assert (decoded.envelope.seq, decoded.envelope.attempt) == (4, 2)


@pytest.mark.parametrize(
    ("delivery", "reason"),
    [
        (raw(b" " * 2000), "oversized"),
        (raw(message_id=None), "missing_message_id"),
        (raw(message_id="42"), "invalid_message_id"),
        (raw(content_type="text/plain"), "wrong_content_type"),
        (raw(message_type="PurchasePackage"), "unknown_type"),
        (raw(headers={}), "unsupported_version"),
        (raw(headers={H_SCHEMA_VERSION: 0}), "unsupported_version"),
        (raw(headers={H_SCHEMA_VERSION: 3}), "newer_version"),
        (raw(headers={H_SCHEMA_VERSION: "one"}), "invalid_header"),
        (raw(b"\xff\xfe\xfd"), "invalid_utf8"),
        (raw(b'{"user_id": '), "invalid_json"),
        (
            raw(json.dumps({"user_id": str(USER), "upload": -1, "download": 0}).encode()),
            "schema_invalid",
        ),
        (
            raw(json.dumps({"user_id": str(USER), "upload": 1.5, "download": 0}).encode()),
            "schema_invalid",
        ),
        (raw(headers={H_SCHEMA_VERSION: 1, H_USER_ID: str(uuid4())}), "schema_invalid"),
    ],
)
def test_each_bad_delivery_is_refused_with_its_own_reason(
    delivery: RawDelivery, reason: str
) -> None:
    with pytest.raises(BadMessageError) as refused:
        decode(USAGE_RECORD, delivery, max_body_bytes=1024)
    assert refused.value.reason == reason
    assert refused.value.detail


@pytest.mark.parametrize(
    ("seq", "attempt"),
    [(-1, -(10**6)), (2**53, 0), (2**62, 10**12), ("7", "2"), (True, True), ({"t": 1}, [1])],
)
def test_an_out_of_range_or_mistyped_seq_or_attempt_is_ignored_not_fatal(
    seq: object, attempt: object
) -> None:
    headers = {H_SCHEMA_VERSION: 1, H_USER_ID: str(USER), H_SEQ: seq, H_ATTEMPT: attempt}
    decoded = decode(USAGE_RECORD, raw(headers=headers), max_body_bytes=1024)
    assert (decoded.envelope.seq, decoded.envelope.attempt) == (None, 1)


@pytest.mark.parametrize("value", [nested(600), "x" * 100_000, 12, [1, 2], b"\xff" * 10])
def test_any_value_of_a_text_header_decodes_or_is_refused_with_a_short_reason(
    value: object,
) -> None:
    refusals: list[BadMessageError] = []
    for name in (H_USER_ID, H_TRACEPARENT, H_ADDRESS, H_GROUP, H_EXPIRES_AT):
        headers = {H_SCHEMA_VERSION: 1, name: value}
        try:
            decoded = decode(USAGE_RECORD, raw(headers=headers), max_body_bytes=1024)
        except BadMessageError as refused:
            refusals.append(refused)
            continue
        assert decoded.envelope.user_id == USER
        assert len(decoded.envelope.address or "") <= 600
        assert len(decoded.envelope.traceparent or "") <= 300
    # A user id that is text but not the body's is a schema error; anything else unreadable is
    # a bad header. Either way the reason is short: never the repr of what was sent.
    assert {r.reason for r in refusals} <= {"invalid_header", "schema_invalid"}
    assert all(len(r.detail) < 300 for r in refusals)


def test_a_600_deep_schema_version_header_is_refused_with_a_short_reason() -> None:
    headers = {H_SCHEMA_VERSION: nested(600)}
    with pytest.raises(BadMessageError) as refused:
        decode(USAGE_RECORD, raw(headers=headers), max_body_bytes=1024)
    assert refused.value.reason == "invalid_header"
    assert "a dict" in refused.value.detail


@pytest.mark.parametrize(
    "claimed",
    [Decimal("1.5"), datetime(2026, 1, 1, tzinfo=UTC), b"0f6a3c1e-53a4-4c9b-9a55-6c1f3b7d2e10"],
    ids=["decimal", "time", "bytes"],
)
def test_a_user_header_decodes_alike_at_the_door_and_from_the_parking_lot(claimed: object) -> None:
    """The parking lot keeps a delivery's headers as JSON (events.envelope.jsonable): a user
    header that is no text at the door (a decimal, a time) is read as that JSON text there too,
    so a copy that names another user is refused at once, never parked to fail on its drain."""
    headers = {H_SCHEMA_VERSION: 1, H_USER_ID: claimed}
    at_the_door = raw(headers=headers)
    parked = raw(headers=jsonable(headers))
    outcomes = []
    for delivery in (at_the_door, parked):
        try:
            decode(USAGE_RECORD, delivery, max_body_bytes=1024)
            outcomes.append("decoded")
        except BadMessageError as refused:
            outcomes.append(refused.reason)
    assert outcomes == ["schema_invalid", "schema_invalid"]
