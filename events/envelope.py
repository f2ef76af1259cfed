"""The envelope: what travels in AMQP properties and headers around a JSON body.

Properties: `message_id` (uuid, the idempotency key), `type`, `content_type`, `timestamp`.
Headers: schema version, `x-user-id` (the ordering key), `x-seq` (per-user sequence), `x-attempt`,
`traceparent`. This module is broker-agnostic: infra turns it into an aio-pika message.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any
from uuid import UUID

CONTENT_TYPE = "application/json"
H_SCHEMA_VERSION = "x-schema-version"
H_USER_ID = "x-user-id"
H_SEQ = "x-seq"
H_ATTEMPT = "x-attempt"
H_TRACEPARENT = "traceparent"
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
# Job-queue options (seeds 001-004), set by the publishing API (infra/jobs.py).
H_ADDRESS = "x-pkgq-address"
"""Addressed work: at most one queued-or-in-flight message per address; `pkgq wait` on it."""
H_GROUP = "x-pkgq-group"
"""The group the message is a member of (its end message is published when all are done)."""
H_GROUP_END = "x-pkgq-group-end"
"""On a group's end or abort message: `<group id>:completed` or `<group id>:aborted`."""
H_EXPIRES_AT = "x-pkgq-expires-at"
"""TTL: not delivered after this instant (ISO 8601); recorded as expired instead."""
H_PRIORITY = "x-pkgq-priority"
BROKER_HEADERS = (
    "x-death",
    "x-first-death-exchange",
    "x-first-death-queue",
    "x-first-death-reason",
)


def jsonable(value: Any) -> Any:
    """AMQP header values (bytes, datetimes, decimals, nested tables) as plain JSON values."""
    if isinstance(value, dict):
        return {clean_text(str(k)): jsonable(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [jsonable(v) for v in value]
    if isinstance(value, bytes | bytearray):
        return clean_text(bytes(value).decode("utf-8", "replace"))
    if isinstance(value, datetime):
        return value.isoformat()
    if isinstance(value, float) and not math.isfinite(value):
        return str(value)  # JSON (and Postgres jsonb) has no NaN or Infinity
    if isinstance(value, str):
        return clean_text(value)
    if value is None or isinstance(value, bool | int | float):
        return value
    return clean_text(str(value))


def clean_text(value: str) -> str:
    """Postgres text and jsonb cannot hold NUL or a lone surrogate: make them visible."""
    return value.replace("\x00", "\\0").encode("utf-8", "replace").decode("utf-8")


def job_marks(headers: Mapping[str, Any]) -> tuple[str | None, UUID | None]:
    """The address and group a message's headers name (None where absent or unreadable)."""

    def text(name: str) -> str | None:
        value = headers.get(name)
        if isinstance(value, bytes | bytearray):
            value = bytes(value).decode("utf-8", "replace")
        return None if value is None else str(value)

    group = text(H_GROUP)
    try:
        group_id = UUID(group) if group is not None else None
    except ValueError:
        group_id = None
    return text(H_ADDRESS), group_id


def republished_headers(headers: Mapping[str, Any], updates: Mapping[str, Any]) -> dict[str, Any]:
    """The headers a retry or replay carries: the original ones without the failure marks."""
    kept = {
        k: v
        for k, v in headers.items()
        if k not in BROKER_HEADERS and not k.startswith("x-pkgq-dead-")
    }
    kept.update(updates)
    return kept


@dataclass(frozen=True, slots=True)
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
