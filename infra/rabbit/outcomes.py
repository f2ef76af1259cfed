"""What a processor tells the consumer loop about each delivery it was handed.

The business fate of a delivery is a `Fate` (domain/delivery.py), decided by the processor;
the transport's part is derived from it here, at the settle edge, and nowhere else.
"""

from __future__ import annotations

import enum
from collections.abc import Awaitable, Callable, Sequence

from domain.delivery import Fate
from domain.records import record
from events.decoding import RawDelivery


class Settle(enum.Enum):
    ACK = "ack"
    """Done with on the broker: applied, recorded, parked, scheduled again or buried."""
    GIVE_BACK = "give_back"
    """Back to the queue in its place: the channel is closed with it unacknowledged (a nack
    with requeue would send it to the back of a quorum queue)."""
    LAST_RESORT = "last_resort"
    """A confirmed copy to the dead-letter exchange first (infra/rabbit/last_resort.py), then
    the ack."""


def settle_of(fate: Fate) -> Settle:
    if fate is Fate.GIVEN_BACK:
        return Settle.GIVE_BACK
    return Settle.LAST_RESORT if fate is Fate.UNDECIDED else Settle.ACK


@record
class Result:
    """One delivery's fate, as its processor decided it."""

    fate: Fate
    seconds: float | None = None
    """The message's own share of its batch's time (its log line's `ms`)."""
    trace_id: str | None = None
    """The trace it was applied in (one it started, when it came without a `traceparent`)."""
    error: str | None = None
    """Why it is UNDECIDED (what its last-resort copy says)."""
    route_failure: bool = False
    """A failure of the route's own (domain.delivery.Decision.counts_against_route), which a
    circuit breaker counts; what pkgq refused (bad input, an untrusted publisher, a domain
    rule, an unknown version, an expired message) is not."""


Processor = Callable[[Sequence[RawDelivery]], Awaitable[list[Result]]]
"""Decides the fate of a batch of deliveries (often one): a result per delivery, in order."""
