"""What a delivery on the dead-letter queue is filed as (the dead-letter ingester,
consumers/ingest.py, stores it).

Three kinds of message arrive on the dead-letter queue:
- messages the broker dead-lettered on its own (rejected, TTL expired, a queue length limit, a
  quorum queue's delivery limit): the reason and the queue come from the `x-death` header;
- last-resort copies a pkgq consumer made when even its failure path broke (see
  infra/rabbit/consumer.py): the reason and error come from the `x-pkgq-dead-*` headers;
- commands published to the main exchange with a key no queue is bound for (the plain key of
  a partitioned route, a stale partition map), which its alternate exchange passes on
  (infra/rabbit/topology.py, unroutable_keys): filed as `unroutable`, whatever their headers
  say, to be replayed (`pkgq dlq replay` routes by the current partition map).
Headers are data: whatever their type, size or depth, each gives a bounded, storable dead
letter (`safe_form`, with no headers, when even that is refused).
"""

from __future__ import annotations

import dataclasses
import json
from typing import Any

import structlog

from events.decoding import RawDelivery, message_uuid
from events.envelope import (
    H_DEAD_CONSUMER,
    H_DEAD_ERROR,
    H_DEAD_REASON,
    H_DEAD_TRACEBACK,
    bounded_text,
    jsonable,
    publisher_of,
)
from events.identity import body_user, message_key
from events.partitioning import route_of_key
from events.routes import ROUTES, UNTRUSTED_PUBLISHER
from infra.postgres import dead_letters

log = structlog.get_logger(__name__)


def _consumer_of(route: str, queue: str | None) -> str:
    if route in ROUTES:
        return ROUTES[route].short_name
    return queue or route


def _text(value: Any, limit: int = 500) -> str:
    """A header field that should be text, as text: whatever type it came as, bounded."""
    if isinstance(value, str):
        return bounded_text(value, limit)
    return bounded_text(json.dumps(value), limit)  # already jsonable: no deep walk left


UNROUTABLE = "unroutable"


def to_dead_letter(
    raw: RawDelivery, trusted_publisher: str | None = None, main_exchange: str | None = None
) -> dead_letters.NewDeadLetter:
    """What to file for a delivery on the dead-letter queue, with who published the message
    first (`first_publisher`); see `_classified`."""
    dead = _classified(raw, trusted_publisher, main_exchange)
    publisher = first_publisher(raw, trusted_publisher)
    uuid = message_uuid(dead.message_id)
    return dataclasses.replace(
        dead,
        publisher=publisher,
        # Its key (events/identity.py), so that what it is matched on (a hold, a retry, the
        # inbox) is this message's only, never another publisher's or user's copy's.
        message_key=message_key(uuid, publisher, dead.user_id) if uuid is not None else None,
    )


def first_publisher(raw: RawDelivery, trusted_publisher: str | None) -> str:
    """Who published the message on the dead-letter queue first, as the broker verified it.
    RabbitMQ keeps a message's properties, its user_id included, when it dead-letters it: the
    delivery's user_id is its publisher's. A message pkgq published (a last-resort copy, an
    expired retry or replay) names its first publisher in H_PUBLISHER, believed from pkgq's
    user only: an outsider's header of pkgq's is ignored."""
    if trusted_publisher is not None and raw.publisher != trusted_publisher:
        return publisher_of({}, raw.publisher)
    return publisher_of(raw.headers, raw.publisher)


def _classified(
    raw: RawDelivery, trusted_publisher: str | None, main_exchange: str | None
) -> dead_letters.NewDeadLetter:
    """What to file for a delivery on the dead-letter queue. Total: any header, of any type,
    size or depth, gives a bounded, storable dead letter (the ingester must never loop).

    The `x-pkgq-dead-*` headers are believed only on a message the broker did not dead-letter
    (no `x-death`): pkgq's last-resort copy goes straight to the dead-letter exchange, so on a
    broker dead letter they are whatever its original publisher wrote. With
    `trusted_publisher` (pkgq's AMQP user), they are believed only from a message that user
    published (the broker validates the `user_id` property): a copy someone else published
    with death headers (pkgq's, or `x-death` / `x-first-death-*` not in the broker's shape)
    is filed, in the safe form, as `untrusted_publisher`. A death header in the broker's shape
    cannot be told from the broker's own: it is filed as a broker dead letter, under one of
    the reasons the broker gives, and says nothing about pkgq's jobs.

    With `main_exchange`, a message published there (caught by its alternate exchange) is
    filed as `unroutable`."""
    if main_exchange is not None and raw.exchange == main_exchange:
        try:
            return _unroutable(raw, main_exchange)
        except Exception as exc:  # noqa: BLE001  (a bug here must not requeue it for ever)
            log.error("dead_letter_unreadable", error=repr(exc)[:500])  # noqa: TRY400
            return safe_form(raw, f"its headers could not be read ({type(exc).__name__})")
    try:
        if trusted_publisher not in (None, raw.publisher) and _claims_a_death(raw.headers):
            return dataclasses.replace(
                safe_form(raw, "dead-letter headers from a publisher that is not pkgq"),
                reason=UNTRUSTED_PUBLISHER,
            )
        return _to_dead_letter(raw)
    except Exception as exc:  # noqa: BLE001  (a bug here must not requeue it for ever)
        log.error("dead_letter_unreadable", error=repr(exc)[:500])  # noqa: TRY400
        return safe_form(raw, f"its headers could not be read ({type(exc).__name__})")


def _to_dead_letter(raw: RawDelivery) -> dead_letters.NewDeadLetter:
    headers = jsonable(dict(raw.headers))
    route = route_of_key(bounded_text(raw.routing_key or "", 255))
    deaths = headers.get("x-death")
    if H_DEAD_REASON in headers and deaths is None:
        error = _text(headers.get(H_DEAD_ERROR) or "", 4000)
        error_type, _, message = error.partition(": ")
        consumer = headers.get(H_DEAD_CONSUMER)
        return _filed(
            raw,
            headers,
            source="consumer",
            route=route,
            consumer=_text(consumer, 255) if consumer else _consumer_of(route, None),
            reason=_text(headers[H_DEAD_REASON], 100),
            error_type=error_type[:500] or "Error",
            error_message=message or error_type or error or "(no message)",
            error_location="consumer failure path",
            traceback=_text(headers[H_DEAD_TRACEBACK], 16000)
            if headers.get(H_DEAD_TRACEBACK) is not None
            else None,
        )
    death = _broker_death(headers) or {}
    first_reason = headers.get("x-first-death-reason")
    if death:
        reason = death["reason"]
    elif _is_broker_reason(first_reason):
        reason = first_reason
    else:
        reason = "unknown"
    queue = _text(death.get("queue") or headers.get("x-first-death-queue") or "", 255)
    keys = death.get("routing-keys")
    if isinstance(keys, list) and keys:
        route = route_of_key(_text(keys[0], 255))
    count = death.get("count", 1)
    return _filed(
        raw,
        headers,
        source="broker",
        route=route,
        consumer=_consumer_of(route, queue),
        reason=reason,
        error_type="BrokerDeadLetter",
        error_message=f"RabbitMQ dead-lettered it from queue {queue!r}: {reason}",
        error_location=f"queue {queue}",
        attempts=count if isinstance(count, int) and not isinstance(count, bool) else 1,
    )


BROKER_REASONS = frozenset({"rejected", "expired", "maxlen", "delivery_limit"})
"""Why RabbitMQ dead-letters a message: the only reasons a broker dead letter is filed under."""


def _is_broker_reason(value: Any) -> bool:
    return isinstance(value, str) and value in BROKER_REASONS


def _broker_death(headers: Any) -> dict[str, Any] | None:
    """The newest `x-death` entry when it has the broker's shape (a table whose reason is one
    the broker gives), else None: a mangled `x-death` names no reason. Total: any value."""
    deaths = headers.get("x-death")
    if not (isinstance(deaths, list) and deaths and isinstance(deaths[0], dict)):
        return None
    death: dict[str, Any] = deaths[0]
    return death if _is_broker_reason(death.get("reason")) else None


def _claims_a_death(headers: Any) -> bool:
    """Whether an outsider's copy carries death headers not in the broker's shape: pkgq's own
    (a last-resort copy's), or `x-death` / `x-first-death-reason` the broker did not write."""
    if H_DEAD_REASON in headers:
        return "x-death" not in headers or _broker_death(headers) is None
    if "x-death" in headers:
        return _broker_death(headers) is None
    return "x-first-death-reason" in headers


def _unroutable(raw: RawDelivery, exchange: str) -> dead_letters.NewDeadLetter:
    headers = jsonable(dict(raw.headers))
    key = bounded_text(raw.routing_key or "", 255)
    route = route_of_key(key)
    return _filed(
        raw,
        headers,
        source="broker",
        route=route,
        consumer=_consumer_of(route, None),
        reason=UNROUTABLE,
        error_type="UnroutableMessage",
        error_message=f"no queue is bound for routing key {key!r} on exchange {exchange!r}: "
        "a partitioned route takes `<route>.p<k>` keys only (docs/publishing.md); check the "
        "publisher's partition map against PKGQ_PARTITIONS",
        error_location=f"exchange {exchange}",
    )


def _filed(raw: RawDelivery, headers: dict[str, Any], **why: Any) -> dead_letters.NewDeadLetter:
    """`raw` filed as it came (its id, type, content type and body, bounded) with `headers`
    (JSON-ready), its user from its body unless `why` gives `user_id`, and `why`: source,
    route, consumer, reason and the error fields."""
    user_id = why.pop("user_id") if "user_id" in why else body_user(raw.body)
    return dead_letters.NewDeadLetter(
        message_id=_optional(raw.message_id),
        user_id=user_id,
        message_type=_optional(raw.message_type),
        content_type=_optional(raw.content_type),
        body=raw.body,
        headers=headers,
        **why,
    )


def _optional(value: Any) -> str | None:
    return bounded_text(value, 255) if isinstance(value, str) else None


def safe_form(raw: RawDelivery, why: str) -> dead_letters.NewDeadLetter:
    """The last form a dead letter is filed in: its body (bounded by the store) and plain text
    only, none of its headers. Stored under a key of its own (source `broker`, hashed), so it
    can never replace another row."""
    # The message_id keeps two refused messages with the same body apart (the key hashes it).
    headers = {
        "x-pkgq-unstorable-headers": bounded_text(why, 500),
        "message_id": _optional(raw.message_id),
    }
    return _filed(
        raw,
        headers,
        user_id=None,
        source="broker",
        route=route_of_key(bounded_text(raw.routing_key or "", 255)),
        consumer="dead_letters",
        reason="unstorable",
        error_type="UnstorableDeadLetter",
        error_message=f"filed without its headers: {why}",
        error_location="dead-letter ingester",
    )
