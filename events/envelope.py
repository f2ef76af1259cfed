"""The envelope: what travels in AMQP properties and headers around a JSON body.

Properties: `message_id` (uuid, the idempotency key), `type`, `content_type`, `timestamp`.
Headers: schema version, `x-user-id` (the ordering key), `x-seq` (per-user sequence), `x-attempt`,
`traceparent`. This module is broker-agnostic: infra turns it into an aio-pika message.
"""

from __future__ import annotations

import math
import re
from collections.abc import Mapping
from dataclasses import field
from datetime import UTC, datetime
from typing import Any
from uuid import UUID

from domain.records import record

CONTENT_TYPE = "application/json"
H_SCHEMA_VERSION = "x-schema-version"
H_USER_ID = "x-user-id"
H_SEQ = "x-seq"
H_ATTEMPT = "x-attempt"
H_TRACEPARENT = "traceparent"
# For clients that cannot set the AMQP properties (amqp-publish from amqp-tools): read only when
# the property itself is absent (docs/publishing.md).
H_MESSAGE_ID = "x-message-id"
H_MESSAGE_TYPE = "x-message-type"
# Set on messages dead-lettered by pkgq itself.
H_DEAD_REASON = "x-pkgq-dead-reason"
H_DEAD_ERROR = "x-pkgq-dead-error"
H_DEAD_CONSUMER = "x-pkgq-dead-consumer"
H_DEAD_AT = "x-pkgq-dead-at"
H_DEAD_TRACEBACK = "x-pkgq-dead-traceback"
# Set on retries and replays.
H_FIRST_FAILED_AT = "x-pkgq-first-failed-at"
H_LAST_ERROR = "x-pkgq-last-error"
H_REPLAY_OF = "x-pkgq-replay-of"
H_REPLAY_GENERATION = "x-pkgq-replay-generation"
"""How many times the message was replayed: each replay has retries of its own."""
# Job-queue options (docs/explanation/job-queue.md), set by the publishing API (infra/jobs.py).
H_ADDRESS = "x-pkgq-address"
"""Addressed work: at most one queued-or-in-flight message per address; `pkgq wait` on it."""
H_GROUP = "x-pkgq-group"
"""The group the message is a member of (its end message is published when all are done)."""
H_GROUP_END = "x-pkgq-group-end"
"""On a group's end or abort message: `<group id>:completed` or `<group id>:aborted`."""
H_EXPIRES_AT = "x-pkgq-expires-at"
"""TTL: not delivered after this instant (ISO 8601); recorded as expired instead."""
H_PRIORITY = "x-pkgq-priority"
H_PUBLISHER = "x-pkgq-publisher"
"""Who first published the message: the broker-verified AMQP user_id of the delivery pkgq first
took it from (or `unverified`), carried on pkgq's own copies of it (retries, replays, parked
messages, last-resort copies), which the broker shows as published by pkgq. See `publisher_of`."""
# The time a user waits (infra/observability.py: pkgq_critical_seconds and
# pkgq_access_granted_seconds), carried on pkgq's own messages only (PKGQ_PREFIX).
H_SINCE = "x-pkgq-since"
"""On pkgq's own copies of a message (its retries, its parked copy): when the message's critical
time began, ISO 8601: its first publication (or pkgq's first sight of it), so that a retry is
measured from the first publication, not from the retry's."""
H_SINCE_CLOCK = "x-pkgq-since-clock"
"""Which clock H_SINCE was read on: `publisher` (the AMQP timestamp) or `first_sight`."""
H_ORIGIN_TS = "x-pkgq-origin-ts"
"""On pkgq's follow-ups of a purchase (its queuing, then its activation): when the purchase was
published (or first seen), ISO 8601; pkgq_access_granted_seconds runs from it."""
UNVERIFIED = "unverified"
"""The publisher of a message that came without an AMQP user_id: nobody vouched for it."""
JOB_MARKS = (H_ADDRESS, H_GROUP, H_GROUP_END)
PKGQ_MARKS = (
    *JOB_MARKS,
    H_FIRST_FAILED_AT,
    H_LAST_ERROR,
    H_REPLAY_OF,
    H_REPLAY_GENERATION,
    H_PUBLISHER,
)
"""What only pkgq may say about a message on its way through (its jobs, its failure history,
its replays, who first published it): taken off any message another publisher sent, wherever
pkgq reads or stores it."""
"""Headers that tie a message to pkgq's jobs (an address, a group). pkgq believes them only
from its own AMQP user (the broker-validated user_id): an outsider's would let it finish, fail
or join someone else's address or group. See `without_job_marks`."""
BROKER_HEADERS = (
    "x-death",
    "x-first-death-exchange",
    "x-first-death-queue",
    "x-first-death-reason",
)


BYTES = (bytes, bytearray)
"""For isinstance on the per-delivery path (`bytes | bytearray` builds a union at each call)."""
MAX_HEADER_DEPTH = 16
"""Deeper header tables are kept as a marker: nothing pkgq reads is nested, and walking an
outsider's 600-deep table (in repr, json, Postgres) is how a consumer dies."""
MAX_HEADER_TEXT = 4096
"""Longer header strings are cut to this many characters (the length is said)."""
MAX_HEADER_ITEMS = 256
"""Entries kept per header table or array."""


def jsonable(value: Any, depth: int = 0) -> Any:
    """AMQP header values (bytes, datetimes, decimals, nested tables) as plain JSON values,
    bounded in depth, width and text size: total for any value an outsider can send."""
    if isinstance(value, dict):
        if depth >= MAX_HEADER_DEPTH:
            return "(table nested too deep, dropped)"
        items = list(value.items())
        kept = {
            bounded_text(k if isinstance(k, str) else _scalar_text(k), 255): jsonable(v, depth + 1)
            for k, v in items[:MAX_HEADER_ITEMS]
        }
        if len(items) > MAX_HEADER_ITEMS:
            kept["(dropped)"] = f"{len(items) - MAX_HEADER_ITEMS} more entries"
        return kept
    if isinstance(value, list | tuple):
        if depth >= MAX_HEADER_DEPTH:
            return "(array nested too deep, dropped)"
        kept_list = [jsonable(v, depth + 1) for v in value[:MAX_HEADER_ITEMS]]
        if len(value) > MAX_HEADER_ITEMS:
            kept_list.append(f"({len(value) - MAX_HEADER_ITEMS} more entries dropped)")
        return kept_list
    if isinstance(value, bytes | bytearray):
        return bounded_text(bytes(value[: MAX_HEADER_TEXT * 4]).decode("utf-8", "replace"))
    if isinstance(value, datetime):
        return value.isoformat()
    if isinstance(value, bool) or value is None:
        return value
    if isinstance(value, int):
        # Beyond 64 bits it is no AMQP integer, and huge ints do not even print as text.
        return value if -(2**63) <= value < 2**64 else "(integer out of range)"
    if isinstance(value, float):
        return value if math.isfinite(value) else str(value)  # JSON has no NaN or Infinity
    if isinstance(value, str):
        return bounded_text(value)
    return bounded_text(_scalar_text(value))


def _scalar_text(value: Any) -> str:
    """A scalar (a Decimal, a UUID) as text; a container's type only (its str would walk it)."""
    if isinstance(value, tuple | frozenset | set):
        return type(value).__name__
    try:
        return str(value)
    except Exception:  # noqa: BLE001  (a str() that fails is reported, not raised)
        return type(value).__name__


def bounded_text(value: str, limit: int = MAX_HEADER_TEXT) -> str:
    """`value` cleaned for Postgres and cut to `limit` characters, saying how long it was."""
    if len(value) > limit:
        value = f"{value[:limit]}... ({len(value)} characters)"
    return clean_text(value)


def header_text(headers: Mapping[str, Any], name: str, limit: int = MAX_HEADER_TEXT) -> str | None:
    """A header that should be text: None when absent or of another type (a table, a number),
    cut to `limit` characters. Never the repr of an outsider's value."""
    value = headers.get(name)
    if value is None:
        return None
    if isinstance(value, str):  # the usual case first: read for every delivery
        return bounded_text(value, limit)
    if isinstance(value, BYTES):
        return bounded_text(bytes(value[: limit * 4]).decode("utf-8", "replace"), limit)
    return None


def trace_id_of(traceparent: str | None) -> str | None:
    """The trace id in a W3C `traceparent` header (for log lines); None unless well formed."""
    if not traceparent:
        return None
    parts = traceparent.split("-")
    return parts[1] if len(parts) == 4 and len(parts[1]) == 32 else None


def preview(value: Any, limit: int = 80) -> str:
    """A short, safe description of a header value for an error message."""
    if isinstance(value, int) and not -(2**64) < value < 2**64:
        return "an integer out of range"
    if isinstance(value, str | bytes | bytearray | int | float | bool):
        text = value.decode("utf-8", "replace") if isinstance(value, bytes | bytearray) else value
        return repr(bounded_text(str(text)[: limit + 1], limit))
    return f"a {type(value).__name__}"


def clean_text(value: str) -> str:
    """Postgres text and jsonb cannot hold NUL or a lone surrogate: make them visible."""
    if value.isascii() and "\x00" not in value:
        return value  # most header text (ids, traceparents): nothing to clean
    return value.replace("\x00", "\\0").encode("utf-8", "replace").decode("utf-8")


_UNSTORABLE = re.compile("[\x00\ud800-\udfff]")


def unstorable(value: str) -> str | None:
    """What in `value` Postgres text and jsonb cannot store (NUL, or a UTF-16 surrogate, which
    no UTF-8 text can hold), said without repeating it; None when it can all be stored.
    Inbound text is refused with this (events.models); header text is cleaned (`clean_text`)."""
    found = _UNSTORABLE.search(value)
    if found is None:
        return None
    char = found.group()
    what = "NUL" if char == "\x00" else "a lone surrogate"
    return f"U+{ord(char):04X} ({what}) at index {found.start()}, which PostgreSQL cannot store"


PKGQ_PREFIX = "x-pkgq-"
"""Every header under this prefix is pkgq's own (PKGQ_MARKS, expiry, priority, the
dead-letter marks, ...): obeyed only on what pkgq's AMQP user published."""
H_CLAIMED = "x-pkgq-claimed"
"""What another publisher wrote in pkgq's own headers, kept as data under this one table
(`without_pkgq_marks`): shown to people, never obeyed."""


def without_pkgq_marks(headers: Mapping[str, Any]) -> dict[str, Any] | None:
    """`headers` for a message pkgq did not publish itself: every header of pkgq's own (those
    under PKGQ_PREFIX) moved into H_CLAIMED, where nothing obeys it; None when it carries none
    (nothing to move)."""
    for name in headers:  # a loop, not any(generator): run for every outsider's delivery
        if name.startswith(PKGQ_PREFIX):
            break
    else:
        return None
    kept = {k: v for k, v in headers.items() if not k.startswith(PKGQ_PREFIX)}
    kept[H_CLAIMED] = {k: v for k, v in headers.items() if k.startswith(PKGQ_PREFIX)}
    return kept


MAX_PUBLISHER = 255
"""A publisher is kept to this many characters (RabbitMQ user names are shorter)."""


def publisher_of(headers: Mapping[str, Any], user_id: str | None) -> str:
    """Who first published a message delivered with these headers and AMQP `user_id`: the
    H_PUBLISHER header pkgq's own copies carry, else `user_id`, else UNVERIFIED.

    The header is believed as it stands: only on headers an outsider's copy of it was taken off
    (`without_pkgq_marks`, which every reader of the broker's deliveries applies first)."""
    found = header_text(headers, H_PUBLISHER, MAX_PUBLISHER)
    if found:
        return found
    return bounded_text(user_id, MAX_PUBLISHER) if user_id else UNVERIFIED


def job_marks(headers: Mapping[str, Any]) -> tuple[str | None, UUID | None]:
    """The address and group a message's headers name (None where absent or unreadable)."""
    group = header_text(headers, H_GROUP, 64)
    try:
        group_id = UUID(group) if group is not None else None
    except ValueError:
        group_id = None
    return header_text(headers, H_ADDRESS, MAX_ADDRESS), group_id


MAX_ADDRESS = 500
"""Addresses are names an API caller chose; longer ones are cut (and will match nothing)."""


def republished_headers(headers: Mapping[str, Any], updates: Mapping[str, Any]) -> dict[str, Any]:
    """The headers a retry or replay carries: the original ones without the failure marks."""
    kept = {
        k: v
        for k, v in headers.items()
        if k not in BROKER_HEADERS and not k.startswith("x-pkgq-dead-")
    }
    kept.update(updates)
    return kept


@record
class Envelope:
    message_id: UUID
    message_type: str
    schema_version: int
    user_id: UUID | None
    seq: int | None = None
    attempt: int = 1
    timestamp: datetime = field(default_factory=lambda: datetime.now(UTC))
    traceparent: str | None = None
    address: str | None = None
    group_id: UUID | None = None
    expires_at: datetime | None = None
    publisher: str | None = None
    """Who first published it, as the broker verified it (`publisher_of`): set when a delivery
    is decoded, for the item audit and the events it causes; never sent as a header from here
    (pkgq's copies carry H_PUBLISHER as they were given it)."""

    def headers(self) -> dict[str, Any]:
        headers: dict[str, Any] = {
            H_SCHEMA_VERSION: self.schema_version,
            H_ATTEMPT: self.attempt,
        }
        if self.user_id is not None:
            headers[H_USER_ID] = str(self.user_id)
        if self.seq is not None:
            headers[H_SEQ] = self.seq
        if self.traceparent is not None:
            headers[H_TRACEPARENT] = self.traceparent
        if self.address is not None:
            headers[H_ADDRESS] = self.address
        if self.group_id is not None:
            headers[H_GROUP] = str(self.group_id)
        if self.expires_at is not None:
            headers[H_EXPIRES_AT] = self.expires_at.isoformat()
        return headers


def priority_of(headers: Mapping[str, Any]) -> int:
    """A message's priority header (0, 1 or 2; anything else: 0)."""
    value = headers.get(H_PRIORITY, 0)
    return value if isinstance(value, int) and 0 <= value <= 2 else 0


def first_failed_at(headers: Mapping[str, Any]) -> datetime | None:
    """When a message first failed, as its retries carry it (None: unreadable or absent)."""
    return header_time(headers, H_FIRST_FAILED_AT)


def header_time(headers: Mapping[str, Any], name: str) -> datetime | None:
    """A time pkgq wrote as ISO 8601 text in a header of its own (None: unreadable or absent;
    without a zone: UTC)."""
    value = headers.get(name)
    if not isinstance(value, str):
        return None
    try:
        parsed = datetime.fromisoformat(value)
    except ValueError:
        return None
    return parsed if parsed.tzinfo else parsed.replace(tzinfo=UTC)
