"""consumers/dead_letter_forms.py: what a message that reaches the dead-letter queue is filed as."""

from __future__ import annotations

import dataclasses
import json
from datetime import UTC, datetime
from decimal import Decimal
from typing import Any
from uuid import uuid4

import pytest

from consumers import dead_letter_forms
from consumers.ingest import to_dead_letter
from events.decoding import RawDelivery
from events.envelope import (
    CONTENT_TYPE,
    H_DEAD_AT,
    H_DEAD_CONSUMER,
    H_DEAD_ERROR,
    H_DEAD_REASON,
    H_DEAD_TRACEBACK,
    H_USER_ID,
)
from events.routes import PACKAGE_ACTIVATE

ACTIVATE = PACKAGE_ACTIVATE.name  # "telecom.package_activate"


def delivery(
    headers: dict[str, Any],
    *,
    routing_key: str | None = ACTIVATE,
    message_id: str | None = "m-1",
    body: bytes = b'{"x": 1}',
) -> RawDelivery:
    return RawDelivery(
        body=body,
        message_id=message_id,
        message_type="PackageActivateEvent",
        content_type=CONTENT_TYPE,
        timestamp=None,
        headers=headers,
        routing_key=routing_key,
    )


def x_death(**entry: Any) -> dict[str, Any]:
    return {"x-death": [entry]}


def test_a_broker_dead_letter_takes_reason_queue_route_and_count_from_x_death() -> None:
    headers = x_death(
        reason="expired", queue="q1", count=2, **{"routing-keys": [ACTIVATE]}, exchange="telecom"
    )
    dead = to_dead_letter(delivery(headers, routing_key="something.else"))
    assert dead.source == "broker"
    assert dead.reason == "expired"
    assert dead.route == ACTIVATE
    assert dead.consumer == "package_activate"
    assert dead.consumer == PACKAGE_ACTIVATE.short_name
    assert dead.attempts == 2
    assert dead.error_type == "BrokerDeadLetter"
    assert "'q1'" in dead.error_message
    assert "expired" in dead.error_message
    assert dead.error_location == "queue q1"
    assert dead.message_id == "m-1"
    assert dead.body == b'{"x": 1}'


def test_a_broker_dead_letter_on_a_foreign_routing_key_is_filed_under_its_queue() -> None:
    headers = x_death(reason="rejected", queue="other.queue", **{"routing-keys": ["shop.order"]})
    dead = to_dead_letter(delivery(headers, routing_key="shop.order"))
    assert dead.route == "shop.order"
    assert dead.consumer == "other.queue"


def test_a_broker_dead_letter_without_routing_keys_uses_the_delivery_routing_key() -> None:
    dead = to_dead_letter(delivery(x_death(reason="maxlen", queue="q2"), routing_key=ACTIVATE))
    assert dead.route == ACTIVATE
    assert dead.consumer == "package_activate"
    assert dead.attempts == 1


def test_a_broker_dead_letter_without_x_death_falls_back_to_the_first_death_headers() -> None:
    headers = {"x-first-death-reason": "delivery_limit", "x-first-death-queue": "q3"}
    dead = to_dead_letter(delivery(headers, routing_key="unknown.key"))
    assert dead.reason == "delivery_limit"
    assert dead.consumer == "q3"
    assert "'q3'" in dead.error_message


def test_a_broker_dead_letter_with_no_death_information_has_reason_unknown() -> None:
    dead = to_dead_letter(delivery({}))
    assert dead.source == "broker"
    assert dead.reason == "unknown"
    assert dead.attempts == 1


def test_a_broker_dead_letter_with_a_non_integer_count_counts_as_one_attempt() -> None:
    dead = to_dead_letter(delivery(x_death(reason="expired", queue="q1", count="many")))
    assert dead.attempts == 1


def test_a_last_resort_copy_takes_reason_error_consumer_and_traceback_from_pkgq_headers() -> None:
    headers = {
        H_DEAD_REASON: "handler_error",
        H_DEAD_ERROR: "ValueError: boom",
        H_DEAD_CONSUMER: "package_activate",
        H_DEAD_TRACEBACK: "Traceback (most recent call last):\nValueError: boom\n",
        H_DEAD_AT: "2024-01-02T03:04:05+00:00",
    }
    dead = to_dead_letter(delivery(headers, routing_key=ACTIVATE))
    assert dead.source == "consumer"
    assert dead.reason == "handler_error"
    assert dead.error_type == "ValueError"
    assert dead.error_message == "boom"
    assert dead.consumer == "package_activate"
    assert dead.route == ACTIVATE
    assert dead.traceback == "Traceback (most recent call last):\nValueError: boom\n"
    assert dead.error_location == "consumer failure path"
    assert dead.attempts == 1


def test_a_last_resort_copy_splits_the_error_only_at_the_first_colon() -> None:
    headers = {H_DEAD_REASON: "handler_error", H_DEAD_ERROR: "KeyError: 'a: b'"}
    dead = to_dead_letter(delivery(headers))
    assert (dead.error_type, dead.error_message) == ("KeyError", "'a: b'")


def test_a_last_resort_copy_without_consumer_header_uses_the_route_short_name() -> None:
    headers = {H_DEAD_REASON: "publish_failed", H_DEAD_ERROR: "OSError: gone"}
    dead = to_dead_letter(delivery(headers, routing_key=ACTIVATE))
    assert dead.consumer == "package_activate"
    assert dead.traceback is None


def test_pkgq_dead_headers_on_a_broker_dead_letter_are_not_believed() -> None:
    # The broker adds x-death; pkgq's last-resort copy has none (it strips any it carried), so
    # x-pkgq-dead-* next to x-death were written by whoever published the original message.
    headers = {**x_death(reason="expired", queue="q1"), H_DEAD_REASON: "handler_error"}
    dead = to_dead_letter(delivery(headers))
    assert dead.source == "broker"
    assert dead.reason == "expired"


def test_an_integer_dead_traceback_header_is_filed_as_text() -> None:
    dead = to_dead_letter(delivery({H_DEAD_REASON: "handler_error", H_DEAD_TRACEBACK: 42}))
    assert dead.traceback == "42"


@pytest.mark.parametrize(
    "value",
    [
        {"a": {"b": {"c": 1}}},
        12,
        ["x"] * 3,
        "x" * 100_000,
        None,
        True,
    ],
)
def test_a_last_resort_copy_with_any_type_of_pkgq_header_is_filed_with_bounded_text(
    value: object,
) -> None:
    headers = {
        H_DEAD_REASON: value if value is not None else "r",
        H_DEAD_ERROR: value,
        H_DEAD_CONSUMER: value,
        H_DEAD_TRACEBACK: value,
    }
    dead = to_dead_letter(delivery(headers))
    assert dead.source == "consumer"
    assert len(dead.reason) <= 200
    assert len(dead.consumer) <= 300
    assert len(dead.error_message) <= 5000
    assert dead.traceback is None or len(dead.traceback) <= 17000


def test_a_dead_letter_whose_headers_cannot_be_read_is_filed_in_its_safe_form(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    def unreadable(*_: object) -> object:
        raise RecursionError("deeper than anything expected")

    monkeypatch.setattr(dead_letter_forms, "jsonable", unreadable)
    first = to_dead_letter(delivery({"x": 1}, message_id="m-1"))
    second = to_dead_letter(delivery({"x": 1}, message_id="m-2"))
    assert (first.reason, first.source, first.body) == ("unstorable", "broker", b'{"x": 1}')
    assert "RecursionError" in first.error_message
    assert first.dedup_key() != second.dedup_key()  # same body, two messages: two rows


def test_a_header_table_nested_600_deep_is_kept_to_a_bounded_depth() -> None:
    deep: object = "bottom"
    for _ in range(600):
        deep = {"a": deep}
    dead = to_dead_letter(delivery({"deep": deep, H_USER_ID: 7}))
    depth, level = 0, dead.headers["deep"]
    while isinstance(level, dict):
        depth, level = depth + 1, level["a"]
    assert depth < 20
    assert "too deep" in str(level)


def test_a_dead_letter_is_filed_under_the_user_its_body_names_not_its_header() -> None:
    user, claimed = uuid4(), uuid4()
    body = f'{{"user_id": "{user}"}}'.encode()
    dead = to_dead_letter(delivery({H_USER_ID: str(claimed)}, body=body))
    assert dead.user_id == user
    assert dead.headers[H_USER_ID] == str(claimed)  # kept, as a claim


@pytest.mark.parametrize(
    "value",
    [
        "0f6a3c1e-53a4-4c9b-9a55-6c1f3b7d2e10",
        b"0f6a3c1e-53a4-4c9b-9a55-6c1f3b7d2e10",
        "not-a-uuid",
        "",
        42,
    ],
)
def test_a_user_header_on_a_body_naming_no_user_files_it_under_no_user(value: object) -> None:
    assert to_dead_letter(delivery({H_USER_ID: value})).user_id is None


def test_a_body_that_is_no_json_object_gives_no_user() -> None:
    assert to_dead_letter(delivery({}, body=b"[" * 5000)).user_id is None
    assert to_dead_letter(delivery({}, body=b'"just text"')).user_id is None


def test_dead_letter_headers_are_made_json_ready() -> None:
    when = datetime(2024, 1, 2, 3, 4, 5, tzinfo=UTC)
    headers = {
        "x-blob": b"\xffabc",
        "x-when": when,
        "x-price": Decimal("1.50"),
        **x_death(reason="expired", queue="q1", time=when, **{"routing-keys": [b"rk"]}),
    }
    dead = to_dead_letter(delivery(headers, routing_key=None))
    assert dead.headers["x-blob"] == "\ufffdabc"
    assert dead.headers["x-when"] == "2024-01-02T03:04:05+00:00"
    assert dead.headers["x-price"] == "1.50"
    assert dead.headers["x-death"][0]["time"] == "2024-01-02T03:04:05+00:00"
    assert dead.route == "rk"
    assert json.loads(json.dumps(dead.headers)) == dead.headers


TRUSTED = "pkgq"


def test_a_forged_x_death_from_an_outsider_does_not_pass_for_a_broker_dead_letter() -> None:
    # Not the broker's shape (a text, not a list of tables): the dead-letter headers beside it
    # are an outsider's, so the copy is filed as untrusted, not under the reason it claims.
    raw = delivery(
        {"x-death": "forged", H_DEAD_REASON: "handler_error", "x-first-death-reason": "owned"}
    )
    raw = dataclasses.replace(raw, publisher="outsider")
    dead = to_dead_letter(raw, trusted_publisher=TRUSTED)
    assert dead.reason == "untrusted_publisher"


def test_a_broker_dead_letter_reason_the_broker_never_gives_is_filed_as_unknown() -> None:
    assert to_dead_letter(delivery(x_death(reason="i-said-so", queue="q"))).reason == "unknown"
    first = {"x-death": ["not a table"], "x-first-death-reason": "i-said-so"}
    assert to_dead_letter(delivery(first)).reason == "unknown"


def test_a_broker_dead_letter_of_an_outsiders_message_keeps_the_brokers_reason() -> None:
    # The broker puts its own entry first, whatever the publisher sent along.
    headers = {"x-death": [{"reason": "maxlen", "queue": "q1"}, {"reason": "forged"}]}
    raw = dataclasses.replace(delivery(headers), publisher="outsider")
    dead = to_dead_letter(raw, trusted_publisher=TRUSTED)
    assert (dead.source, dead.reason, dead.consumer) == ("broker", "maxlen", "package_activate")


@pytest.mark.parametrize("reason", [{"a": 1}, [1, 2], None, 7])
def test_an_x_death_reason_of_any_type_is_filed_without_raising(reason: object) -> None:
    headers = {"x-death": [{"reason": reason, "queue": "q"}], "x-first-death-reason": reason}
    outsider = dataclasses.replace(delivery(headers), publisher="outsider")
    assert to_dead_letter(outsider, trusted_publisher=TRUSTED).reason == "untrusted_publisher"
    assert to_dead_letter(delivery(headers)).reason == "unknown"


def test_an_outsiders_first_death_headers_without_x_death_are_not_believed() -> None:
    raw = delivery({"x-first-death-reason": "expired", "x-first-death-queue": "q"})
    outsider = dataclasses.replace(raw, publisher="outsider")
    dead = to_dead_letter(outsider, trusted_publisher=TRUSTED)
    assert dead.reason == "untrusted_publisher"
