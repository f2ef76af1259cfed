"""The user's package queue: the aggregate every transition runs on.

A `UserQueue` holds the user's live items (`in_queue` and `active`) plus any item a command
targets, the unbilled usage, whether the user currently has access, and the orders (`by_order`)
it was asked about: a purchase names an order once, and a repeat of it queues nothing. Every
method is a pure transition: it mutates the aggregate in memory and returns the domain events
it caused. The caller persists the new state and the events in one transaction.

A change that would take a counter beyond a Postgres bigint raises CounterOverflowError before
anything changes (domain/counters.py). Commands are dated by `_moment(now)`, never going back.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from datetime import datetime
from uuid import UUID

from domain import counters
from domain.errors import (
    MAX_AMOUNT,
    MAX_QUEUED_ITEMS,
    InvalidAmountError,
    ItemNotAdjustableError,
    ItemNotCancellableError,
    ItemNotFoundError,
    NegativeUsageError,
    PackageRetiredError,
    QueueFullError,
    UnlimitedTrafficError,
)
from domain.events import (
    AllPackagesExpired,
    DomainEvent,
    DuplicateOrder,
    DuplicateUsage,
    ExpiryScheduled,
    ExpiryUnscheduled,
    PackageActivated,
    PackageCancelled,
    PackageExpired,
    PackagesQueued,
    UsageRemaining,
)
from domain.model import BilledUsage, ExpiryReason, ItemStatus, Package, QueueItem, latest_moment


@dataclass(slots=True)
class UserQueue:
    user_id: UUID
    items: list[QueueItem] = field(default_factory=list)
    unbilled_upload: int = 0
    unbilled_download: int = 0
    has_access: bool = False
    """True from an activation until the AllPackagesExpired that ends it (emitted exactly once)."""
    orders: dict[UUID, tuple[int, ...]] = field(default_factory=dict)
    """Orders already bought, by `by_order`, with the items each queued: those the caller
    loaded (the ones its commands name) plus those bought since."""
    usages: dict[str, BilledUsage] = field(default_factory=dict)
    """Usage records billed, by their billing record id (`usage_id`): those the caller loaded
    (the ones its records name) plus those billed since."""
    clock: datetime | None = field(default=None, compare=False)
    """The latest moment a command was dated (None: none yet); not compared: time passing is
    no change."""

    def copy(self) -> UserQueue:
        """A copy to change apart from this one: its items copied, its orders too."""
        return UserQueue(
            self.user_id,
            [item.copy() for item in self.items],
            self.unbilled_upload,
            self.unbilled_download,
            self.has_access,
            dict(self.orders),
            dict(self.usages),
            self.clock,
        )

    # -- queries (GetCurrentPackage, GetAllMyPackages) -------------------------------------

    def current(self) -> QueueItem | None:
        """The item stored as active, if any (what the transitions work on)."""
        for item in self.items:  # a loop: run several times for every usage record
            if item.status is ItemStatus.ACTIVE:
                return item
        return None

    def current_at(self, now: datetime) -> QueueItem | None:
        """GetCurrentPackage: the active item whose time is not up at `now`. One past its
        expire_at is expired already, even before its timer has run."""
        active = self.current()
        return None if active is None or active.time_exhausted(now) else active

    def all_items(self) -> list[QueueItem]:
        """GetAllMyPackages: every loaded item in queue order."""
        return sorted(self.items, key=QueueItem.queue_order)

    def live(self) -> int:
        """How many items the user holds in the queue (in_queue and active, as stored)."""
        return sum(1 for i in self.items if i.status in (ItemStatus.IN_QUEUE, ItemStatus.ACTIVE))

    def queued(self) -> list[QueueItem]:
        return sorted(
            (i for i in self.items if i.status is ItemStatus.IN_QUEUE), key=QueueItem.queue_order
        )

    def item(self, item_id: int) -> QueueItem:
        for candidate in self.items:
            if candidate.id == item_id:
                return candidate
        raise ItemNotFoundError(item_id, self.user_id)

    # -- commands -------------------------------------------------------------------------

    def purchase(
        self,
        package: Package,
        by_order: UUID | None,
        amount: int,
        item_ids: list[int],
        now: datetime,
        *,
        max_queued_items: int = MAX_QUEUED_ITEMS,
    ) -> list[DomainEvent]:
        """CreateQueueItem(s): queue `amount` identical items, ids allocated by the caller.

        The items take the package's terms as they are now. An order (`by_order`) is bought
        once: a repeat, whatever its message id, queues nothing and says so (DuplicateOrder).
        A user holds at most `max_queued_items` live items (in_queue and active): a purchase
        that would take them beyond it is refused (QueueFullError) before anything changes.
        """
        self._moment(now)  # what follows is dated after it; the items keep `now` (FIFO)
        if amount < 1 or amount > MAX_AMOUNT:
            raise InvalidAmountError(amount)
        if len(item_ids) != amount:
            raise ValueError(f"need {amount} item ids, got {len(item_ids)}")
        if by_order is not None and by_order in self.orders:
            return [DuplicateOrder(self.user_id, by_order, self.orders[by_order])]
        if package.retired(now):
            raise PackageRetiredError(package.id)
        live = self.live()
        if live + amount > max_queued_items:
            raise QueueFullError(self.user_id, live, amount, max_queued_items)
        terms = package.terms()
        if by_order is not None:
            self.orders[by_order] = tuple(item_ids)
        for item_id in item_ids:
            self.items.append(
                QueueItem(
                    id=item_id,
                    user_id=self.user_id,
                    terms=terms,
                    by_order=by_order,
                    status=ItemStatus.IN_QUEUE,
                    created_at=now,
                )
            )
        return [PackagesQueued(self.user_id, package.id, tuple(item_ids), now)]

    def advance(self, now: datetime) -> list[DomainEvent]:
        """process_package_queue_push: activate the oldest queued item if none is active.

        An item whose time or traffic is already exhausted at activation expires at once and the
        next one is tried; each item is consumed at most once, so this ends after at most
        len(queue) steps. When nothing is left, access ends with one AllPackagesExpired.
        """
        if self.current() is not None:
            return []
        now = self._moment(now)
        events: list[DomainEvent] = []
        for item in self.queued():
            events.append(self._activate(item, now))
            reason = item.exhaustion(now)
            if reason is None:
                if item.expire_at is not None:
                    events.append(
                        ExpiryScheduled(self.user_id, item.id, item.package_id, item.expire_at)
                    )
                return events
            item.status = ItemStatus.CONSUMED
            events.append(PackageExpired(self.user_id, item.id, item.package_id, now, reason))
        if self.has_access:
            self.has_access = False
            events.append(AllPackagesExpired(self.user_id, now))
        return events

    def record_usage(
        self,
        upload: int,
        download: int,
        now: datetime,
        *,
        usage_id: str | None = None,
        recorded_at: datetime | None = None,
    ) -> list[DomainEvent]:
        """RecordPackageUsage: bill traffic to the active item, or keep it as unbilled.

        If no item is active but one is queued, the queue advances first and the traffic is
        billed to the newly active item. Only with nothing to activate is it kept as unbilled.
        Traffic that would take a counter beyond a bigint (`counters`) is refused with
        CounterOverflowError, and nothing changes. A `usage_id` billed before bills nothing
        (DuplicateUsage).

        Late traffic (`recorded_at`, when it happened): an active item whose expire_at has
        passed, but whose expiry has not been applied yet (its timer is on its way), is still
        open: traffic recorded before its expire_at is billed to it, and then it expires. Once
        an item's expiry is applied (its package_expiring published), its totals are final:
        traffic reported later is billed to the item active then, whenever it happened.
        """
        if usage_id is not None and (seen := self.usages.get(usage_id)) is not None:
            return [DuplicateUsage(self.user_id, usage_id, seen.item_id)]
        if upload < 0 or download < 0:
            raise NegativeUsageError(upload, download)
        now = self._moment(now)
        if not counters.fits_wherever_billed(self, upload + download):
            # Near a counter's limit: bill a copy first, and refuse if a counter overflows.
            counters.refuse_overflow(
                self, lambda copy: copy._bill(upload, download, now, recorded_at)
            )
        events, item_id = self._bill(upload, download, now, recorded_at)
        if usage_id is not None:
            self.usages[usage_id] = BilledUsage(item_id, upload, download, recorded_at)
        return events

    def _bill(
        self, upload: int, download: int, now: datetime, recorded_at: datetime | None
    ) -> tuple[list[DomainEvent], int | None]:
        """The events, and the item billed (None: kept as unbilled)."""
        late = self.current()
        if late is not None and not (
            late.time_exhausted(now)
            and recorded_at is not None
            and late.expire_at is not None
            and recorded_at < late.expire_at
        ):
            late = None
        # Traffic after the active item's time ran out (its timer may still be on the way) is
        # not billed to it, unless it happened before (above): it expires by time here. Traffic
        # while the previous item's expiry is on its way to the expiring consumer belongs to the
        # next item: activate it now rather than let the outcome depend on which message the
        # broker delivers first.
        events = [] if late is not None else self._expire_if_time_is_up(now)
        events += self.advance(now)
        active = late or self.current()
        if active is None:
            self.unbilled_upload += upload
            self.unbilled_download += download
            return events, None
        active.upload += upload
        active.download += download
        events += self._after_quota_change(active, now)
        if late is not None:
            events += self._expire_if_time_is_up(now) + self.advance(now)
        return events, active.id

    def expire_due(self, item_id: int, now: datetime) -> list[DomainEvent]:
        """The scheduled time-expiry timer of an item fired: consume it if its time is up.

        Only the transaction that moves an item out of `active` emits its PackageExpired, so a
        timer for an item that usage consumed or a cancel removed first emits nothing.
        """
        item = self.item(item_id)
        now = self._moment(now)
        if item.status is not ItemStatus.ACTIVE or not item.time_exhausted(now):
            return []
        return self._consume(item, ExpiryReason.TIME, now, withdraw_timer=False)

    def expire(self, item_id: int, reason: ExpiryReason, now: datetime) -> list[DomainEvent]:
        """Handle a PackageExpiring event: the item has left `active`; move the queue on.

        The item is normally consumed already, by the transaction that emitted the event. An
        event for an item still active (published from outside pkgq) consumes it if it is due.
        Repeated events change nothing: the advance is idempotent.
        """
        item = self.item(item_id)
        now = self._moment(now)
        if item.status is ItemStatus.ACTIVE:
            if reason is ExpiryReason.TIME:
                due = item.time_exhausted(now)
            else:
                due = item.traffic_exhausted()
            if not due:
                return []
            item.status = ItemStatus.CONSUMED
        return self.advance(now)

    def cancel(
        self,
        item_id: int,
        now: datetime,
        reason: str | None = None,
        operator: str | None = None,
        publisher: str | None = None,
    ) -> list[DomainEvent]:
        """Cancel (refund) an item; cancelling the active one advances the queue. Announced
        once (PackageCancelled, with the command's reason, the operator it claims and its
        publisher as the broker verified it); a repeat changes nothing."""
        item = self.item(item_id)
        now = self._moment(now)
        if item.status is ItemStatus.CANCELLED:
            return []
        if item.status is ItemStatus.CONSUMED:
            raise ItemNotCancellableError(item_id, item.status.value)
        if item.status is ItemStatus.ACTIVE and item.time_exhausted(now):
            # Its time is up and its timer is on the way: refusing now gives the same answer
            # as after the timer, instead of one that depends on which message came first.
            raise ItemNotCancellableError(item_id, "consumed (its time is up)")
        was_active = item.status is ItemStatus.ACTIVE
        item.status = ItemStatus.CANCELLED
        events: list[DomainEvent] = [
            PackageCancelled(
                self.user_id, item.id, item.package_id, now, was_active, reason, operator, publisher
            )
        ]
        if not was_active:
            return events
        if item.expire_at is not None:
            events.append(ExpiryUnscheduled(self.user_id, item.id))
        return events + self.advance(now)

    def adjust_quota(self, item_id: int, delta: int, now: datetime) -> list[DomainEvent]:
        """Raise or lower an item's adjust_quota; lowering the active one below use consumes it.
        A delta that would take adjust_quota or the quota beyond a bigint is refused
        (CounterOverflowError) before anything changes."""
        item = self.item(item_id)
        now = self._moment(now)
        if item.status not in (ItemStatus.IN_QUEUE, ItemStatus.ACTIVE):
            raise ItemNotAdjustableError(item_id, item.status.value)
        limit = item.terms.traffic_limit
        if limit is None:
            raise UnlimitedTrafficError(item_id)
        adjusted = item.adjust_quota + delta
        counters.refuse_beyond_bigint(f"item {item_id} adjust_quota", adjusted, item.adjust_quota)
        counters.refuse_beyond_bigint(
            f"item {item_id} quota (traffic_limit + adjust_quota)",
            limit + adjusted,
            limit + item.adjust_quota,
        )
        item.adjust_quota = adjusted
        if item.status is ItemStatus.IN_QUEUE:
            return []
        if item.time_exhausted(now):
            return self._consume(item, ExpiryReason.TIME, now)
        return self._after_quota_change(item, now)

    def _moment(self, now: datetime) -> datetime:
        """When a transition the clock dates `now` happens: never before the queue's clock, or
        the latest creation or activation its items hold (a clock read before the user's lock
        was taken, or one that stepped back, is moved up to it). So no item is activated before
        it was created or the previous one ended, activations are dated in the order they
        happen, and a time package's expire_at counts from its activation."""
        floor = self.clock if self.clock is not None else latest_moment(self.items)
        at = now if floor is None or now >= floor else floor
        self.clock = at
        return at

    def _activate(self, item: QueueItem, now: datetime) -> PackageActivated:
        item.status = ItemStatus.ACTIVE
        item.activated_at = now
        duration = item.terms.duration
        item.expire_at = now + duration if duration is not None else None
        item.upload += self.unbilled_upload
        item.download += self.unbilled_download
        self.unbilled_upload = 0
        self.unbilled_download = 0
        self.has_access = True
        return PackageActivated(
            self.user_id,
            item.id,
            item.package_id,
            now,
            item.quota,
            item.remaining,
            item.expire_at,
        )

    def _after_quota_change(self, item: QueueItem, now: datetime) -> list[DomainEvent]:
        if not item.traffic_exhausted():
            return [UsageRemaining(self.user_id, item.id, item.remaining)]
        return self._consume(item, ExpiryReason.USAGE, now)

    def _expire_if_time_is_up(self, now: datetime) -> list[DomainEvent]:
        active = self.current()
        if active is None or not active.time_exhausted(now):
            return []
        return self._consume(active, ExpiryReason.TIME, now)

    def _consume(
        self, item: QueueItem, reason: ExpiryReason, now: datetime, *, withdraw_timer: bool = True
    ) -> list[DomainEvent]:
        """Move the active item to `consumed`: the one place its PackageExpired is emitted."""
        item.status = ItemStatus.CONSUMED
        at = item.expire_at if reason is ExpiryReason.TIME and item.expire_at else now
        events: list[DomainEvent] = [
            PackageExpired(self.user_id, item.id, item.package_id, at, reason)
        ]
        if withdraw_timer and item.expire_at is not None:
            events.append(ExpiryUnscheduled(self.user_id, item.id))
        return events
