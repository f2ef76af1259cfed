"""consumers/dlq_cli.py: the durations and times `pkgq dlq` reads as an operator writes them."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta, timezone

import pytest
import typer

from consumers.dlq_cli import parse_duration, parse_since


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("90s", timedelta(seconds=90)),
        ("15m", timedelta(minutes=15)),
        ("2h", timedelta(hours=2)),
        ("7d", timedelta(days=7)),
        ("1w", timedelta(weeks=1)),
        ("1.5h", timedelta(minutes=90)),
        (" 30 m ", timedelta(minutes=30)),
        ("0s", timedelta(0)),
    ],
)
def test_parse_duration_reads_seconds_minutes_hours_days_and_weeks(
    text: str, expected: timedelta
) -> None:
    assert parse_duration(text) == expected


@pytest.mark.parametrize("text", ["", "ten", "90", "5x", "-1h", "2 hours", "h", "1h30m"])
def test_parse_duration_refuses_garbage_with_a_bad_parameter_error(text: str) -> None:
    with pytest.raises(typer.BadParameter, match="is not a duration"):
        parse_duration(text)


def test_parse_since_none_is_none() -> None:
    assert parse_since(None) is None


def test_parse_since_keeps_the_offset_of_an_aware_iso_time() -> None:
    moment = parse_since("2024-05-01T12:00:00+02:00")
    assert moment == datetime(2024, 5, 1, 12, tzinfo=timezone(timedelta(hours=2)))
    assert moment is not None
    assert moment.utcoffset() == timedelta(hours=2)


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("2024-05-01T12:00:00", datetime(2024, 5, 1, 12, tzinfo=UTC)),
        ("2024-05-01", datetime(2024, 5, 1, tzinfo=UTC)),
    ],
)
def test_parse_since_reads_a_naive_iso_time_as_utc(text: str, expected: datetime) -> None:
    moment = parse_since(text)
    assert moment == expected
    assert moment is not None
    assert moment.tzinfo is UTC


def test_parse_since_reads_a_duration_as_that_long_before_now() -> None:
    before = datetime.now(UTC)
    moment = parse_since("2h")
    after = datetime.now(UTC)
    assert moment is not None
    assert moment.tzinfo is not None
    assert before - timedelta(hours=2) <= moment <= after - timedelta(hours=2)


def test_parse_since_refuses_text_that_is_neither_a_time_nor_a_duration() -> None:
    with pytest.raises(typer.BadParameter):
        parse_since("yesterday")
