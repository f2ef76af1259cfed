"""The decode stage: raw deliveries become decoded ones, or bad input with its reason.

It is also the trust gate. Lifecycle events and internal messages (every route that is not
`inbound`) are published by pkgq only; a consumer of such a route takes a delivery only when
its AMQP user_id is pkgq's own user. RabbitMQ refuses a publish whose user_id differs from the
publishing connection's user, so the property cannot be forged (short of the `impersonator`
tag, which no role has). Anything else is buried as `untrusted_publisher` like bad input:
before its body is believed, with nothing held back behind it.

pkgq sends messages again as itself (a retry, a replay), so the delivery's user_id alone does
not say who published a message first: every delivery taken from the broker is stamped with its
first publisher (`H_PUBLISHER`: kept as pkgq wrote it on pkgq's own copies, else the delivery's
user_id), which its retries, parked copy and dead letter keep. A copy pkgq sent of a message
someone else published first is refused on a route only pkgq publishes, like the original.
Before that, an outsider's pkgq marks (job marks, failure and replay history: PKGQ_MARKS) are
taken off (`distrusted`), so nothing reads, parks, retries or buries them.

All of it depends on the delivery alone and the route's fixed configuration (`decode_one`), so
a consumer does it as each delivery arrives, ahead of its batch (DeliveryPipeline.take_ahead).
"""

from __future__ import annotations

from collections.abc import Sequence
from uuid import UUID

import structlog

from domain.records import record
from events.decoding import BadMessageError, Decoded, NewerVersionError, RawDelivery, decode
from events.envelope import H_PUBLISHER, bounded_text, publisher_of, without_pkgq_marks
from events.routes import UNTRUSTED_PUBLISHER, Route

log = structlog.get_logger(__name__)


@record
class Delivery:
    """A delivery that decoded, and its place in the batch as the broker delivered it."""

    index: int
    raw: RawDelivery
    decoded: Decoded

    @property
    def message_id(self) -> UUID:
        return self.decoded.envelope.message_id

    @property
    def user_id(self) -> UUID | None:
        return self.decoded.envelope.user_id

    @property
    def key(self) -> UUID:
        """Its identity (events/identity.py): what the bookkeeping matches it on."""
        return self.decoded.key


@record
class BadDelivery:
    index: int
    raw: RawDelivery
    problem: BadMessageError


def check_publisher(route: Route, raw: RawDelivery, trusted: str) -> None:
    """Raise BadMessageError(untrusted_publisher) unless `raw` may be taken on `route`: anyone
    may publish on an inbound route (pkgq's own retries and replays of a command come back on
    it too); only `trusted` on the others, and only a message `trusted` published first (a
    replay pkgq sent of an outsider's message is the outsider's)."""
    if route.inbound:
        return
    if raw.publisher != trusted:
        who = "no user_id" if raw.publisher is None else f"user_id {raw.publisher!r}"
    elif (first := publisher_of(raw.headers, raw.publisher)) != trusted:
        who = f"user_id {trusted!r}, but pkgq sent it again for {first!r}, who published it first"
    else:
        return
    raise BadMessageError(
        UNTRUSTED_PUBLISHER,
        f"{route.name} is published by pkgq ({trusted!r}) only; this message has {who}",
    )


def distrusted(route: Route, raw: RawDelivery, trusted: str) -> RawDelivery:
    """`raw` without an outsider's pkgq marks (events.envelope.PKGQ_MARKS): kept only on what
    `trusted` (pkgq's AMQP user) published."""
    if raw.publisher == trusted:
        return raw
    headers = without_pkgq_marks(raw.headers)
    if headers is None:
        return raw
    log.info(
        "outsider_job_marks_ignored",
        route=route.name,
        message_id=bounded_text(str(raw.message_id), 64),
        publisher=bounded_text(str(raw.publisher), 64),
        headers=sorted(set(raw.headers) - set(headers)),
    )
    return raw.with_headers(headers)


def stamped(raw: RawDelivery, trusted: str) -> RawDelivery:
    """`raw` with H_PUBLISHER naming who published it first: as pkgq wrote it on its own copy,
    else the delivery's user_id (`unverified` without one), whatever an outsider wrote there."""
    first = publisher_of(raw.headers if raw.publisher == trusted else {}, raw.publisher)
    if raw.headers.get(H_PUBLISHER) == first:
        return raw
    return raw.with_headers({**raw.headers, H_PUBLISHER: first})


Taken = tuple[RawDelivery, Decoded | BadMessageError]
"""A delivery as taken (stamped with its first publisher when checked), and what it decoded to
or why it is bad input."""


def decode_one(
    route: Route, delivered: RawDelivery, *, max_body_bytes: int, trusted_publisher: str | None
) -> Taken:
    """One delivery's part of `decode_all`: it depends on the delivery alone (and the route's
    fixed configuration), so it may run before the delivery's batch is taken."""
    raw = delivered
    if trusted_publisher is not None:
        raw = stamped(distrusted(route, delivered, trusted_publisher), trusted_publisher)
    try:
        if trusted_publisher is not None:
            check_publisher(route, raw, trusted_publisher)
        return raw, decode(route, raw, max_body_bytes=max_body_bytes)
    except NewerVersionError as newer:
        # Not bad input: held in its user's order and retried for a newer pkgq to apply.
        return raw, newer.decoded
    except BadMessageError as problem:
        return raw, problem


def sort_taken(taken: Sequence[Taken]) -> tuple[list[Delivery], list[BadDelivery]]:
    """Taken deliveries, indexed by their place in the batch: the good ones and the bad, each
    in delivery order (the order the executor decides them in)."""
    ready: list[Delivery] = []
    bad: list[BadDelivery] = []
    for index, (raw, outcome) in enumerate(taken):
        if isinstance(outcome, BadMessageError):
            bad.append(BadDelivery(index, raw, outcome))
        else:
            ready.append(Delivery(index, raw, outcome))
    return ready, bad


def decode_all(
    route: Route,
    raws: Sequence[RawDelivery],
    *,
    max_body_bytes: int,
    trusted_publisher: str | None = None,
) -> tuple[list[Delivery], list[BadDelivery]]:
    """Decode a batch's deliveries (indexed by their place in it), the good ones and the bad,
    each in delivery order.

    `trusted_publisher`: pkgq's AMQP user, checked on deliveries from the broker, which come
    back stamped with their first publisher (see the module docstring). None for deliveries
    that passed the check already (parked ones, which Postgres keeps without their AMQP
    properties, stamped)."""
    return sort_taken(
        [
            decode_one(
                route, raw, max_body_bytes=max_body_bytes, trusted_publisher=trusted_publisher
            )
            for raw in raws
        ]
    )
