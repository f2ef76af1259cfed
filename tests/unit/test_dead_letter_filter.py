"""The one reading of a dead-letter filter (consumers/dead_letter_filter.py) that the console's
list and `pkgq dlq list/replay/discard` share: what each value becomes, and what is refused
with which message."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta, timezone
from uuid import uuid4

import pytest

from consumers.cli.durations import parse_since
from consumers.dead_letter_filter import FilterError, iso_time, parse
from events.routes import ROUTES, USAGE_RECORD
from infra.postgres import dead_letters


def test_every_value_is_read_into_the_stores_filter() -> None:
    user = uuid4()
    which = parse(
        route_name="usage_record",
        error="schema",
        group="g1",
        user_id=str(user),
        since="2026-01-02T03:04:05",
        until="2026-01-03T00:00:00+02:00",
        status_name="replayed",
        ids=[3, 4],
        limit=10,
    )
    assert which == dead_letters.Filter(
        ids=[3, 4],
        route=USAGE_RECORD.name,
        error="schema",
        group="g1",
        user_id=user,
        since=datetime(2026, 1, 2, 3, 4, 5, tzinfo=UTC),
        older_than=datetime(2026, 1, 3, tzinfo=timezone(timedelta(hours=2))),
        status="replayed",
        limit=10,
    )


def test_nothing_given_or_empty_texts_name_every_buried_dead_letter() -> None:
    empty = parse(route_name="", error="", group="", user_id="", since="", until="")
    assert parse() == empty == dead_letters.Filter(status="buried")


@pytest.mark.parametrize("name", [USAGE_RECORD.name, USAGE_RECORD.short_name])
def test_a_route_is_taken_by_its_full_or_its_short_name(name: str) -> None:
    assert parse(route_name=name).route == USAGE_RECORD.name


def test_an_unknown_route_is_refused_with_the_list_of_the_known_ones() -> None:
    with pytest.raises(FilterError, match="unknown route 'nope'; known routes: ") as refused:
        parse(route_name="nope")
    for route in ROUTES.values():
        assert route.short_name in str(refused.value)


@pytest.mark.parametrize(("given", "status"), [("all", None), (None, None), ("buried", "buried")])
def test_all_or_no_status_matches_every_status(given: str | None, status: str | None) -> None:
    assert parse(status_name=given).status == status


def test_an_unknown_status_is_refused_naming_the_ones_there_are() -> None:
    with pytest.raises(FilterError, match="status must be all or one of buried, replayed"):
        parse(status_name="lost")


def test_a_user_that_is_not_a_uuid_is_refused() -> None:
    with pytest.raises(FilterError, match="user: 'nope' is not a UUID"):
        parse(user_id="nope")


def test_a_time_that_is_not_iso_is_refused_naming_its_field() -> None:
    with pytest.raises(FilterError, match="since: '2h' is not a date and time"):
        parse(since="2h")
    with pytest.raises(FilterError, match="until: 'soon' is not a date and time"):
        parse(until="soon")


def test_with_the_command_lines_reader_a_time_may_be_a_duration_ago() -> None:
    before = datetime.now(UTC)
    since = parse(since="2h", read_time=parse_since).since
    assert since is not None
    assert before - timedelta(hours=2, seconds=5) < since <= datetime.now(UTC) - timedelta(hours=2)


def test_with_the_command_lines_reader_a_bad_duration_is_refused_naming_its_field() -> None:
    with pytest.raises(FilterError, match="since: '1y' is not a duration"):
        parse(since="1y", read_time=parse_since)


def test_an_iso_time_without_an_offset_is_utc() -> None:
    assert iso_time("2026-05-01T12:00:00") == datetime(2026, 5, 1, 12, tzinfo=UTC)
    with pytest.raises(ValueError, match="'yesterday' is not a date and time"):
        iso_time("yesterday")
