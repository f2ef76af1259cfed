"""The state the property tests of `UserQueue` compare (the same shape for the real aggregate
and the reference), and the reference model: deliberately simple and independent of `domain`
(see tests/unit/test_domain_queue_properties.py)."""

from __future__ import annotations

from dataclasses import dataclass, field
from datetime import datetime, timedelta

from domain.queue import UserQueue

# -- observable state (shared shape of the real aggregate and the reference) -----------------


@dataclass(frozen=True)
class ItemState:
    status: str
    upload: int
    download: int
    adjust: int
    quota: int | None
    remaining: int | None
    activated_at: datetime | None
    expire_at: datetime | None

    def time_is_up(self, now: datetime) -> bool:
        return self.expire_at is not None and self.expire_at <= now


@dataclass(frozen=True)
class State:
    items: dict[int, ItemState]
    unbilled: tuple[int, int]
    access: bool

    def statuses(self) -> dict[int, str]:
        return {item_id: item.status for item_id, item in self.items.items()}

    def active_ids(self) -> list[int]:
        return [item_id for item_id, item in self.items.items() if item.status == "active"]

    def traffic(self) -> dict[int, tuple[int, int]]:
        return {item_id: (item.upload, item.download) for item_id, item in self.items.items()}


def real_state(queue: UserQueue) -> State:
    return State(
        items={
            item.id: ItemState(
                status=item.status.value,
                upload=item.upload,
                download=item.download,
                adjust=item.adjust_quota,
                quota=item.quota,
                remaining=item.remaining,
                activated_at=item.activated_at,
                expire_at=item.expire_at,
            )
            for item in queue.items
        },
        unbilled=(queue.unbilled_upload, queue.unbilled_download),
        access=queue.has_access,
    )


# -- the reference model ---------------------------------------------------------------------


@dataclass
class RefItem:
    id: int
    limit: int | None
    duration: timedelta | None
    created_at: datetime
    status: str = "in_queue"
    adjust: int = 0
    upload: int = 0
    download: int = 0
    activated_at: datetime | None = None
    expire_at: datetime | None = None


@dataclass
class RefQueue:
    """One user's queue in the simplest terms; every change of the active item advances at once.

    An item leaves `active` by usage, by time (as soon as anything happens at or after its
    expire_at: its timer, a usage report, a quota adjustment) or by a cancel; only the first two
    count as expirations, each recorded once.
    """

    items: list[RefItem] = field(default_factory=list)
    unbilled_upload: int = 0
    unbilled_download: int = 0
    access: bool = False
    activations: list[tuple[int, int | None, int | None]] = field(default_factory=list)
    """(item id, quota, remaining) at each activation, in order."""
    access_losses: int = 0
    orders: set[int] = field(default_factory=set)
    cancellations: list[tuple[int, bool]] = field(default_factory=list)
    """(item id, was active) of every item a cancel took out of the queue, in order."""
    expirations: list[tuple[int, str, datetime]] = field(default_factory=list)
    """(item id, reason, expired at) of every item that ran out, in order. Expired at is the
    item's expire_at for time, the moment it happened for usage."""

    def find(self, item_id: int) -> RefItem:
        return next(item for item in self.items if item.id == item_id)

    def active(self) -> RefItem | None:
        return next((item for item in self.items if item.status == "active"), None)

    @staticmethod
    def quota(item: RefItem) -> int | None:
        return None if item.limit is None else item.limit + item.adjust

    @staticmethod
    def remaining(item: RefItem) -> int | None:
        quota = RefQueue.quota(item)
        return None if quota is None else max(quota - item.upload - item.download, 0)

    @staticmethod
    def out_of_traffic(item: RefItem) -> bool:
        quota = RefQueue.quota(item)
        return quota is not None and item.upload + item.download >= quota

    def current(self, now: datetime) -> int | None:
        """GetCurrentPackage: the active item unless its time is up."""
        item = self.active()
        return None if item is None or self.out_of_time(item, now) else item.id

    @staticmethod
    def out_of_time(item: RefItem, now: datetime) -> bool:
        return item.expire_at is not None and item.expire_at <= now

    def run_out(self, item: RefItem, reason: str, now: datetime) -> None:
        item.status = "consumed"
        at = item.expire_at if reason == "time" and item.expire_at is not None else now
        self.expirations.append((item.id, reason, at))

    def advance(self, now: datetime) -> None:
        if self.active() is not None:
            return
        waiting = [item for item in self.items if item.status == "in_queue"]
        for item in sorted(waiting, key=lambda i: (i.created_at, i.id)):
            item.status = "active"
            item.activated_at = now
            item.expire_at = None if item.duration is None else now + item.duration
            item.upload += self.unbilled_upload
            item.download += self.unbilled_download
            self.unbilled_upload = self.unbilled_download = 0
            self.access = True
            self.activations.append((item.id, self.quota(item), self.remaining(item)))
            if self.out_of_traffic(item):
                self.run_out(item, "usage", now)
            elif self.out_of_time(item, now):
                self.run_out(item, "time", now)
            else:
                return
        if self.access:
            self.access = False
            self.access_losses += 1

    def expire_by_time(self, now: datetime) -> None:
        """Whatever happens at or after the active item's expire_at first ends it by time."""
        item = self.active()
        while item is not None and self.out_of_time(item, now):
            self.run_out(item, "time", now)
            self.advance(now)
            item = self.active()

    def purchase(
        self,
        ids: list[int],
        limit: int | None,
        duration: timedelta | None,
        order: int | None,
        now: datetime,
    ) -> str:
        if order is not None:
            if order in self.orders:
                return "duplicate"
            self.orders.add(order)
        for item_id in ids:
            self.items.append(RefItem(item_id, limit, duration, now))
        self.advance(now)
        return "ok"

    def usage(
        self, upload: int, download: int, now: datetime, recorded_at: datetime | None = None
    ) -> int | None:
        """Bill the traffic; return the id of the item it went to (None: kept as unbilled).

        Late traffic: the active item past its expire_at is still open until its expiry is
        applied, so traffic that happened before its expire_at is its own; it then runs out
        (by usage if that used it up, else by time). Once an item has run out, later reports
        go to whichever item is active, whenever the traffic happened."""
        item = self.active()
        if (
            item is not None
            and recorded_at is not None
            and item.expire_at is not None
            and self.out_of_time(item, now)
            and recorded_at < item.expire_at
        ):
            item.upload += upload
            item.download += download
            if self.out_of_traffic(item):
                self.run_out(item, "usage", now)
                self.advance(now)
            self.expire_by_time(now)
            return item.id
        self.expire_by_time(now)
        item = self.active()
        if item is None:
            self.unbilled_upload += upload
            self.unbilled_download += download
            return None
        item.upload += upload
        item.download += download
        if self.out_of_traffic(item):
            self.run_out(item, "usage", now)
            self.advance(now)
        return item.id

    def cancel(self, item_id: int, now: datetime) -> str:
        item = self.find(item_id)
        if item.status == "consumed":
            return "not_cancellable"
        if item.status == "cancelled":
            return "ok"
        if item.status == "active" and self.out_of_time(item, now):
            return "not_cancellable"  # its time is up: as good as consumed, timer or not
        was_active = item.status == "active"
        item.status = "cancelled"
        self.cancellations.append((item.id, was_active))
        if was_active:
            self.advance(now)
        return "ok"

    def adjust(self, item_id: int, delta: int, now: datetime) -> str:
        item = self.find(item_id)
        if item.status in ("consumed", "cancelled"):
            return "not_adjustable"
        if item.limit is None:
            return "unlimited"
        item.adjust += delta
        if item.status != "active":
            return "ok"
        if self.out_of_time(item, now):
            self.run_out(item, "time", now)
            self.advance(now)
        elif self.out_of_traffic(item):
            self.run_out(item, "usage", now)
            self.advance(now)
        return "ok"

    def tick(self, now: datetime) -> None:
        self.expire_by_time(now)

    def state(self) -> State:
        return State(
            items={
                item.id: ItemState(
                    status=item.status,
                    upload=item.upload,
                    download=item.download,
                    adjust=item.adjust,
                    quota=self.quota(item),
                    remaining=self.remaining(item),
                    activated_at=item.activated_at,
                    expire_at=item.expire_at,
                )
                for item in self.items
            },
            unbilled=(self.unbilled_upload, self.unbilled_download),
            access=self.access,
        )
