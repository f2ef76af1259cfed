"""The dedup-and-holds stage: whether a decoded delivery may be applied now.

A message the consumer applied before is a duplicate. One delivered after its TTL is expired.
While a user's messages on the consumer are held behind an earlier failure, the later ones are
parked in arrival order. The gate is kept up to date as the batch goes, so a failure early in a
batch holds its user's later messages in the same batch.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass
from datetime import datetime
from uuid import UUID

from consumers.delivery.decode import Delivery
from infra.postgres import holds


class Admission(enum.Enum):
    """Where the deliveries come from, which decides what a hold on their user means."""

    FROM_QUEUE = "from_queue"
    """From the broker: behind a hold (blocked or being drained) they are parked."""
    FROM_PARKING = "from_parking"
    """Taken from the parking lot by the drain, whose hold is lifted: they may go."""


class Step(enum.Enum):
    DUPLICATE = "duplicate"
    EXPIRED = "expired"
    PARK = "park"
    APPLY = "apply"


@dataclass
class Gate:
    consumer: str
    seen: set[UUID]
    """Messages the consumer has applied (or found expired) so far."""
    held: dict[UUID, holds.Hold]
    """The holds on the batch's users, locked, as the batch has left them so far."""
    now: datetime
    admission: Admission

    def hold_of(self, delivery: Delivery) -> holds.Hold | None:
        user = delivery.user_id
        return self.held.get(user) if user is not None else None

    def step(self, delivery: Delivery) -> Step:
        if delivery.message_id in self.seen:
            return Step.DUPLICATE
        expires_at = delivery.decoded.envelope.expires_at
        if expires_at is not None and expires_at <= self.now:
            return Step.EXPIRED  # not taken within its TTL: never applied, whatever holds
        hold = self.hold_of(delivery)
        if (
            self.admission is Admission.FROM_QUEUE
            and hold is not None
            and hold.blocker != delivery.message_id
        ):
            return Step.PARK
        return Step.APPLY

    def done(self, delivery: Delivery, *, finished: bool, holds_user: bool) -> None:
        """Note what became of a delivery. Only a message that is done counts as seen: a
        second copy of one that failed in this batch (a relay re-publish, or a redelivery next
        to its own retry) must meet the hold it left, not pass as a duplicate."""
        if finished:
            self.seen.add(delivery.message_id)
        user = delivery.user_id
        if user is None:
            return
        hold = self.held.get(user)
        if holds_user:  # it failed: the user's next messages in this batch wait behind it
            self.held[user] = holds.Hold(self.consumer, user, delivery.message_id, "retrying")
        elif hold is not None and hold.blocker == delivery.message_id:
            self.held[user] = holds.Hold(self.consumer, user, None, "releasing")
