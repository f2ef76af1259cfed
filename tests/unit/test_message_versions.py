"""Versions N and N-1 on every route: the upcasters, and what decoding does with each version."""

from __future__ import annotations

import json
from datetime import UTC, datetime
from uuid import uuid4

import pytest

from events.decoding import BadMessageError, NewerVersionError, RawDelivery, decode
from events.envelope import CONTENT_TYPE, H_SCHEMA_VERSION, H_USER_ID
from events.models import RecordUsage, RecordUsageV1
from events.routes import PACKAGE_PURCHASE, ROUTES, USAGE_RECORD, Route
from events.versions import usage_v1_to_v2


def raw(route: Route, body: dict[str, object], version: object) -> RawDelivery:
    headers = {} if version is None else {H_SCHEMA_VERSION: version}
    return RawDelivery(
        body=json.dumps(body).encode(),
        message_id=str(uuid4()),
        message_type=route.message_type,
        content_type=CONTENT_TYPE,
        timestamp=datetime.now(UTC),
        headers=headers,
    )


def test_the_usage_upcaster_adds_no_record_id_and_no_time_and_keeps_the_rest() -> None:
    user = str(uuid4())
    assert usage_v1_to_v2({"user_id": user, "upload": 5, "download": 7}) == {
        "user_id": user,
        "upload": 5,
        "download": 7,
        "usage_id": None,
        "recorded_at": None,
    }


def test_the_usage_upcaster_does_not_change_its_argument() -> None:
    body = {"user_id": str(uuid4()), "upload": 1, "download": 2}
    before = dict(body)
    usage_v1_to_v2(body)
    assert body == before


def test_a_v1_usage_record_decodes_as_the_current_model_without_a_record_id() -> None:
    user = uuid4()
    decoded = decode(
        USAGE_RECORD,
        raw(USAGE_RECORD, {"user_id": str(user), "upload": 3, "download": 4}, 1),
        max_body_bytes=65536,
    )
    assert decoded.body == RecordUsage(user_id=user, upload=3, download=4)
    assert decoded.envelope.schema_version == 1


def test_a_v2_usage_record_keeps_its_record_id_and_time() -> None:
    user = uuid4()
    body = {"user_id": str(user), "upload": 3, "download": 4, "usage_id": "cdr-1"}
    decoded = decode(
        USAGE_RECORD,
        raw(USAGE_RECORD, {**body, "recorded_at": 1_700_000_000}, 2),
        max_body_bytes=65536,
    )
    assert isinstance(decoded.body, RecordUsage)
    assert decoded.body.usage_id == "cdr-1"
    assert decoded.body.recorded_at == 1_700_000_000
    assert decoded.envelope.schema_version == 2


def test_a_v1_body_with_a_v2_field_is_refused_as_v1_refuses_unknown_fields() -> None:
    body = {"user_id": str(uuid4()), "upload": 3, "download": 4, "usage_id": "cdr-1"}
    with pytest.raises(BadMessageError) as caught:
        decode(USAGE_RECORD, raw(USAGE_RECORD, body, 1), max_body_bytes=65536)
    assert caught.value.reason == "schema_invalid"
    assert "usage_id" in caught.value.detail


def test_a_usage_record_id_longer_than_128_characters_is_refused() -> None:
    body = {"user_id": str(uuid4()), "upload": 1, "download": 1, "usage_id": "x" * 129}
    with pytest.raises(BadMessageError) as caught:
        decode(USAGE_RECORD, raw(USAGE_RECORD, body, 2), max_body_bytes=65536)
    assert caught.value.reason == "schema_invalid"


@pytest.mark.parametrize("version", [0, -1, None, "abc"])
def test_a_version_older_than_the_previous_or_missing_is_refused(version: object) -> None:
    body = {"user_id": str(uuid4()), "upload": 1, "download": 1}
    with pytest.raises(BadMessageError) as caught:
        decode(USAGE_RECORD, raw(USAGE_RECORD, body, version), max_body_bytes=65536)
    assert caught.value.reason in {"unsupported_version", "invalid_header"}
    assert not isinstance(caught.value, NewerVersionError)


def test_a_route_without_a_previous_version_refuses_the_version_before_its_own() -> None:
    assert PACKAGE_PURCHASE.previous is None
    body = {"user_id": str(uuid4()), "package_id": 1}
    with pytest.raises(BadMessageError) as caught:
        decode(PACKAGE_PURCHASE, raw(PACKAGE_PURCHASE, body, 0), max_body_bytes=65536)
    assert caught.value.reason == "unsupported_version"


def test_a_newer_version_is_not_bad_input_but_left_for_a_newer_pkgq_with_its_user() -> None:
    user = uuid4()
    body = {"user_id": str(user), "upload": 1, "download": 1, "something_new": {"a": 1}}
    delivery = raw(USAGE_RECORD, body, USAGE_RECORD.schema_version + 1)
    with pytest.raises(NewerVersionError) as caught:
        decode(USAGE_RECORD, delivery, max_body_bytes=65536)
    newer = caught.value
    assert newer.reason == "newer_version"
    assert newer.version == USAGE_RECORD.schema_version + 1
    assert newer.user_id == user
    assert str(USAGE_RECORD.schema_version + 1) in newer.detail


@pytest.mark.parametrize("ahead", [2, 3, 17, 2**31, 10**29])
def test_a_version_further_ahead_than_the_next_is_buried_holding_nobody(ahead: int) -> None:
    body = {"user_id": str(uuid4()), "upload": 1, "download": 1}
    delivery = raw(USAGE_RECORD, body, USAGE_RECORD.schema_version + ahead)
    with pytest.raises(BadMessageError) as caught:
        decode(USAGE_RECORD, delivery, max_body_bytes=65536)
    assert not isinstance(caught.value, NewerVersionError)
    assert caught.value.reason == "unsupported_version"


def test_a_recorded_at_beyond_what_a_datetime_holds_is_schema_invalid() -> None:
    body = {"user_id": str(uuid4()), "upload": 1, "download": 1, "recorded_at": 2**40}
    with pytest.raises(BadMessageError) as caught:
        decode(USAGE_RECORD, raw(USAGE_RECORD, body, 2), max_body_bytes=65536)
    assert caught.value.reason == "schema_invalid"
    assert "recorded_at" in caught.value.detail


def test_a_newer_version_whose_body_names_no_readable_user_holds_nobody() -> None:
    for body in ({"upload": 1}, {"user_id": "not-a-uuid"}, [1, 2]):
        delivery = raw(USAGE_RECORD, body, USAGE_RECORD.schema_version + 1)  # type: ignore[arg-type]
        with pytest.raises(NewerVersionError) as caught:
            decode(USAGE_RECORD, delivery, max_body_bytes=65536)
        assert caught.value.user_id is None


def test_a_newer_version_whose_user_header_differs_from_its_body_is_schema_invalid() -> None:
    body = {"user_id": str(uuid4()), "upload": 1}
    delivery = raw(USAGE_RECORD, body, USAGE_RECORD.schema_version + 1)
    delivery = delivery.with_headers({**delivery.headers, H_USER_ID: str(uuid4())})
    with pytest.raises(BadMessageError) as caught:
        decode(USAGE_RECORD, delivery, max_body_bytes=65536)
    assert caught.value.reason == "schema_invalid"
    assert not isinstance(caught.value, NewerVersionError)


def test_every_previous_model_is_strict_and_refuses_unknown_fields() -> None:
    for route in ROUTES.values():
        if route.previous is None:
            continue
        config = route.previous.model.model_config
        assert config.get("strict") is True
        assert config.get("extra") == "forbid"
        assert route.previous.version == route.schema_version - 1


def test_the_v1_model_is_the_v2_model_without_its_new_fields() -> None:
    assert set(RecordUsage.model_fields) - set(RecordUsageV1.model_fields) == {
        "usage_id",
        "recorded_at",
    }
