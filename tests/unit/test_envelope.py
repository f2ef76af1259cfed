"""events/envelope.py: headers made JSON-ready for the store, and the headers a message is
published again with."""

from __future__ import annotations

from datetime import UTC, datetime
from decimal import Decimal
from uuid import uuid4

import pytest

from events.envelope import (
    H_ADDRESS,
    H_ATTEMPT,
    H_CLAIMED,
    H_DEAD_AT,
    H_DEAD_REASON,
    H_EXPIRES_AT,
    H_FIRST_FAILED_AT,
    H_PRIORITY,
    H_REPLAY_GENERATION,
    H_REPLAY_OF,
    H_USER_ID,
    jsonable,
    republished_headers,
    without_pkgq_marks,
)


def test_jsonable_turns_amqp_values_into_plain_json_values() -> None:
    when = datetime(2024, 5, 6, 7, 8, 9, tzinfo=UTC)
    user = uuid4()
    value = {
        "bytes": b"abc",
        "bytearray": bytearray(b"xyz"),
        "bad-utf8": b"a\xffb",
        "when": when,
        "decimal": Decimal("2.5"),
        "uuid": user,
        "tuple": (1, b"2"),
        "nested": {"inner": [when, None, True, 1.5]},
        1: "int key",
    }
    assert jsonable(value) == {
        "bytes": "abc",
        "bytearray": "xyz",
        "bad-utf8": "a\ufffdb",
        "when": "2024-05-06T07:08:09+00:00",
        "decimal": "2.5",
        "uuid": str(user),
        "tuple": [1, "2"],
        "nested": {"inner": ["2024-05-06T07:08:09+00:00", None, True, 1.5]},
        "1": "int key",
    }


@pytest.mark.parametrize("value", [None, True, False, 0, -3, 2.5, "text"])
def test_jsonable_leaves_json_scalars_unchanged(value: object) -> None:
    result = jsonable(value)
    assert result == value
    assert type(result) is type(value)


def test_republished_headers_drop_broker_and_pkgq_dead_marks_and_apply_updates() -> None:
    original = {
        "x-death": [{"count": 1}],
        "x-first-death-exchange": "telecom",
        "x-first-death-queue": "q1",
        "x-first-death-reason": "rejected",
        H_DEAD_REASON: "handler_error",
        H_DEAD_AT: "2024-01-01T00:00:00+00:00",
        "x-pkgq-dead-anything": "x",
        H_USER_ID: "u",
        H_ATTEMPT: 4,
        "x-pkgq-first-failed-at": "2024-01-01T00:00:00+00:00",
    }
    kept = republished_headers(original, {H_ATTEMPT: 5, "x-new": "n"})
    assert kept == {
        H_USER_ID: "u",
        H_ATTEMPT: 5,
        "x-pkgq-first-failed-at": "2024-01-01T00:00:00+00:00",
        "x-new": "n",
    }


def test_republished_headers_leave_the_original_headers_untouched() -> None:
    original = {"x-death": [], H_ATTEMPT: 1}
    republished_headers(original, {H_ATTEMPT: 2})
    assert original == {"x-death": [], H_ATTEMPT: 1}


def test_an_outsiders_pkgq_marks_come_off_and_its_other_headers_stay() -> None:
    forged = {
        H_ADDRESS: "bill:42",
        H_REPLAY_GENERATION: 7,  # would give a message a fresh attempt budget
        H_REPLAY_OF: "1",
        H_FIRST_FAILED_AT: "2020-01-01T00:00:00+00:00",
        H_USER_ID: "u",
        "x-custom": "kept",
    }
    claimed = {k: v for k, v in forged.items() if k.startswith("x-pkgq-")}
    assert without_pkgq_marks(forged) == {H_USER_ID: "u", "x-custom": "kept", H_CLAIMED: claimed}
    assert without_pkgq_marks({H_USER_ID: "u"}) is None  # nothing to take away


def test_every_pkgq_header_an_outsider_sends_is_kept_as_a_claim_and_none_is_obeyed() -> None:
    forged = {H_EXPIRES_AT: "2000-01-01T00:00:00+00:00", H_PRIORITY: 2, "x-pkgq-anything": 1}
    stripped = without_pkgq_marks(forged)
    assert stripped == {H_CLAIMED: forged}
    assert not [k for k in stripped if k != H_CLAIMED and k.startswith("x-pkgq-")]
