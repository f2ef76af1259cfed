"""infra/postgres/dead_letters.py: one row per dead message (the dedup key), and the filters
`pkgq dlq` lists by."""

from __future__ import annotations

import hashlib
import re
from datetime import UTC, datetime
from typing import Any
from uuid import UUID, uuid4

import pytest

from events.envelope import (
    CONTENT_TYPE,
)
from events.identity import message_key
from events.routes import PACKAGE_ACTIVATE
from infra.postgres.dead_letters import Filter, NewDeadLetter

ACTIVATE = PACKAGE_ACTIVATE.name  # "telecom.package_activate"


def dead_letter(**overrides: Any) -> NewDeadLetter:
    values: dict[str, Any] = {
        "source": "consumer",
        "route": ACTIVATE,
        "consumer": "package_activate",
        "message_id": "7b0c6d3e-2f55-4a51-9a3b-0e6a2c1d4f00",
        "user_id": None,
        "message_type": "PackageActivateEvent",
        "content_type": CONTENT_TYPE,
        "body": b'{"a": 1}',
        "headers": {"x-seq": 3, "x-attempt": 2},
        "reason": "max_attempts",
        "error_type": "ValueError",
        "error_message": "boom",
    }
    values.update(overrides)
    return NewDeadLetter(**values)


HASH_KEY = re.compile(r"^(consumer|broker):[\w.]+:[0-9a-f]{64}$")


def test_dedup_key_of_a_consumer_failure_is_its_consumer_key_and_bytes() -> None:
    """The same message (key: message_id, publisher, user) with the same bytes is one letter;
    another publisher's copy, another user's, or other bytes under the id is a letter of its
    own."""
    dead = dead_letter()
    key = message_key(UUID(str(dead.message_id)), dead.publisher, dead.user_id)
    digest = hashlib.sha256(dead.body).hexdigest()[:32]
    assert dead.dedup_key() == f"package_activate:{key}:{digest}"
    assert dead_letter().dedup_key() == dead.dedup_key()
    assert dead_letter(publisher="mallory").dedup_key() != dead.dedup_key()
    assert dead_letter(user_id=uuid4()).dedup_key() != dead.dedup_key()
    assert dead_letter(body=b"other").dedup_key() != dead.dedup_key()


@pytest.mark.parametrize("message_id", [None, ""])
def test_dedup_key_of_a_consumer_failure_without_message_id_is_a_sha256_of_headers_and_body(
    message_id: str | None,
) -> None:
    dead = dead_letter(message_id=message_id)
    digest = hashlib.sha256(b'{"x-attempt": 2, "x-seq": 3}\0{"a": 1}').hexdigest()
    assert dead.dedup_key() == f"consumer:package_activate:{digest}"


def test_dedup_key_of_a_broker_dead_letter_is_hashed_even_with_a_message_id() -> None:
    key = dead_letter(source="broker").dedup_key()
    assert HASH_KEY.match(key)
    assert key.startswith("broker:package_activate:")
    assert "7b0c6d3e" not in key


def test_dedup_key_hash_is_the_same_for_the_same_body_and_headers_in_any_key_order() -> None:
    one = dead_letter(source="broker", headers={"a": 1, "b": [1, 2]})
    two = dead_letter(source="broker", headers={"b": [1, 2], "a": 1}, reason="other")
    assert one.dedup_key() == two.dedup_key()


def test_dedup_key_hash_differs_when_the_body_differs() -> None:
    one = dead_letter(source="broker", body=b"one")
    two = dead_letter(source="broker", body=b"two")
    assert one.dedup_key() != two.dedup_key()


def test_dedup_key_hash_differs_when_the_headers_differ() -> None:
    one = dead_letter(source="broker", headers={"x-death": [{"count": 1}]})
    two = dead_letter(source="broker", headers={"x-death": [{"count": 2}]})
    assert one.dedup_key() != two.dedup_key()


def _death(count: int, time: str) -> list[dict[str, Any]]:
    return [{"reason": "expired", "queue": "q", "count": count, "time": time}]


def test_dedup_key_of_a_broker_dead_letter_ignores_the_death_time_and_redelivery_count() -> None:
    # A quorum queue's at-least-once dead-lettering sends the same death again, stamped anew,
    # when a node dies before the target confirms; the dead-letter queue counts redeliveries.
    first = dead_letter(source="broker", headers={"x-death": _death(1, "2026-11-27T10:00:01")})
    again = dead_letter(
        source="broker",
        headers={"x-death": _death(1, "2026-11-27T10:00:19"), "x-delivery-count": 1},
    )
    assert first.dedup_key() == again.dedup_key()


def test_dedup_key_of_a_broker_dead_letter_tells_a_second_death_by_its_count() -> None:
    first = dead_letter(source="broker", headers={"x-death": _death(1, "2026-11-27T10:00:01")})
    second = dead_letter(source="broker", headers={"x-death": _death(2, "2026-11-27T10:00:01")})
    assert first.dedup_key() != second.dedup_key()


def test_dedup_key_of_a_broker_dead_letter_tells_two_messages_apart_by_id_and_publisher() -> None:
    # Two identical commands (same body and headers) expiring from one queue are two letters.
    headers = {"x-death": _death(1, "2026-11-27T10:00:01")}
    one = dead_letter(source="broker", headers=headers, message_id="a", publisher="pkgq")
    other_id = dead_letter(source="broker", headers=headers, message_id="b", publisher="pkgq")
    other_by = dead_letter(source="broker", headers=headers, message_id="a", publisher="billing")
    assert len({one.dedup_key(), other_id.dedup_key(), other_by.dedup_key()}) == 3


def test_dedup_key_of_a_consumer_failure_keeps_every_header_in_its_hash() -> None:
    one = dead_letter(message_id=None, headers={"x-delivery-count": 1})
    two = dead_letter(message_id=None, headers={"x-delivery-count": 2})
    assert one.dedup_key() != two.dedup_key()


def test_dedup_key_hash_differs_between_broker_and_consumer_sources() -> None:
    broker = dead_letter(source="broker", message_id=None)
    consumer = dead_letter(source="consumer", message_id=None)
    assert broker.dedup_key() != consumer.dedup_key()


# --- infra/postgres/dead_letters.py: Filter.where ---------------------------------------------


def _like_matches(text: str, pattern: str) -> bool:
    """Postgres ILIKE with its default escape character (backslash)."""
    regex = ""
    chars = iter(pattern)
    for char in chars:
        if char == "\\":
            regex += re.escape(next(chars, ""))
        elif char == "%":
            regex += ".*"
        elif char == "_":
            regex += "."
        else:
            regex += re.escape(char)
    return re.fullmatch(regex, text, re.IGNORECASE | re.DOTALL) is not None


def test_an_empty_filter_matches_everything_with_no_arguments() -> None:
    assert Filter().where() == ("true", [])


def test_filter_by_route_error_and_status_numbers_its_placeholders_in_order() -> None:
    sql, args = Filter(route=ACTIVATE, error="boom", status="buried").where()
    assert sql == (
        "d.route = $1"
        " AND (d.reason || ' ' || d.error_type || ' ' || d.error_message) ILIKE $2"
        " AND d.status = $3::telecom.dead_letter_status"
    )
    assert args == [ACTIVATE, "%boom%", "buried"]


def test_filter_with_every_field_numbers_placeholders_1_to_7_matching_the_arguments() -> None:
    since = datetime(2024, 1, 1, tzinfo=UTC)
    older = datetime(2024, 2, 1, tzinfo=UTC)
    sql, args = Filter(
        ids=(3, 4),
        route=ACTIVATE,
        error="Err",
        group="g1",
        since=since,
        older_than=older,
        status="replayed",
        limit=10,
    ).where()
    assert re.findall(r"\$(\d+)", sql) == ["1", "2", "3", "4", "5", "6", "7"]
    assert args == [[3, 4], ACTIVATE, "%Err%", "g1", since, older, "replayed"]
    assert "d.id = ANY($1::bigint[])" in sql
    assert "d.group_key = $4" in sql
    assert "d.last_failed_at >= $5" in sql
    assert "d.last_failed_at < $6" in sql
    assert "LIMIT" not in sql


def test_filter_placeholders_follow_only_the_fields_that_are_set() -> None:
    sql, args = Filter(group="g1", status="buried").where()
    assert sql == "d.group_key = $1 AND d.status = $2::telecom.dead_letter_status"
    assert args == ["g1", "buried"]


def test_filter_error_pattern_matches_the_text_anywhere_ignoring_case() -> None:
    _, args = Filter(error="Quota").where()
    assert _like_matches("max_attempts ValueError the quota went negative", args[0])
    assert not _like_matches("max_attempts ValueError boom", args[0])


def test_filter_error_is_a_literal_substring_so_underscore_and_percent_are_not_wildcards() -> None:
    sql, args = Filter(error="not_found").where()
    assert "ILIKE" in sql
    assert _like_matches("handler_error KeyError not_found", args[0])
    assert not _like_matches("handler_error KeyError notXfound", args[0])
    _, args = Filter(error="100%").where()
    assert not _like_matches("100 users", args[0])
