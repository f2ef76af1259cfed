"""Entities of the package queue: catalog packages and the items in a user's queue."""

from __future__ import annotations

import enum
from dataclasses import dataclass
from datetime import datetime, timedelta
from uuid import UUID

from domain.records import record


class ItemStatus(enum.StrEnum):
    IN_QUEUE = "in_queue"
    ACTIVE = "active"
    CONSUMED = "consumed"
    CANCELLED = "cancelled"


class ExpiryReason(enum.StrEnum):
    TIME = "time"
    USAGE = "usage"


@record
class Terms:
    """What one purchase bought, fixed when it was bought: a later catalog edit changes the
    terms of later purchases only, never of items already queued or active."""

    package_id: int
    package_name: str
    traffic_limit: int | None
    """Bytes the item may carry; None: unlimited traffic (a time-only plan)."""
    duration: timedelta | None
    """How long the item lasts once active; None: it never expires by time."""


@dataclass(frozen=True, slots=True)
class Package:
    """A catalog entry. `traffic_limit=None`: unlimited traffic; `duration=None`: never expires
    by time (not both: such an item would hold the queue forever). A retired entry
    (`retired_at` set) is refused to new purchases; items bought before keep their terms."""

    id: int
    name: str
    traffic_limit: int | None
    duration: timedelta | None = None
    retired_at: datetime | None = None

    def __post_init__(self) -> None:
        if self.traffic_limit is None and self.duration is None:
            raise ValueError(f"package {self.name!r} needs a traffic limit, a duration or both")

    def terms(self) -> Terms:
        return Terms(self.id, self.name, self.traffic_limit, self.duration)

    def retired(self, now: datetime) -> bool:
        return self.retired_at is not None and self.retired_at <= now


@dataclass(slots=True)
class QueueItem:
    """One purchased package in a user's queue (a PackageQueueItem, plus expire_at)."""

    id: int
    user_id: UUID
    terms: Terms
    by_order: UUID | None
    status: ItemStatus
    created_at: datetime
    activated_at: datetime | None = None
    upload: int = 0
    download: int = 0
    adjust_quota: int = 0
    expire_at: datetime | None = None

    def copy(self) -> QueueItem:
        """A copy to change apart from this one (a savepoint's): every field, by position,
        since this runs for each loaded item of every message (dataclasses.replace is slower)."""
        return QueueItem(
            self.id,
            self.user_id,
            self.terms,
            self.by_order,
            self.status,
            self.created_at,
            self.activated_at,
            self.upload,
            self.download,
            self.adjust_quota,
            self.expire_at,
        )

    @property
    def package_id(self) -> int:
        return self.terms.package_id

    @property
    def unlimited(self) -> bool:
        """Unlimited traffic: the item ends by time (or a cancel), never by usage."""
        return self.terms.traffic_limit is None

    @property
    def used(self) -> int:
        return self.upload + self.download

    @property
    def quota(self) -> int | None:
        """Bytes this item may carry: the limit bought plus the (possibly negative) adjustment;
        None: unlimited."""
        limit = self.terms.traffic_limit
        return None if limit is None else limit + self.adjust_quota

    @property
    def remaining(self) -> int | None:
        quota = self.quota
        return None if quota is None else max(quota - self.used, 0)

    def traffic_exhausted(self) -> bool:
        quota = self.quota
        return quota is not None and self.used >= quota

    def time_exhausted(self, now: datetime) -> bool:
        return self.expire_at is not None and self.expire_at <= now

    def exhaustion(self, now: datetime) -> ExpiryReason | None:
        """Why the item is used up at `now` (traffic first), if it is."""
        if self.traffic_exhausted():
            return ExpiryReason.USAGE
        if self.time_exhausted(now):
            return ExpiryReason.TIME
        return None

    def status_at(self, now: datetime) -> ItemStatus:
        """The status as the clock sees it: an active item past its expire_at is consumed even
        while its time-expiry timer is still on its way (the stored status lags until then)."""
        if self.status is ItemStatus.ACTIVE and self.time_exhausted(now):
            return ItemStatus.CONSUMED
        return self.status

    def queue_order(self) -> tuple[datetime, int]:
        """FIFO order: oldest `created_at` first, then the lower id."""
        return (self.created_at, self.id)


def latest_moment(items: list[QueueItem]) -> datetime | None:
    """The latest moment the items record as past: a creation or an activation (None: no
    items). A user's next transition is never dated before it (UserQueue's clock)."""
    latest: datetime | None = None
    for item in items:  # a loop: once for every user of every batch
        at = item.created_at
        if item.activated_at is not None and item.activated_at > at:
            at = item.activated_at
        if latest is None or at > latest:
            latest = at
    return latest


@dataclass(frozen=True, slots=True)
class BilledUsage:
    """A usage record billed under its billing system's record id (RecordUsage version 2)."""

    item_id: int | None
    """The item it was billed to (None: kept as unbilled, with nothing active or queued)."""
    upload: int
    download: int
    recorded_at: datetime | None
    """When the traffic happened, as the billing system says (None: not said)."""
