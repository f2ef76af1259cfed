"""The one reading of a dead-letter filter, for the console's list (its query string and its
confirmation forms) and for `pkgq dlq list/replay/discard`: a route by its full or short name,
an error text, a group, a user, a time window and a status, as infra/postgres's
dead_letters.Filter.

A value that cannot be read is a FilterError (a ValueError) that names it: the console answers
it with a 422, the command line with a usage error. An empty text is no filter, as absent."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from datetime import UTC, datetime
from uuid import UUID

from events.routes import ROUTES, UnknownRouteError, route_named
from infra.postgres import dead_letters

TimeReader = Callable[[str], datetime | None]


class FilterError(ValueError):
    """A filter value that cannot be read, with what was wrong with it."""


def iso_time(text: str) -> datetime:
    """An ISO-8601 time, UTC when it names no offset (the console's since and until; the CLI
    passes its reader, which also takes a duration ago)."""
    try:
        moment = datetime.fromisoformat(text)
    except ValueError:
        raise ValueError(f"{text!r} is not a date and time") from None
    return moment if moment.tzinfo else moment.replace(tzinfo=UTC)


def route(name: str) -> str:
    """A route's full name, from its full (`telecom.usage_record`) or short (`usage_record`)
    one; an unknown one is refused with the list of the known ones."""
    try:
        return route_named(name).name
    except UnknownRouteError:
        known = ", ".join(r.short_name for r in ROUTES.values())
        raise FilterError(f"unknown route {name!r}; known routes: {known}") from None


def status(text: str | None) -> str | None:
    """A status to match: buried, replayed or discarded; `all` or none: every status."""
    if not text or text == "all":
        return None
    if text not in dead_letters.STATUSES:
        raise FilterError(f"status must be all or one of {', '.join(dead_letters.STATUSES)}")
    return text


def _user(text: str | None) -> UUID | None:
    try:
        return UUID(text) if text else None
    except ValueError:
        raise FilterError(f"user: {text!r} is not a UUID") from None


def _time(text: str | None, field: str, read: TimeReader) -> datetime | None:
    try:
        return read(text) if text else None
    except ValueError as exc:
        raise FilterError(f"{field}: {exc}") from None


def parse(
    *,
    route_name: str | None = None,
    error: str | None = None,
    group: str | None = None,
    user_id: str | None = None,
    since: str | None = None,
    until: str | None = None,
    status_name: str | None = "buried",
    ids: Sequence[int] | None = None,
    limit: int | None = None,
    read_time: TimeReader = iso_time,
) -> dead_letters.Filter:
    """The dead letters these filter values name (by default the buried ones): `error` a text
    in the reason, error type or message; `since` and `until` times read by `read_time`, the
    last failure at or after `since` and before `until`. FilterError for a value that cannot
    be read."""
    return dead_letters.Filter(
        ids=ids or (),
        route=route(route_name) if route_name else None,
        error=error or None,
        group=group or None,
        user_id=_user(user_id),
        since=_time(since, "since", read_time),
        older_than=_time(until, "until", read_time),
        status=status(status_name),
        limit=limit,
    )
