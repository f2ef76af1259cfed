"""What the domain says happened. The `events` package turns these into wire contracts."""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime
from uuid import UUID

from domain.model import ExpiryReason
from domain.records import record


@dataclass(frozen=True, slots=True)
class PackagesQueued:
    user_id: UUID
    package_id: int
    item_ids: tuple[int, ...]
    pushed_at: datetime


@dataclass(frozen=True, slots=True)
class PackageActivated:
    user_id: UUID
    item_id: int
    package_id: int
    activated_at: datetime
    quota: int | None
    """None: unlimited traffic."""
    remaining: int | None
    expire_at: datetime | None


@dataclass(frozen=True, slots=True)
class PackageExpired:
    """An item left `active`: consumed by time or by usage. Emitted exactly once per item."""

    user_id: UUID
    item_id: int
    package_id: int
    expired_at: datetime
    reason: ExpiryReason


@dataclass(frozen=True, slots=True)
class AllPackagesExpired:
    user_id: UUID
    expired_at: datetime


@dataclass(frozen=True, slots=True)
class ExpiryScheduled:
    """Time expiry of an active item is due at `due_at`: fire its timer (`expire_due`) then."""

    user_id: UUID
    item_id: int
    package_id: int
    due_at: datetime


@dataclass(frozen=True, slots=True)
class ExpiryUnscheduled:
    """The item left `active` before its time ran out: its pending time-expiry trigger is void."""

    user_id: UUID
    item_id: int


@record
class UsageRemaining:
    """Traffic was billed to the active item; node management wants the new remaining figure."""

    user_id: UUID
    item_id: int
    remaining: int | None
    """None: unlimited traffic."""


@dataclass(frozen=True, slots=True)
class PackageCancelled:
    """An item was cancelled (refunded) while queued or active. Emitted once per item."""

    user_id: UUID
    item_id: int
    package_id: int
    cancelled_at: datetime
    was_active: bool
    reason: str | None = None
    operator: str | None = None
    """Who the command says did it (claimed by its body)."""
    publisher: str | None = None
    """Who published the command, as the broker verified it (its AMQP user_id)."""


@dataclass(frozen=True, slots=True)
class DuplicateOrder:
    """A purchase named an order (`by_order`) the user already bought: nothing was queued.
    `item_ids` are the items the first purchase of that order queued."""

    user_id: UUID
    by_order: UUID
    item_ids: tuple[int, ...]


@dataclass(frozen=True, slots=True)
class DuplicateUsage:
    """A usage record named a billing record id (`usage_id`) billed before: nothing was billed.
    `item_id`: the item the first record was billed to (None: it was kept as unbilled)."""

    user_id: UUID
    usage_id: str
    item_id: int | None


DomainEvent = (
    PackagesQueued
    | PackageActivated
    | PackageExpired
    | AllPackagesExpired
    | ExpiryScheduled
    | ExpiryUnscheduled
    | UsageRemaining
    | PackageCancelled
    | DuplicateOrder
    | DuplicateUsage
)
