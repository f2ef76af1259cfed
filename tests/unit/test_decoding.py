"""Decoding a delivery: every way a message can be unprocessable has its own reason code."""

from __future__ import annotations

import json
from uuid import uuid4

import pytest

from events.decoding import BadMessageError, RawDelivery, decode
from events.envelope import CONTENT_TYPE, H_ATTEMPT, H_SCHEMA_VERSION, H_SEQ, H_USER_ID
from events.models import RecordUsage
from events.routes import USAGE_RECORD

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
        (raw(headers={H_SCHEMA_VERSION: 2}), "unsupported_version"),
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
