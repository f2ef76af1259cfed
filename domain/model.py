"""Entities of the package queue: catalog packages and the items in a user's queue."""

from __future__ import annotations

import enum
from dataclasses import dataclass
from datetime import datetime, timedelta
from uuid import UUID


class ItemStatus(enum.StrEnum):
    IN_QUEUE = "in_queue"
    ACTIVE = "active"
    CONSUMED = "consumed"
    CANCELLED = "cancelled"


class ExpiryReason(enum.StrEnum):
    TIME = "time"
    USAGE = "usage"


@dataclass(frozen=True, slots=True)
class Package:
    """A catalog entry. `duration=None` means the package never expires by time."""

    id: int
    name: str
    traffic_limit: int
    duration: timedelta | None = None


@dataclass(slots=True)
class QueueItem:
    """One purchased package in a user's queue (the seed's PackageQueueItem plus expire_at)."""

    id: int
    user_id: UUID
    package: Package
    by_order: UUID | None
    status: ItemStatus
    created_at: datetime
    activated_at: datetime | None = None
    upload: int = 0
    download: int = 0
    adjust_quota: int = 0
    expire_at: datetime | None = None

    @property
    def package_id(self) -> int:
        return self.package.id

    @property
    def used(self) -> int:
        return self.upload + self.download

    @property
    def quota(self) -> int:
        """Bytes this item may carry: the catalog limit plus the (possibly negative) adjustment."""
        return self.package.traffic_limit + self.adjust_quota

    @property
    def remaining(self) -> int:
        return max(self.quota - self.used, 0)

    def traffic_exhausted(self) -> bool:
        return self.used >= self.quota

    def time_exhausted(self, now: datetime) -> bool:
        return self.expire_at is not None and self.expire_at <= now

    def queue_order(self) -> tuple[datetime, int]:
        """FIFO order: oldest `created_at` first, then the lower id."""
        return (self.created_at, self.id)
