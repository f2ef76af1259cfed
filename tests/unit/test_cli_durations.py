"""The command line's one duration parser (`--delay`, `--ttl`, `--older-than`, `--since`, …)
and one size parser: the same units wherever an operator types them."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta, timezone

import pytest
import typer

from consumers.cli.durations import parse_duration, parse_since
from consumers.cli.options import duration, seconds
from consumers.cli.sizes import parse_size


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("90", timedelta(seconds=90)),
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
def test_a_duration_is_seconds_or_a_number_with_a_unit_up_to_weeks(
    text: str, expected: timedelta
) -> None:
    assert parse_duration(text) == expected


def test_delay_and_older_than_read_a_week_the_same_way() -> None:
    # --delay/--ttl/--unique-for go through `seconds`, --older-than through `duration`.
    assert seconds("1w") == 7 * 86400
    assert duration("1w") == timedelta(weeks=1)
    assert seconds(None) is None


@pytest.mark.parametrize("text", ["", "ten", "5x", "-1h", "2 hours", "h", "1h30m", "1y"])
def test_a_duration_that_is_not_one_is_refused_with_examples(text: str) -> None:
    with pytest.raises(ValueError, match="is not a duration"):
        parse_duration(text)


@pytest.mark.parametrize("text", ["soon", "-5m"])
def test_a_bad_duration_option_is_a_usage_error_naming_the_value(text: str) -> None:
    with pytest.raises(typer.BadParameter, match=repr(text).replace("-", r"\-")):
        duration(text)
    with pytest.raises(typer.BadParameter, match="is not a duration"):
        seconds(text)


@pytest.mark.parametrize(
    ("text", "size"),
    [("1048576", 2**20), ("500MiB", 500 * 2**20), ("2GB", 2 * 10**9), ("10 gib", 10 * 2**30)],
)
def test_a_size_is_bytes_or_a_number_with_a_decimal_or_binary_unit(text: str, size: int) -> None:
    assert parse_size(text) == size


@pytest.mark.parametrize("text", ["", "ten", "5 parsecs", "-1GB", "1.5GB"])
def test_a_size_that_is_not_one_is_refused(text: str) -> None:
    with pytest.raises(ValueError, match="not a size"):
        parse_size(text)


def test_since_none_is_none() -> None:
    assert parse_since(None) is None


def test_since_keeps_the_offset_of_an_aware_iso_time() -> None:
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
def test_since_reads_a_naive_iso_time_as_utc(text: str, expected: datetime) -> None:
    moment = parse_since(text)
    assert moment == expected
    assert moment is not None
    assert moment.tzinfo is UTC


def test_since_reads_a_duration_as_that_long_before_now() -> None:
    before = datetime.now(UTC)
    moment = parse_since("1w")
    after = datetime.now(UTC)
    assert moment is not None
    assert before - timedelta(weeks=1) <= moment <= after - timedelta(weeks=1)


def test_since_refuses_text_that_is_neither_a_time_nor_a_duration() -> None:
    with pytest.raises(ValueError, match="is not a duration"):
        parse_since("yesterday")
