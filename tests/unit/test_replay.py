"""infra/postgres/replay.py: the outbox message a dead letter is replayed as, or why it is not."""

from __future__ import annotations

import json
from typing import Any
from uuid import UUID

import pytest

from events.envelope import (
    H_ATTEMPT,
    H_DEAD_ERROR,
    H_DEAD_REASON,
    H_DEAD_TRACEBACK,
    H_PUBLISHER,
    H_REPLAY_GENERATION,
    H_REPLAY_OF,
    H_SCHEMA_VERSION,
    H_SEQ,
    H_USER_ID,
)
from events.routes import PACKAGE_ACTIVATE, USAGE_RECORD
from infra.postgres.outbox import OutboxMessage
from infra.postgres.replay import replay_message

ACTIVATE = PACKAGE_ACTIVATE.name  # "telecom.package_activate"


PKGQ = "pkgq-runtime"
"""pkgq's AMQP user (Settings.amqp_user) in these tests."""
MESSAGE_ID = "5f2d9c1e-8a4b-4c3d-9e2f-1a2b3c4d5e6f"
USER = UUID("0d1e2f3a-4b5c-4d6e-8f70-8192a3b4c5d6")


def replay_row(**overrides: Any) -> dict[str, Any]:
    headers = {
        H_SCHEMA_VERSION: 1,
        H_USER_ID: str(USER),
        H_SEQ: 7,
        H_ATTEMPT: 25,
        "traceparent": "00-abc-def-01",
        "x-death": [{"reason": "rejected", "queue": "q1", "count": 1}],
        "x-first-death-reason": "rejected",
        "x-first-death-queue": "q1",
        "x-first-death-exchange": "telecom",
        H_DEAD_REASON: "handler_error",
        H_DEAD_ERROR: "ValueError: boom",
        H_DEAD_TRACEBACK: "Traceback ...",
    }
    row: dict[str, Any] = {
        "id": 42,
        "route": ACTIVATE,
        "message_id": MESSAGE_ID,
        "user_id": USER,
        "message_type": "PackageActivateEvent",
        "body": b'{"user_id": "x"}',
        "headers": json.dumps(headers),
        "replay_count": 3,
        "publisher": PKGQ,
    }
    row.update(overrides)
    return row


def replayed(row: dict[str, Any]) -> OutboxMessage:
    message = replay_message(row, pkgq_user=PKGQ)
    assert isinstance(message, OutboxMessage), message
    return message


def refusal(row: dict[str, Any]) -> str:
    result = replay_message(row, pkgq_user=PKGQ)
    assert isinstance(result, str), result
    return result


def test_replay_refuses_a_dead_letter_on_an_unknown_route() -> None:
    result = replay_message(replay_row(route="shop.order"), pkgq_user=PKGQ)
    assert isinstance(result, str)
    assert "'shop.order'" in result
    assert "not a pkgq route" in result


@pytest.mark.parametrize("message_id", ["not-a-uuid", None, ""])
def test_replay_refuses_a_dead_letter_whose_message_id_is_not_a_uuid(
    message_id: str | None,
) -> None:
    result = replay_message(replay_row(message_id=message_id), pkgq_user=PKGQ)
    assert isinstance(result, str)
    assert "is not a UUID" in result
    assert repr(message_id) in result


def test_replay_sends_the_same_message_to_the_same_route() -> None:
    message = replayed(replay_row())
    assert message.route == ACTIVATE
    assert message.message_id == UUID(MESSAGE_ID)
    assert message.message_type == "PackageActivateEvent"
    assert message.schema_version == 1
    assert message.body == b'{"user_id": "x"}'
    assert message.user_id == USER
    assert message.seq == 7
    assert message.available_at is None


def test_replay_drops_the_failure_marks_and_restarts_the_attempt_count() -> None:
    headers = replayed(replay_row()).headers
    for gone in (
        "x-death",
        "x-first-death-reason",
        "x-first-death-queue",
        "x-first-death-exchange",
        H_DEAD_REASON,
        H_DEAD_ERROR,
        H_DEAD_TRACEBACK,
    ):
        assert gone not in headers
    assert headers[H_ATTEMPT] == 1
    assert headers[H_REPLAY_OF] == 42
    assert headers["traceparent"] == "00-abc-def-01"
    assert headers[H_USER_ID] == str(USER)
    assert headers[H_SEQ] == 7


def test_replay_dedup_key_is_replay_id_and_replay_count() -> None:
    assert replayed(replay_row()).dedup_key == "replay:42:3"
    assert replayed(replay_row(replay_count=0)).dedup_key == "replay:42:0"


def test_replay_accepts_headers_already_decoded_into_a_dict() -> None:
    headers = {H_SCHEMA_VERSION: 1, H_SEQ: "12", "x-death": []}
    message = replayed(replay_row(headers=headers))
    assert message.seq == 12
    assert "x-death" not in message.headers
    assert message.headers[H_ATTEMPT] == 1


def test_replay_without_headers_uses_the_route_schema_version_and_no_seq() -> None:
    message = replayed(replay_row(headers=None, message_type=None, body=memoryview(b"{}")))
    assert message.schema_version == PACKAGE_ACTIVATE.schema_version
    assert message.message_type == PACKAGE_ACTIVATE.message_type
    assert message.seq is None
    assert message.body == b"{}"
    assert message.headers == {
        H_ATTEMPT: 1,
        H_REPLAY_OF: 42,
        H_REPLAY_GENERATION: 4,
        H_PUBLISHER: PKGQ,
    }


@pytest.mark.parametrize("seq", ["abc", -1, 1.5, True])
def test_replay_drops_a_seq_header_that_is_not_a_natural_number(seq: object) -> None:
    assert replayed(replay_row(headers={H_SEQ: seq})).seq is None


def test_replay_refuses_rather_than_crashes_on_a_non_numeric_schema_version_header() -> None:
    result = replay_message(replay_row(headers={H_SCHEMA_VERSION: "v1"}), pkgq_user=PKGQ)
    assert isinstance(result, str)


@pytest.mark.parametrize("version", [10**12, "9" * 4000, -1, {"v": 1}])
def test_replay_refuses_a_schema_version_no_column_can_hold(version: object) -> None:
    result = replay_message(replay_row(headers={H_SCHEMA_VERSION: version}), pkgq_user=PKGQ)
    assert isinstance(result, str)
    assert len(result) < 200


def test_replay_drops_a_seq_beyond_what_a_bigint_holds() -> None:
    assert replayed(replay_row(headers={H_SEQ: "9" * 4000})).seq is None


def test_replay_refuses_what_an_outsider_published_on_a_route_only_pkgq_publishes() -> None:
    assert refusal(replay_row(publisher="mallory")) == (
        "published by 'mallory', not pkgq: telecom.package_activate is published by pkgq only; "
        "it is never replayed"
    )


@pytest.mark.parametrize("publisher", [None, "unverified"])
def test_replay_refuses_what_nobody_vouched_for_on_a_route_only_pkgq_publishes(
    publisher: str | None,
) -> None:
    """A delivery without a user_id (`unverified`) and a dead letter filed before publishers
    were kept (NULL) are no more pkgq's than an outsider's."""
    result = refusal(replay_row(publisher=publisher))
    assert "not pkgq: telecom.package_activate is published by pkgq only" in result
    assert ("'unverified'" if publisher else "an unknown publisher") in result


def test_replay_of_pkgqs_own_event_carries_pkgq_as_its_publisher() -> None:
    assert replayed(replay_row()).headers[H_PUBLISHER] == PKGQ


@pytest.mark.parametrize(
    ("publisher", "carried"), [("shop", "shop"), (None, "unverified"), (PKGQ, PKGQ)]
)
def test_replay_of_a_command_carries_whoever_published_it_first(
    publisher: str | None, carried: str
) -> None:
    """Anyone may publish a command: its replay is sent, naming its first publisher (the
    consumer audits that one, not pkgq, which only sent it again); a stale header is replaced."""
    row = replay_row(
        route=USAGE_RECORD.name,
        publisher=publisher,
        headers={H_SCHEMA_VERSION: 1, H_PUBLISHER: "forged"},
    )
    assert replayed(row).headers[H_PUBLISHER] == carried
