"""The timeline's rows (consumers/timeline_view.py), pure: what links entries of one
transaction, how bodies are shown, and the cursor read back."""

from __future__ import annotations

from datetime import UTC, datetime
from uuid import uuid4

import pytest

from consumers import timeline_view
from infra.postgres import timeline

AT = datetime(2026, 1, 2, 3, 4, 5, 123456, tzinfo=UTC)


def _entry(source: str, kind: str, **fields: object) -> timeline.Entry:
    values: dict[str, object] = {
        "at": AT,
        "source": source,
        "kind": kind,
        "key": "k",
        "message_id": None,
        "route": None,
        "item_id": None,
        "dead_letter_id": None,
        "body": None,
        "detail": {},
    }
    return timeline.Entry(**{**values, **fields})  # type: ignore[arg-type]


def test_an_event_names_the_messages_applied_in_its_transaction_and_nothing_else() -> None:
    applied, event, later = uuid4(), uuid4(), uuid4()
    rows = timeline_view.rows(
        [
            _entry("outbox", "published", message_id=event, detail={"message_type": "E"}),
            _entry("inbox", "received", message_id=applied, detail={"consumer": "c"}),
            _entry("inbox", "received", message_id=later, at=AT.replace(second=9)),
        ]
    )
    assert rows[0]["caused_by"] == [str(applied)]
    assert rows[1]["caused_by"] == []


def test_bodies_and_an_edited_replays_bodies_are_summarized_without_the_user_id() -> None:
    user = str(uuid4())
    body = f'{{"user_id": "{user}", "amount": 2}}'
    [row] = timeline_view.rows(
        [
            _entry(
                "operator",
                "edit_replay",
                body=body.encode(),
                detail={
                    "actor": "web:olga",
                    "original_body": body,
                    "edited_body": {"x": "y" * 999},
                },
            )
        ]
    )
    assert row["body"] == '{"amount": 2}'
    assert row["detail"]["original_body"] == '{"amount": 2}'
    assert len(row["detail"]["edited_body"]) == timeline_view.SUMMARY_MAX
    assert user not in str(row)


def test_a_cursor_reads_back_as_the_position_it_was_made_from() -> None:
    position = timeline.Position(AT, 7, "0000000000000000042:dead.lettered")
    assert timeline.position_of(position.cursor()) == position
    with pytest.raises(ValueError, match="not a timeline cursor"):
        timeline.position_of("x.1.k")
