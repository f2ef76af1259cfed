"""What a processor tells the consumer loop about each delivery it was handed."""

from __future__ import annotations

import enum
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass

from events.decoding import RawDelivery


class Outcome(enum.StrEnum):
    ACKED = "acked"
    DUPLICATE = "duplicate"
    """The same message (message_id) again: the inbox knew it, nothing was run."""
    DUPLICATE_ORDER = "duplicate_order"
    """A purchase of an order (by_order) the user bought before, under a new message_id: the
    handler ran, queued nothing, and the message is acked like an applied one."""
    DEAD_LETTERED = "dead_lettered"
    RETRY_SCHEDULED = "retried"
    PARKED = "parked"
    GIVEN_BACK = "given_back"
    """Handed back to the queue in its place (the handler ran past the route's TTR)."""
    CANCELLED = "cancelled"
    """A member of a cancelled group: acknowledged without running the handler."""
    EXPIRED = "expired"
    """Delivered after its TTL: recorded as expired in the dead-letter store, not applied."""


@dataclass(frozen=True, slots=True)
class Result:
    """One delivery's fate, as its processor decided it."""

    outcome: Outcome
    seconds: float | None = None
    """The message's own share of its batch's time (its log line's `ms`)."""
    trace_id: str | None = None
    """The trace it was applied in (one it started, when it came without a `traceparent`)."""


Processor = Callable[[Sequence[RawDelivery]], Awaitable[list[Result]]]
"""Decides the fate of a batch of deliveries (often one): a result per delivery, in order."""
