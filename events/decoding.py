"""Turn raw AMQP deliveries into (envelope, validated body), or say exactly why not."""

from __future__ import annotations

import json
import re
from collections.abc import Mapping
from datetime import UTC, datetime
from typing import Any
from uuid import UUID

from pydantic import ValidationError

from domain.records import record
from events.bounded_json import TooDeepError, check_depth, loads
from events.envelope import (
    BYTES,
    CONTENT_TYPE,
    H_ADDRESS,
    H_ATTEMPT,
    H_EXPIRES_AT,
    H_GROUP,
    H_SCHEMA_VERSION,
    H_SEQ,
    H_TRACEPARENT,
    H_USER_ID,
    MAX_ADDRESS,
    Envelope,
    clean_text,
    header_text,
    jsonable,
    preview,
    publisher_of,
    unstorable,
)
from events.identity import message_key
from events.models import WireModel
from events.routes import Route


class BadMessageError(Exception):
    """A message that can never be processed as sent. `reason` is a stable snake_case code."""

    def __init__(self, reason: str, detail: str) -> None:
        super().__init__(f"{reason}: {detail}")
        self.reason = reason
        self.detail = detail


class NewerVersionError(BadMessageError):
    """A message of the schema version after the route's current one: not bad input, but left
    for the next release of pkgq (a rolling upgrade is under way, or about to be). Any version
    further ahead is buried as unsupported_version: no rollout overlaps more than two releases.
    Its consumer holds it as its user's blocker and retries it after a pause, uncounted
    (domain/delivery.py, ErrorKind.NEWER), so whichever pod knows the version applies it, in
    its user's order. `user_id`: the body's
    `user_id` if it reads as one (a version's other fields are unknown), else None."""

    def __init__(self, version: int, accepted: tuple[int, ...], decoded: Decoded) -> None:
        super().__init__(
            "newer_version",
            f"{H_SCHEMA_VERSION}={version} is newer than this pkgq knows "
            f"(it applies {' and '.join(map(str, accepted))}): left for a newer pkgq",
        )
        self.version = version
        self.decoded = decoded

    @property
    def user_id(self) -> UUID | None:
        return self.decoded.envelope.user_id


@record
class RawDelivery:
    body: bytes
    message_id: str | None
    message_type: str | None
    content_type: str | None
    timestamp: datetime | None
    headers: Mapping[str, Any]
    routing_key: str | None = None
    publisher: str | None = None
    """The AMQP user_id property: the broker refuses a publish whose user_id is not the
    publishing connection's user, so when present it names who published the message."""
    exchange: str | None = None
    """The exchange it was published to (on a message the alternate exchange caught, the one
    that could not route it)."""

    def with_headers(self, headers: Mapping[str, Any]) -> RawDelivery:
        """The same delivery with other headers (dataclasses.replace is slower, and this
        runs for every delivery the trust gate stamps)."""
        return RawDelivery(
            self.body,
            self.message_id,
            self.message_type,
            self.content_type,
            self.timestamp,
            headers,
            self.routing_key,
            self.publisher,
            self.exchange,
        )


@record
class Decoded:
    envelope: Envelope
    body: WireModel
    key: UUID
    """The message's identity as a key (events/identity.py): its message_id, first publisher
    and the body's user. What pkgq's bookkeeping matches it on, never the message_id alone."""
    newer: bool = False
    """A version newer than this pkgq knows (NewerVersionError): `body` is a placeholder that
    names its user only; nothing reads it, the message is held and retried as it came."""


INT_OR_STR = (int, str)
"""For isinstance on the per-delivery path (a tuple: `int | str` builds a union at each call)."""


def _int_header(headers: Mapping[str, Any], name: str, default: int | None) -> int | None:
    value = headers.get(name)
    if value is None:
        return default
    if isinstance(value, BYTES):
        value = bytes(value[:40]).decode("ascii", "replace")
    readable = not isinstance(value, bool) and isinstance(value, INT_OR_STR)
    try:
        if readable and len(str(value)) <= 30:
            return int(value)
    except ValueError:
        pass
    raise BadMessageError("invalid_header", f"header {name}={preview(value)} is not an integer")


MAX_SEQ = 2**53
"""A sequence number beyond this is no counter anyone keeps (nor exact in JSON): ignored."""


def _bounded_header(headers: Mapping[str, Any], name: str, low: int, high: int) -> int | None:
    """An integer header pkgq only informs itself with: None unless an int in [low, high).
    Outsiders set these (x-seq, x-attempt), so a bad one is ignored, never fatal, never
    trusted: the attempt that counts is the one in Postgres."""
    value = headers.get(name)
    if isinstance(value, bool) or not isinstance(value, int):
        return None
    return value if low <= value < high else None


def message_uuid(message_id: str | None) -> UUID | None:
    """A message_id as the UUID pkgq knows the message by (None: not a UUID). The one reading:
    decoding, a hold's blocker and a dead letter's `message_uuid` all agree on it."""
    if message_id is None:
        return None
    try:
        return UUID(message_id)
    except ValueError:
        return None


def decode(route: Route, raw: RawDelivery, *, max_body_bytes: int) -> Decoded:
    """Validate a delivery for `route`: size, identity, type, version, encoding, schema."""
    if len(raw.body) > max_body_bytes:
        raise BadMessageError(
            "oversized", f"body is {len(raw.body)} bytes, the limit is {max_body_bytes}"
        )
    if not raw.message_id:
        raise BadMessageError("missing_message_id", "the AMQP message_id property is required")
    message_id = message_uuid(raw.message_id)
    if message_id is None:
        raise BadMessageError("invalid_message_id", f"message_id {raw.message_id!r} is not a UUID")
    if raw.content_type != CONTENT_TYPE:
        raise BadMessageError(
            "wrong_content_type", f"content_type is {raw.content_type!r}, expected {CONTENT_TYPE}"
        )
    if raw.message_type != route.message_type:
        raise BadMessageError(
            "unknown_type",
            f"type {raw.message_type!r} is not accepted on {route.name}; "
            f"expected {route.message_type!r}",
        )
    version = _int_header(raw.headers, H_SCHEMA_VERSION, None)
    if version != route.schema_version and (
        route.previous is None or version != route.previous.version
    ):
        # Only the next version: a rolling update overlaps two releases, so anything further
        # ahead (a typo, a hostile header) is bad input, buried at once and holding nobody.
        if version == route.schema_version + 1:
            user = _newer_user(raw)
            # Never read (Decoded.newer): the user it names is the envelope's, or the nil UUID.
            placeholder = WireModel.model_construct(user_id=user or UUID(int=0))
            envelope = _envelope(route, raw, message_id, version, user)
            decoded = Decoded(envelope, placeholder, _key(envelope), True)
            raise NewerVersionError(version, route.accepted_versions, decoded)
        accepted = " and ".join(map(str, route.accepted_versions))
        raise BadMessageError(
            "unsupported_version",
            f"{H_SCHEMA_VERSION}={version!r}; {route.name} accepts {accepted} "
            f"(and holds {route.schema_version + 1} for a newer pkgq)",
        )
    try:
        text = raw.body.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise BadMessageError("invalid_utf8", f"body is not UTF-8 ({exc.reason})") from None
    try:
        check_depth(raw.body)  # before any parser recurses into it
    except TooDeepError as exc:
        raise BadMessageError("invalid_json", str(exc)) from None
    try:
        if version == route.schema_version:
            body = route.model.model_validate_json(text)
        else:
            body = _upcast(route, text)
    except ValidationError as exc:
        if exc.errors()[0]["type"] != "json_invalid":
            raise BadMessageError("schema_invalid", _summarise(exc)) from None
        unstorable_string = _lone_surrogate(text)
        if unstorable_string is not None:
            raise BadMessageError("schema_invalid", unstorable_string) from None
        raise BadMessageError("invalid_json", _summarise(exc)) from None
    _check_user_header(raw, body.user_id)
    envelope = _envelope(route, raw, message_id, version, body.user_id)
    return Decoded(envelope, body, _key(envelope))


def _key(envelope: Envelope) -> UUID:
    return message_key(envelope.message_id, envelope.publisher, envelope.user_id)


def _envelope(
    route: Route, raw: RawDelivery, message_id: UUID, version: int, user_id: UUID | None
) -> Envelope:
    return Envelope(
        message_id=message_id,
        message_type=route.message_type,
        schema_version=version,
        user_id=user_id,
        seq=_bounded_header(raw.headers, H_SEQ, 0, MAX_SEQ),
        attempt=_bounded_header(raw.headers, H_ATTEMPT, 1, 2**31) or 1,
        timestamp=raw.timestamp or datetime.now(UTC),
        traceparent=header_text(raw.headers, H_TRACEPARENT, 256),
        address=header_text(raw.headers, H_ADDRESS, MAX_ADDRESS),
        group_id=_uuid_header(raw.headers, H_GROUP),
        expires_at=_time_header(raw.headers, H_EXPIRES_AT),
        publisher=publisher_of(raw.headers, raw.publisher),
    )


def _upcast(route: Route, text: str) -> WireModel:
    """A body of the route's previous version: validated as it was then, then turned into the
    current model (raises ValidationError; `previous` is set: decode checked the version)."""
    previous = route.previous
    assert previous is not None
    old = previous.model.model_validate_json(text)
    return route.model.model_validate(previous.upcast(old.model_dump()))


def _newer_user(raw: RawDelivery) -> UUID | None:
    """The user a message of an unknown (newer) version is for, so that it is held in its
    user's order: the body's `user_id` if it has a readable one. The user header must agree,
    as on any message (else it is schema_invalid: a header is never trusted over the body)."""
    try:
        parsed = loads(raw.body)  # bounded: the body is not checked yet
    except ValueError:
        parsed = None
    named = parsed.get("user_id") if isinstance(parsed, dict) else None
    user = message_uuid(named) if isinstance(named, str) else None
    if user is not None:
        _check_user_header(raw, user)
    return user


def _check_user_header(raw: RawDelivery, user: UUID) -> None:
    """The user header, when there is one, must name the body's user: it is only a claim
    beside the body, never trusted over it (schema_invalid otherwise)."""
    header_user = header_text(raw.headers, H_USER_ID, 64)
    if header_user is None and raw.headers.get(H_USER_ID) is not None:
        # Read as a parked copy keeps it (events.envelope.jsonable: a decimal or a time as its
        # text), so that a message decodes alike at the door and when drained from the lot.
        kept = jsonable(raw.headers[H_USER_ID])
        header_user = kept[:64] if isinstance(kept, str) else None
    if header_user is not None and header_user != str(user):
        raise BadMessageError(
            "schema_invalid", f"{H_USER_ID}={header_user} differs from body user_id {user}"
        )


def _uuid_header(headers: Mapping[str, Any], name: str) -> UUID | None:
    value = headers.get(name)
    if value is None:
        return None
    try:
        return UUID(header_text(headers, name, 64) or "")
    except ValueError:
        raise BadMessageError(
            "invalid_header", f"header {name}={preview(value)} is not a UUID"
        ) from None


def _time_header(headers: Mapping[str, Any], name: str) -> datetime | None:
    value = headers.get(name)
    if value is None or isinstance(value, datetime):
        return value.replace(tzinfo=value.tzinfo or UTC) if value is not None else None
    text = header_text(headers, name, 64) or ""
    try:
        parsed = datetime.fromisoformat(text)
    except ValueError:
        raise BadMessageError(
            "invalid_header", f"header {name}={preview(value)} is not an ISO 8601 time"
        ) from None
    return parsed if parsed.tzinfo else parsed.replace(tzinfo=UTC)


def _summarise(exc: ValidationError) -> str:
    parts = []
    for error in exc.errors()[:5]:
        where = ".".join(str(p) for p in error["loc"]) or "body"
        parts.append(f"{where}: {error['msg']}")
    more = exc.error_count() - len(parts)
    # A field name or a message may quote the sender's NUL (an unknown key, a bad UUID).
    return clean_text("; ".join(parts) + (f" (+{more} more)" if more > 0 else ""))


_SURROGATE_ESCAPE = re.compile(r"\\u[dD][89a-fA-F][0-9a-fA-F]{2}")
MAX_WALKED = 10_000
"""JSON values looked at for a lone surrogate at most (a body is at most max_body_bytes)."""


def _lone_surrogate(text: str) -> str | None:
    """Where a body that pydantic's parser refused as invalid JSON holds a string with a lone
    surrogate escape (`"\\ud800"`): `field: what`, or None when that is not why.

    JSON's grammar allows such an escape and Python's json module decodes it, but no UTF-8 text
    (nor Postgres) can hold what it decodes to: it is a text field with a character Postgres
    cannot store, refused as schema_invalid like a NUL (events.models.Text), not malformed JSON.
    """
    if _SURROGATE_ESCAPE.search(text) is None or not text.lstrip().startswith("{"):
        return None  # a body is a JSON object; anything else is invalid whatever it holds
    try:
        parsed = json.loads(text)
    except (ValueError, RecursionError):
        return None  # broken for another reason too: invalid JSON it is
    stack: list[tuple[str, Any]] = [("body", parsed)]
    for _ in range(MAX_WALKED):
        if not stack:
            return None
        where, value = stack.pop()
        if isinstance(value, str):
            problem = unstorable(value)
            if problem is not None:
                return f"{clean_text(where)}: text holds {problem}"
        elif isinstance(value, dict):
            for key, item in reversed(value.items()):
                name = key if where == "body" else f"{where}.{key}"
                stack.append((name, item))
                stack.append((f"{name} (the field's name)", key))
        elif isinstance(value, list):
            stack.extend((f"{where}.{i}", item) for i, item in reversed(list(enumerate(value))))
    return None
